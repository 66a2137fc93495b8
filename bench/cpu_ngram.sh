#!/usr/bin/env bash
# n-gram (prompt lookup) drafting against plain decoding and the draft-model pair, one prompt per content class,
# greedy (T=0: every arm emits the same tokens), real Qwen2.5-Coder 1.5B target. Usage: bench/cpu_ngram.sh OUT_DIR
source "$(dirname "$0")/common.sh" "$@"
C=$P/code/csv_parser.txt,$P/prose/sea.txt,$P/agent-json,$P/arithmetic,$P/file-edit,$P/json-records,$P/novel-code
run ngram-classes-t0 $M --temp 0 --profiles ngram,exact --baseline ar --prompts $C --seeds 1 --max-tokens 48
run ngram-code-t1 $M $T1 --profiles ngram,exact --baseline ar --prompts $P/code/csv_parser.txt,$P/file-edit --seeds 2 --max-tokens 48
