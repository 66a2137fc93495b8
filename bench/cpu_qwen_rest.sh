#!/usr/bin/env bash
# The rest of the CPU benchmarks (after code-t1 of bench/cpu_qwen.sh), sized to fit a session.
set -euo pipefail
out=${1:-docs/perf/cpu}
mkdir -p "$out"
M="--model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b --no-log"
T1="--temp 1.0 --top-p 0.95 --top-k 20"
run() { name=$1; shift; echo "== $name: mtpcli bench $*" | tee "$out/$name.txt"; mtpcli bench "$@" --out "$out/$name.json" | tee -a "$out/$name.txt"; }
P=bench/prompts
run classes-t0 $M --temp 0 --profiles fixed-4,adaptive,adaptive-cost \
    --prompts $P/arithmetic,$P/agent-json,$P/file-edit,$P/json-records,$P/novel-code --seeds 1 --max-tokens 64
run code-t0 $M --temp 0 --profiles exact,typical-0.09 --baseline ar --baseline mlx-lm --prompts $P/code --seeds 1 --max-tokens 48
