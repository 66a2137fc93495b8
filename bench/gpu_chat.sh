#!/usr/bin/env bash
# Issue 56 on the lent GPU: bench/chat_loop.py on SmolLM2-135M 4-bit (no draft model: the default drafts with lookup
# and the history): `generate --save` then `-c` for 4 turns against the same transcripts cold, `mtpcli chat` over the
# same turns, mlx-lm's generate per turn. Staged as bench/gpu_prefill.sh (smol4's parts, then this call with .gpu2).
source bench/gpu_stage.sh gpu_chat
M=${M:-/tmp/m/smol4}
echo "def f(x):" | python3 -m mtpcli generate -m $M --max-tokens 16 --no-log -q >/dev/null  # kernels compile
python3 -m mlx_lm generate --model $M --prompt "def f(x):" --max-tokens 16 >/dev/null
python3 bench/chat_loop.py --model $M --max-tokens 64 --out "$OUT/chat_loop_gpu.json"
