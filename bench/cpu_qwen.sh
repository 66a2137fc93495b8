#!/usr/bin/env bash
# CPU benchmarks on the real Qwen2.5-Coder pair (1.5B target, 0.5B draft, float32), all arms interleaved.
# Usage: bench/cpu_qwen.sh OUT_DIR     (about an hour on 2 cores; OpenBLAS is preloaded by mtpcli when installed)
source "$(dirname "$0")/common.sh" "$@"
run code-t1 $M $T1 --profiles exact,typical-0.09,typical-0.20,adaptive --baseline ar --baseline mlx-lm \
    --prompts $P/code --seeds 3 --max-tokens 48
"$(dirname "$0")/cpu_qwen_rest.sh" "$out"
