#!/usr/bin/env bash
# A tensor-sharded target over the 2 GPUs of one host (NCCL) against one GPU (bench/gpu_distributed.py): random
# weights of Qwen2.5 7B and 32B shapes, bf16, plain decoding vs speculation with a zero-cost proposer at the code T=0
# acceptance profile; tok/s and the ratio to one GPU, with self-checks (exit 1 when one fails).
# Staging (../shared/gpu.md) as bench/gpu_auto.sh: an earlier call on the same warm machine copied .gpu1/part.aa to
# /root/stash/; this call carries .gpu2 (skipped when /tmp/site already holds mlx).
#   bash bench/gpu_distributed.sh                # both, then the table  (results in $OUT/gpu_distributed_{1,2}.json)
#   MODE=two bash bench/gpu_distributed.sh       # only the 2-GPU run;  MODE=one: only the 1-GPU run; MODE=table
#   ARGS="--shapes 7b --tokens 64" bash ...       # fewer shapes or tokens
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_distributed.log") 2>&1
export PYTHONUNBUFFERED=1 MTPCLI_NO_LOG=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ! [ -d /tmp/site/mlx ]; then
  wheel=/tmp/$(cat .gpu2/NAME)
  cat /root/stash/part.aa .gpu2/part.ab > "$wheel" || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheel" .gpu2/mlx-*.whl \
      .gpu2/mlx_lm-*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv
mode=${MODE:-both}
status=0
if [ "$mode" = both ] || [ "$mode" = two ]; then
  echo "== 2 GPUs, NCCL"
  timeout ${LIMIT:-280} python3 -c "from mlx._distributed_utils.launch import main; main()" -n 2 --backend nccl \
      --env NCCL_NVLS_ENABLE=0 --python python3 -- bench/gpu_distributed.py --json "$OUT/gpu_distributed_2.json" \
      ${ARGS:-} || status=1
  # (mlx.launch exits 0 when a rank fails: the JSON's failed_checks and its presence are what count)
  [ -s "$OUT/gpu_distributed_2.json" ] || { echo "no 2-GPU result"; status=1; }
fi
if [ "$mode" = both ] || [ "$mode" = one ]; then
  echo "== 1 GPU"
  CUDA_VISIBLE_DEVICES=0 timeout ${LIMIT:-280} python3 bench/gpu_distributed.py --json "$OUT/gpu_distributed_1.json" \
      ${ARGS:-} || status=1
fi
# $OUT is empty at each call on the lent machine: keep the results in /root/stash too, for a later MODE=table call
for n in 1 2; do
  if [ -s "$OUT/gpu_distributed_$n.json" ] && [ -d /root/stash ]; then cp "$OUT/gpu_distributed_$n.json" /root/stash/; fi
  if ! [ -s "$OUT/gpu_distributed_$n.json" ] && [ -s "/root/stash/gpu_distributed_$n.json" ]; then
    cp "/root/stash/gpu_distributed_$n.json" "$OUT/"
  fi
done
if [ -s "$OUT/gpu_distributed_1.json" ] && [ -s "$OUT/gpu_distributed_2.json" ]; then
  python3 bench/gpu_distributed.py --table "$OUT/gpu_distributed_1.json" "$OUT/gpu_distributed_2.json" \
      | tee "$OUT/gpu_distributed_table.md"
fi
exit $status
