#!/usr/bin/env bash
# Re-run of the head-to-head arms with decode tok/s measured identically for mtpcli and mlx-lm (tokens after the
# first verify cycle over the time after it). Usage: bench/cpu_fair.sh OUT_DIR
set -euo pipefail
out=${1:-docs/perf/cpu}
mkdir -p "$out"
M="--model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b --no-log"
T1="--temp 1.0 --top-p 0.95 --top-k 20"
run() { name=$1; shift; echo "== $name: mtpcli bench $*" | tee "$out/$name.txt"; mtpcli bench "$@" --out "$out/$name.json" | tee -a "$out/$name.txt"; }
run fair-code-t1 $M $T1 --profiles exact,typical-0.09 --baseline ar --baseline mlx-lm \
    --prompts bench/prompts/code/csv_parser.txt --seeds 3 --max-tokens 48
run fair-code-t0 $M --temp 0 --profiles exact --baseline ar --baseline mlx-lm --prompts bench/prompts/code --seeds 1 --max-tokens 48
run fair-prose-t1 $M $T1 --profiles exact --baseline ar --baseline mlx-lm --prompts bench/prompts/prose/sea.txt --seeds 2 --max-tokens 48
