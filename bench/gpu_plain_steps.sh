#!/usr/bin/env bash
# mtpcli's plain decoding steps against mlx-lm's own loop (stream_generate) on the lent NVIDIA H200, for the
# engine in src/ (new) and a copy of the previous engine's source in .oldsrc/ (old), alternating new, old, new, old
# in separate processes; then, time allowing, one n-gram run of the new engine on the file-edit prompts.
#
# Staging (see ../shared/gpu.md): earlier calls on the same warm machine copied .gpu1/part.aa and the model's
# parts (.gpumK/smol4.part.*, from `mlx_lm convert -q --q-bits 4` of SmolLM2-135M-Instruct and
# ../shared/gpu/pack-model.sh /tmp/smol4 smol4) into /root/stash/. This call carries .gpu2 and .oldsrc:
#   bash bench/gpu_plain_steps.sh        (results land in $OUT/engine-{new,old}-r{1,2}.json, engine-new-ngram.json)
# Each arm's decode tok/s is measured the same way for mtpcli and mlx-lm (tokens after the first, over time after
# the first); the ratio column is each arm over the first arm (mtpcli "exact" with --draft none), in one process.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-500}            # seconds for the whole script; each run gets what is left, at most 170 s
log=$OUT/gpu_plain_steps.log
exec > >(tee "$log") 2>&1
export PYTHONUNBUFFERED=1 MTPCLI_NO_LOG=1

wheel=/tmp/$(cat .gpu2/NAME)
cat /root/stash/part.aa .gpu2/part.ab > "$wheel" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheel" .gpu2/mlx-*.whl .gpu2/mlx_lm-*.whl || exit 1
mkdir -p /tmp/m && cat /root/stash/smol4.part.* | tar xzf - -C /tmp/m || exit 1
ls -la /tmp/m/smol4
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
PYTHONPATH=/tmp/site python3 -c "import typer, rich, transformers, mlx.core as mx, mlx_lm; print('imports ok: mlx', mx.__version__, 'mlx_lm', mlx_lm.__version__, 'transformers', transformers.__version__, mx.default_device())" || exit 1

P=src/mtpcli/bench_prompts
run() {  # tree label draft prompts
  local tree=$1 label=$2 draft=$3 prompts=$4
  local left=$((BUDGET - SECONDS)); local lim=$(( left < 170 ? left : 170 ))
  if (( lim < 45 )); then echo "== skip $label: ${left}s left"; return; fi
  echo "== $label (tree $tree, draft $draft, limit ${lim}s, t=${SECONDS}s)"
  local t0=$SECONDS
  PYTHONPATH=/tmp/site:$PWD/$tree timeout "$lim" python3 -m mtpcli bench --model /tmp/m/smol4 --draft "$draft" \
    --profiles exact --baseline mlx-lm-plain --prompts "$prompts" --max-tokens 256 --seeds 2 --no-chat --no-log \
    --out "$OUT/$label.json"
  echo "== $label rc=$? in $((SECONDS - t0))s"
}
run src     engine-new-r1 none "$P/prose,$P/code"
run .oldsrc engine-old-r1 none "$P/prose,$P/code"
run src     engine-new-r2 none "$P/prose,$P/code"
run .oldsrc engine-old-r2 none "$P/prose,$P/code"
run src     engine-new-ngram ngram "$P/file-edit"
echo "== done at ${SECONDS}s"
