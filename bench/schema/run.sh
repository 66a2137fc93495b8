#!/bin/bash
# Tool-call JSON answers on the real pair (docs/perf/schema.md): constrained speculation (each row's schema from its
# JSONL line), constrained plain decoding, unconstrained speculation; one process per arm, 400 s each at most.
cd "$(dirname "$0")"; OUT=${OUT:-/tmp/mtpcli-schema}; mkdir -p $OUT
export XDG_CACHE_HOME=$OUT/c XDG_DATA_HOME=$OUT/d XDG_CONFIG_HOME=$OUT/g
M=/root/.cache/mtpcli/models
for arm in spec plain free; do
  case $arm in
    spec) args="--prompts-jsonl schema.jsonl --draft model --draft-model $M/qwen2.5-coder-0.5b --num-draft-tokens 4";;
    plain) args="--prompts-jsonl schema.jsonl --draft none";;
    free) args="--prompts-jsonl plain.jsonl --draft model --draft-model $M/qwen2.5-coder-0.5b --num-draft-tokens 4";;
  esac
  /usr/bin/time -f "$arm wall %e s" timeout 400 python -m mtpcli generate -m $M/qwen2.5-coder-1.5b $args --max-tokens 160 \
    --batch-size 1 --format jsonl --stats-json $OUT/$arm.stats.json --no-log > $OUT/$arm.out 2> $OUT/$arm.err
  echo "$arm rc=$?"
done
