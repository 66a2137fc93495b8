#!/usr/bin/env bash
# The one-engine change, before against after: the previous tree (OLD, a checkout of the commit before it) and this
# one run the same `mtpcli bench` arms in separate processes, alternating old, new, old, new, so drift hits both
# alike; bench/engine_ab.py turns the JSON into ratios new/old per arm.
# Usage: OLD=/path/to/old/checkout bench/engine_ab.sh OUT_DIR MODEL DRAFT PROMPTS MAX_TOKENS ROUNDS [extra bench flags]
set -euo pipefail
out=$1 model=$2 draft=$3 prompts=$4 max=$5 rounds=$6; shift 6
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for tree in old new; do
    src=$([ "$tree" = old ] && echo "$OLD/src" || echo "$PWD/src")
    PYTHONPATH="$src" python3 -m mtpcli bench --model "$model" --draft-model "$draft" --profiles exact,ngram \
      --baseline ar --prompts "$prompts" --seeds 1 --max-tokens "$max" --no-chat --no-log "$@" \
      --out "$out/$tree-r$r.json" > "$out/$tree-r$r.txt"
  done
done
python3 bench/engine_ab.py "$out"/*.json | tee "$out/summary.txt"
