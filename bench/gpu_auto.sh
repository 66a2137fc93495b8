#!/usr/bin/env bash
# draft = auto on the lent NVIDIA H200 (bench/gpu_auto.py), random weights of Qwen2.5 1.5B and 7B shapes.
# Staging (../shared/gpu.md): an earlier call on the same warm machine copied .gpu1/part.aa to /root/stash/;
# this call carries .gpu2:   bash bench/gpu_auto.sh      (results in $OUT/gpu_auto_{1.5b,7b}.json)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_auto.log") 2>&1
export PYTHONUNBUFFERED=1 MTPCLI_NO_LOG=1
wheel=/tmp/$(cat .gpu2/NAME)
cat /root/stash/part.aa .gpu2/part.ab > "$wheel" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheel" .gpu2/mlx-*.whl .gpu2/mlx_lm-*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv
for t in ${TARGETS:-1.5b 7b}; do
  PYTHONPATH=/tmp/site:$PWD/src timeout ${LIMIT:-250} python3 bench/gpu_auto.py --target $t --tokens 256 --repeats 3 \
      --out "$OUT/gpu_auto_$t.json"
done
