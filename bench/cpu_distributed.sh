#!/usr/bin/env bash
# Two ranks on this CPU (ring over localhost) against one process, on the real Qwen2.5-Coder pair (1.5B target,
# 0.5B draft, float32), greedy, tensor mode: plain decoding and speculation (draft model, 4 tokens), per prompt.
# Keeps each run's stdout JSON in $out/dist-<arm>-<prompt>.json and prints a table (bench/distributed_table.py).
# Usage: bench/cpu_distributed.sh [OUT_DIR] [MAX_TOKENS]     (a few minutes on 2 cores; run it niced next to others)
# (mtpcli launch gives each of the n ranks on one host cores/n OpenBLAS threads unless OPENBLAS_NUM_THREADS is set)
set -euo pipefail
out=${1:-docs/perf/cpu/distributed}
max=${2:-32}
mkdir -p "$out"
T=${MTPCLI_TARGET:-$HOME/.cache/mtpcli/models/qwen2.5-coder-1.5b}
D=${MTPCLI_DRAFT:-$HOME/.cache/mtpcli/models/qwen2.5-coder-0.5b}
mtp() { python -m mtpcli "$@"; }
prompts=("def quicksort(arr):" "Write a Python function that parses a CSV file into a list of dicts.")
for i in "${!prompts[@]}"; do
  p=${prompts[$i]}
  common=(generate -m "$T" -p "$p" --temp 0 --max-tokens "$max" --format json -q --no-log)
  spec=(--draft model --draft-model "$D" --num-draft-tokens 4)
  echo "== prompt $i: $p" >&2
  if [ -z "${SKIP_ONE:-}" ]; then  # SKIP_ONE=1: keep the one-process runs already there
    mtp "${common[@]}" --draft none > "$out/dist-one-plain-$i.json"
    mtp "${common[@]}" "${spec[@]}" > "$out/dist-one-spec-$i.json"
  fi
  mtp launch -n 2 --backend ring -- "${common[@]}" --draft none --distributed tensor > "$out/dist-tensor2-plain-$i.json"
  mtp launch -n 2 --backend ring -- "${common[@]}" "${spec[@]}" --distributed tensor > "$out/dist-tensor2-spec-$i.json"
done
mtp launch -n 2 --backend ring -- python bench/gpu_distributed.py --allsum-only --json "$out/allsum.json" >&2
mtp launch -n 2 --backend ring -- python bench/cpu_collectives.py "$T" --json "$out/collectives.json" >&2
python bench/distributed_table.py "$out"
