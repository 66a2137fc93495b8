#!/usr/bin/env bash
# draft = auto against fixed chains on the agent-like workload (bench/history_agent.py) on the lent NVIDIA H200, real
# SmolLM2-135M 4-bit (docs/perf/auto.md: issue 33's GPU bar). Staging (../shared/gpu.md): earlier calls on the same
# warm machine copied .gpu1/part.aa and the model's parts (.gpumK/smol4.part.*) to /root/stash/; this call carries
# .gpu2 (and the last .gpumK, whose part it stages itself):
#   bash bench/gpu_agent.sh      (results in $OUT/gpu_agent.json)
# The run log, and so the cost table auto keeps, lives in a fresh folder: the runs decide as a user's first runs do.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_agent.log") 2>&1
export PYTHONUNBUFFERED=1
cp .gpum*/smol4.part.* /root/stash/ 2>/dev/null  # the model's parts this call carries, if any
wheel=/tmp/$(cat .gpu2/NAME)
cat /root/stash/part.aa .gpu2/part.ab > "$wheel" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheel" .gpu2/mlx-*.whl \
    .gpu2/mlx_lm-*.whl .gpu2/tomli_w-*.whl || exit 1
mkdir -p /tmp/m && cat /root/stash/smol4.part.* | tar xzf - -C /tmp/m || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv
export PYTHONPATH=/tmp/site:$PWD/src
XDG_DATA_HOME=$(mktemp -d) timeout ${LIMIT:-400} python3 bench/history_agent.py /tmp/m/smol4 /tmp/m/smol4 \
    "$OUT/gpu_agent.json" --arms ${ARMS:-ngram-4,history-8,history-16,plain} --every 2 --control-rounds 2
