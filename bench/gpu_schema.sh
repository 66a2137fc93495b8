#!/usr/bin/env bash
# Issue 59 on the lent GPU: bench/schema's tool-call prompts on SmolLM2-135M 4-bit, greedy, 160 tokens, one row at a
# time, three arms interleaved over two passes: constrained under the default (draft = auto: lookup, the history and
# the forced tokens), constrained plain (--draft none), unconstrained default. The outputs come back in $OUT for
# bench/schema/check.py. Calls as bench/gpu_prefill.sh's, the last one also carrying .gpux (the llguidance wheel:
# `pip download --no-deps llguidance`; the lent machine has no package index).
source bench/gpu_stage.sh gpu_schema
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpux/llguidance-*.whl
M=${M:-/tmp/m/smol4}; S=bench/schema  # M=/tmp/m/qc15: Qwen2.5-Coder-1.5B-Instruct 4-bit
echo '{"a": 1}' | python3 -m mtpcli generate -m $M --json --max-tokens 16 --no-log -q >/dev/null  # kernels compile
for pass in 1 2; do
  for arm in spec plain free; do
    case $arm in spec) a="--prompts-jsonl $S/schema.jsonl";; plain) a="--prompts-jsonl $S/schema.jsonl --draft none";;
      free) a="--prompts-jsonl $S/plain.jsonl";; esac
    t0=$(date +%s%N)
    python3 -m mtpcli generate -m $M $a --max-tokens ${MAXTOK:-400} --batch-size 1 --format jsonl --no-log \
      --stats-json "$OUT/$arm.$pass.stats.json" > "$OUT/$arm.$pass.out" 2> "$OUT/$arm.$pass.err"
    rc=$?; echo "pass $pass $arm rc=$rc wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  done
done
for arm in spec plain free; do cp "$OUT/$arm.2.out" "$OUT/$arm.out"; done
python3 - "$OUT" <<'PY'
import json, sys
for arm in ("spec", "plain", "free"):
    for p in (1, 2):
        d = json.load(open(f"{sys.argv[1]}/{arm}.{p}.stats.json"))
        s = d.get("stats", d)
        print(arm, p, {k: s.get(k) for k in ("generated_tokens", "tokens_per_cycle", "decode_tps", "forced_tokens")})
PY
