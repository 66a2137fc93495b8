#!/usr/bin/env bash
# Draft trees on a lent NVIDIA GPU (docs/perf/tree.md): bench/gpu_tree.py on random 1.5B and 7B shapes, and
# bench/history_agent.py on SmolLM2-135M 4-bit with tree arms (AGENT=0 leaves it out); staging: bench/gpu_stage.sh.
# The agent part keeps a run log of its own (a fresh folder), so auto's costs are learnt as in a user's first runs:
#   bash bench/gpu_tree.sh      (results in $OUT)
MODEL=${AGENT:-1} source "$(dirname "$0")/gpu_stage.sh" gpu_tree
for t in ${TARGETS:-7b 1.5b}; do
  MTPCLI_NO_LOG=1 timeout ${LIMIT:-150} python3 bench/gpu_tree.py --target $t --tokens 256 --repeats 3 --out "$OUT/gpu_tree_$t.json"
done
[ "${AGENT:-1}" = 0 ] && exit 0
XDG_DATA_HOME=$(mktemp -d) timeout ${AGENT_LIMIT:-240} python3 bench/history_agent.py /tmp/m/smol4 /tmp/m/smol4 \
    "$OUT/gpu_tree_agent.json" --arms ${ARMS:-ngram,ngram-tree,history-tree,history-tree-auto,plain} --every 2 --control-rounds 2
