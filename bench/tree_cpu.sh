#!/bin/bash
# Issue 58: draft-model trees on this CPU, the real pair: the chain of 4, a 12-node tree and tree = auto (profiles in
# bench/tree_profiles/), interleaved per prompt in one `mtpcli bench` run (a fresh data folder: nothing kept), then each
# arm over the chain per prompt and per class (bench/tree_table.py). usage: bench/tree_cpu.sh OUT.json TEMP PROMPTS
# (PROMPTS: comma-separated files or folders; a prompt's class is its folder's name)
set -e
export XDG_CACHE_HOME=$(mktemp -d) XDG_DATA_HOME=$(mktemp -d) XDG_CONFIG_HOME=$(mktemp -d)
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 MTPCLI_PROFILE_DIR="$(dirname "$0")/tree_profiles"
M=${MODELS:-$HOME/.cache/mtpcli/models}
mtpcli bench -m $M/qwen2.5-coder-1.5b --draft-model $M/qwen2.5-coder-0.5b --profiles model-4,model-tree-12,model-tree-auto \
  --seeds 1 --temp $2 --prompts "$3" --max-tokens ${MAX_TOKENS:-32} --out $1 > ${1%.json}.txt
python "$(dirname "$0")/tree_table.py" $1 "$3" | tee -a ${1%.json}.txt
