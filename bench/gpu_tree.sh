#!/usr/bin/env bash
# Draft trees on the lent NVIDIA H200 (docs/perf/tree.md): bench/gpu_tree.py on random 1.5B and 7B shapes, and
# bench/history_agent.py on SmolLM2-135M 4-bit with tree arms. Staging (../shared/gpu.md): earlier calls on the same
# warm machine copied .gpu1/part.aa and the model's parts (.gpumK/smol4.part.*) to /root/stash/; this call
# carries .gpu2 (and the last .gpumK, whose part it stages itself). The agent part keeps a run log of its own
# (a fresh folder), so auto's costs are learnt as in a user's first runs:   bash bench/gpu_tree.sh      (results in $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_tree.log") 2>&1
export PYTHONUNBUFFERED=1
cp .gpum*/smol4.part.* /root/stash/ 2>/dev/null  # the model's parts this call carries, if any
wheel=/tmp/$(cat .gpu2/NAME)
cat /root/stash/part.aa .gpu2/part.ab > "$wheel" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheel" .gpu2/mlx-*.whl \
    .gpu2/mlx_lm-*.whl .gpu2/tomli_w-*.whl || exit 1
[ "${AGENT:-1}" = 0 ] || { mkdir -p /tmp/m && cat /root/stash/smol4.part.* | tar xzf - -C /tmp/m || exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv
export PYTHONPATH=/tmp/site:$PWD/src
for t in ${TARGETS:-7b 1.5b}; do
  MTPCLI_NO_LOG=1 timeout ${LIMIT:-150} python3 bench/gpu_tree.py --target $t --tokens 256 --repeats 3 --out "$OUT/gpu_tree_$t.json"
done
[ "${AGENT:-1}" = 0 ] && exit 0
XDG_DATA_HOME=$(mktemp -d) timeout ${AGENT_LIMIT:-240} python3 bench/history_agent.py /tmp/m/smol4 /tmp/m/smol4 \
    "$OUT/gpu_tree_agent.json" --arms ${ARMS:-ngram,ngram-tree,history-tree,history-tree-auto,plain} --every 2 --control-rounds 2
