#!/usr/bin/env bash
# Re-run of the head-to-head arms with decode tok/s measured identically for mtpcli and mlx-lm (tokens after the
# first verify cycle over the time after it). Usage: bench/cpu_fair.sh OUT_DIR
source "$(dirname "$0")/common.sh" "$@"
run fair-code-t1 $M $T1 --profiles exact,typical-0.09 --baseline ar --baseline mlx-lm \
    --prompts $P/code/csv_parser.txt --seeds 3 --max-tokens 48
run fair-code-t0 $M --temp 0 --profiles exact --baseline ar --baseline mlx-lm --prompts $P/code --seeds 1 --max-tokens 48
run fair-prose-t1 $M $T1 --profiles exact --baseline ar --baseline mlx-lm --prompts $P/prose/sea.txt --seeds 2 --max-tokens 48
