#!/bin/bash
# Issue 58: auto against mlx-lm's speculative decoding with the same draft model on short code answers (the chat
# requests of bench/auto_short/, 64 tokens at most), in one `mtpcli bench` run; then the per-prompt geometric mean
# (bench/auto_short_geomean.py). usage: bench/auto_short.sh OUT.json TEMP SEEDS   (a fresh data folder: the prior)
set -e
export XDG_CACHE_HOME=$(mktemp -d) XDG_DATA_HOME=$(mktemp -d) XDG_CONFIG_HOME=$(mktemp -d)
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0
M=${MODELS:-$HOME/.cache/mtpcli/models}
mtpcli bench -m $M/qwen2.5-coder-1.5b --draft-model $M/qwen2.5-coder-0.5b --prompts "$(dirname "$0")/auto_short" \
  --seeds $3 --max-tokens 64 --temp $2 --baseline mlx-lm --out $1 > ${1%.json}.txt
python "$(dirname "$0")/auto_short_geomean.py" $1
