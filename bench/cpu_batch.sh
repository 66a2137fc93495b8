#!/usr/bin/env bash
# Batched decoding on the real pair: 1, 4, 16 prompts (64 tokens each, 32 generated, greedy), plain vs the draft
# model at width 4 vs the adaptive EMA width. Usage: bench/cpu_batch.sh OUT_DIR
set -euo pipefail
out=${1:-docs/perf/cpu}
mkdir -p "$out"
python3 "$(dirname "$0")/batch_throughput.py" --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b \
    --prompts src/mtpcli/bench_prompts --sizes 1,4,16 --max-tokens 32 --prompt-tokens 64 --out "$out/batch.json" | tee "$out/batch.txt"
