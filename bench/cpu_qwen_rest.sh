#!/usr/bin/env bash
# The rest of the CPU benchmarks (after code-t1 of bench/cpu_qwen.sh), sized to fit a session.
source "$(dirname "$0")/common.sh" "$@"
run classes-t0 $M --temp 0 --profiles fixed-4,adaptive \
    --prompts $P/arithmetic,$P/agent-json,$P/file-edit,$P/json-records,$P/novel-code --seeds 1 --max-tokens 64
run code-t0 $M --temp 0 --profiles exact,typical-0.09 --baseline ar --baseline mlx-lm --prompts $P/code --seeds 1 --max-tokens 48
