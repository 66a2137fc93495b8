#!/usr/bin/env bash
# CPU benchmarks on the real Qwen2.5-Coder pair (1.5B target, 0.5B draft, float32), all arms interleaved.
# Usage: bench/cpu_qwen.sh OUT_DIR     (about an hour on 2 cores; OpenBLAS is preloaded by mtpcli when installed)
set -euo pipefail
out=${1:-docs/perf/cpu}
mkdir -p "$out"
M="--model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b --no-log"
T1="--temp 1.0 --top-p 0.95 --top-k 20"
run() { name=$1; shift; echo "== $name: mtpcli bench $*" | tee "$out/$name.txt"; mtpcli bench "$@" --out "$out/$name.json" | tee -a "$out/$name.txt"; }
run code-t1 $M $T1 --profiles exact,typical-0.09,typical-0.20,adaptive --baseline ar --baseline mlx-lm \
    --prompts bench/prompts/code --seeds 3 --max-tokens 48
"$(dirname "$0")/cpu_qwen_rest.sh" "$out"
