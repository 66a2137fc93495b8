#!/usr/bin/env bash
# An EAGLE-3 head for SmolLM2-135M (4-bit), trained and measured on the lent NVIDIA H200 (docs/perf/eagle3.md).
# Staging (../shared/gpu.md): earlier calls on the same warm machine copied .gpu1/part.aa and .gpum1, .gpum2
# (smol4.part.*; smol_tokens.npy and smol_prompts.json: `bench/train_eagle3.py --save-tokens` and
# `--save-prompts` of the training text) to /root/stash/;
# this call carries .gpu2:   MINUTES=4 bash bench/gpu_eagle.sh      (results, and the head in parts, in $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_eagle.log") 2>&1
export PYTHONUNBUFFERED=1 MTPCLI_NO_LOG=1
wheel=/tmp/$(cat .gpu2/NAME)
cat /root/stash/part.aa .gpu2/part.ab > "$wheel" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheel" .gpu2/mlx-*.whl \
    .gpu2/mlx_lm-*.whl .gpu2/tomli_w-*.whl || exit 1
mkdir -p /tmp/m && cat /root/stash/smol4.part.* | tar xzf - -C /tmp/m || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv
export PYTHONPATH=/tmp/site:$PWD/src
python3 bench/train_eagle3.py --model /tmp/m/smol4 --tokens /root/stash/smol_tokens.npy --seq 512 --batch 32 \
    --prompts /root/stash/smol_prompts.json --answer-tokens ${ANSWER:-192} \
    --minutes "${MINUTES:-4}" --lr 1e-3 --dtype bfloat16 --out /tmp/head || exit 1
tar czf /tmp/head.tgz -C /tmp head && split -b 15000000 /tmp/head.tgz "$OUT/head.tgz.part."
P=bench/eagle_profiles
XDG_DATA_HOME=$(mktemp -d) MTPCLI_PROFILE_DIR=$P timeout ${BENCH_LIMIT:-240} python3 -m mtpcli bench -m /tmp/m/smol4 \
    --draft-model /tmp/head --profiles ${ARMS:-plain,ngram-4,eagle3-4,eagle3-tree,auto} --seeds 1 --max-tokens 128 \
    --prompts bench/auto_eval/novel-code,bench/auto_eval/prose,bench/auto_heldout --out "$OUT/gpu_eagle_bench.json"
