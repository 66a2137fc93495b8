#!/bin/bash
# Tool-call JSON answers on the real pair (docs/perf/schema.md): constrained speculation by the draft model at width 4
# and under the default (draft = auto), constrained plain decoding, unconstrained speculation (each row's schema from
# its JSONL line; plain.jsonl the same prompts without one); one process per arm and pass, the arms interleaved over
# two passes (the first also warms the page cache). Validity: python check.py OUT spec auto plain free.
cd "$(dirname "$0")"; OUT=${OUT:-/tmp/mtpcli-schema}; mkdir -p $OUT
export XDG_CACHE_HOME=$OUT/c XDG_DATA_HOME=$OUT/d XDG_CONFIG_HOME=$OUT/g
M=/root/.cache/mtpcli/models; D="--draft-model $M/qwen2.5-coder-0.5b"
for pass in 1 2; do
  for arm in spec auto plain free; do
    case $arm in
      spec) args="--prompts-jsonl schema.jsonl --draft model $D --num-draft-tokens 4";;
      auto) args="--prompts-jsonl schema.jsonl $D";;
      plain) args="--prompts-jsonl schema.jsonl --draft none";;
      free) args="--prompts-jsonl plain.jsonl --draft model $D --num-draft-tokens 4";;
    esac
    /usr/bin/time -f "pass $pass $arm wall %e s" python -m mtpcli generate -m $M/qwen2.5-coder-1.5b $args \
      --max-tokens 160 --batch-size 1 --format jsonl --no-prefill-cache --stats-json $OUT/$arm.$pass.stats.json \
      --no-log > $OUT/$arm.$pass.out 2> $OUT/$arm.$pass.err
    echo "pass $pass $arm rc=$?"; tail -n 1 $OUT/$arm.$pass.err
  done
done
for arm in spec auto plain free; do cp $OUT/$arm.2.out $OUT/$arm.out; done
python3 check.py $OUT spec auto plain free
python3 - $OUT <<'PY'
import json, sys
for arm in ("spec", "auto", "plain", "free"):
    for p in (1, 2):
        d = json.load(open(f"{sys.argv[1]}/{arm}.{p}.stats.json"))
        s = d.get("stats", d)
        print(arm, p, {k: s.get(k) for k in ("generated_tokens", "tokens_per_cycle", "decode_tps", "forced_tokens")})
PY
