#!/usr/bin/env bash
# An EAGLE-3 head for SmolLM2-135M (4-bit), trained and measured on the lent NVIDIA H200 (docs/perf/eagle3.md).
# Staging (../shared/gpu.md): earlier calls on the same warm machine copied .gpu1/part.aa and .gpum1, .gpum3, .gpum2
# (smol4.part.*; smol_tokens.npy: `tools/train_eagle3.py --save-tokens` of the training text; an earlier head to
# resume from, optionally) to /root/stash/. Then, one call each, in quick succession:
#   PHASE=data  bash bench/gpu_eagle.sh   (carries .gpu2: installs; the target answers prompts made of the text)
#   PHASE=train MINUTES=8 [RESUME=/root/stash/head3] bash bench/gpu_eagle.sh   (the head in parts in $OUT)
#   PHASE=bench bash bench/gpu_eagle.sh   (the interleaved benchmark)
# or, answers.npy from an earlier data phase staged too: PHASE=all MINUTES=4 (carries .gpu2: install, train, bench)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_eagle_${PHASE}.log") 2>&1
export PYTHONUNBUFFERED=1 MTPCLI_NO_LOG=1 PYTHONPATH=/root/stash/site:$PWD/src
S=/root/stash M=/root/stash/m/smol4
train() { python3 tools/train_eagle3.py --model $M --seq 512 --batch ${BATCH:-64} --lr 1e-3 --dtype bfloat16 "$@"; }
install() {  # (carries .gpu2)
    wheel=/tmp/$(cat .gpu2/NAME)
    cat $S/part.aa .gpu2/part.ab > "$wheel" || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --target $S/site "$wheel" .gpu2/mlx-*.whl \
        .gpu2/mlx_lm-*.whl .gpu2/tomli_w-*.whl || exit 1
    mkdir -p $S/m && cat $S/smol4.part.* | tar xzf - -C $S/m || exit 1
    nvidia-smi --query-gpu=name,driver_version --format=csv
}
case $PHASE in
all)  # a fresh machine with answers.npy staged beside the rest: install, train, bench in one call
    install
    PHASE=train bash "$0" && PHASE=bench bash "$0" ;;
data)
    install
    # the target answers prompts of one length made of the text, a batch at a time, for DISTILL_SECONDS (kept
    # after every batch: a call cut short keeps what it made)
    timeout ${DISTILL_LIMIT:-540} python3 tools/train_eagle3.py --model $M --seq 512 --tokens $S/smol_tokens.npy \
        --fixed-prompts ${PROMPT_LEN:-256} --n-prompts ${PROMPTS:-131072} --answer-tokens ${ANSWER:-256} \
        --distill-batch ${DBATCH:-1024} --distill-seconds ${DISTILL_SECONDS:-400} --save-answers $S/answers.npy \
        --out /tmp/unused
    cp $S/answers.npy "$OUT/" ;;
train)
    train --tokens $S/smol_tokens.npy --answers $S/answers.npy --text-share 0.25 --minutes "${MINUTES:-8}" \
        --init ${INIT:-random} ${RESUME:+--resume $RESUME} --out $S/head || exit 1
    tar czf /tmp/head.tgz -C $S head && split -b 15000000 /tmp/head.tgz "$OUT/head.tgz.part." ;;
bench)  # (on a fresh machine it installs first: carry .gpu2)
    [ -d $S/site ] || install
    XDG_DATA_HOME=$(mktemp -d) MTPCLI_PROFILE_DIR=bench/eagle_profiles timeout ${BENCH_LIMIT:-500} \
        python3 -m mtpcli bench -m $M --draft-model $S/head \
        --profiles ${ARMS:-plain,ngram-4,eagle3-2,eagle3-4,eagle3-tree,auto} --seeds 1 --max-tokens ${TOKENS:-128} \
        --prompts ${PROMPTS_BENCH:-bench/auto_eval/novel-code,bench/auto_eval/prose,bench/auto_heldout} --out "$OUT/gpu_eagle_bench.json" ;;
esac
