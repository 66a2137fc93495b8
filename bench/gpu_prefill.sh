#!/usr/bin/env bash
# Issue 54 on the lent GPU: SmolLM2-135M 4-bit, the agent loop (bench/agent_loop.py) over a 4.2k-token shared prefix
# (writers.py and layout.py at 85e8e22), 4 turns of 64 tokens at T = 0, each a fresh process: turn 1 is cold, the
# later turns resume the kept prefill; mlx-lm's plain generate and mtpcli without the cache beside them.
# Calls (../shared/gpu.md), each within the 30 s a machine stays warm:
#   1. carry .gpu1:  mkdir -p /root/stash && cp .gpu1/part.aa /root/stash/
#   2. carry .gpum1: cp .gpum1/* /root/stash/
#   3. carry .gpu2 .gpum2: bash bench/gpu_prefill.sh
source bench/gpu_stage.sh gpu_prefill
M=/tmp/m/smol4
echo "warm-up (the first process compiles the kernels)"
for a in "--draft none" ""; do echo "def f(x):" | python3 -m mtpcli generate -m $M --max-tokens 16 --no-log -q $a >/dev/null; done
python3 -m mlx_lm generate --model $M --prompt "def f(x):" --max-tokens 16 >/dev/null
python3 bench/agent_loop.py --model $M --prefix src/mtpcli/writers.py,src/mtpcli/layout.py --turns 4 --max-tokens 64 \
    --out "$OUT/agent_loop_gpu.json"
