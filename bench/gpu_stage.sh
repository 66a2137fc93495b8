# Sourced by the GPU scripts (`source bench/gpu_stage.sh NAME`): output to $OUT/NAME.log as well, then stage what the
# lent machine needs (../shared/gpu.md). Earlier calls on the same warm machine copied .gpu1/part.aa and the model's
# parts (.gpumK/NAME.part.*, from ../shared/gpu/pack-model.sh) to /root/stash/; this call carries .gpu2 (the wheel's
# second part, its NAME, the other wheels) and the last .gpumK, whose part is staged here. Every packed archive in
# the stash is unpacked under /tmp/m (SmolLM2-135M 4-bit: /tmp/m/smol4) unless MODEL=0; PYTHONPATH ends at the
# installed wheels and this tree's src/.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/$1.log") 2>&1
export PYTHONUNBUFFERED=1
cp .gpum*/*.part.* /root/stash/ 2>/dev/null  # the model's parts this call carries, if any
wheel=/tmp/$(cat .gpu2/NAME)
cat /root/stash/part.aa .gpu2/part.ab > "$wheel" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheel" .gpu2/mlx-*.whl \
    .gpu2/mlx_lm-*.whl .gpu2/tomli_w-*.whl || exit 1
if [ "${MODEL:-1}" != 0 ]; then mkdir -p /tmp/m
  for name in $(ls /root/stash/*.part.* | sed 's|.*/||; s|\.part\..*||' | sort -u); do
    cat /root/stash/"$name".part.* | tar xzf - -C /tmp/m || exit 1; done; fi
nvidia-smi --query-gpu=name,driver_version --format=csv
export PYTHONPATH=/tmp/site:$PWD/src
