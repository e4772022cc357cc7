#!/bin/bash
# GPU call 2 of session 32: prefill at head dims 80 / 96, the old tree (_ab/old = 108b642's kvpack, through
# results/int4_groups_s30/scripts/run_old.py) and the new one alternating in one call; then the gpu-marked
# prefill / write / graph / engine / fused-op / rotation / FP8 tests
cd "$(dirname "$0")/../../.."
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
for d in 80 96; do
  for tree in old new; do
    pre=""; [ $tree = old ] && pre="results/int4_groups_s30/scripts/run_old.py"
    timeout 100 python $pre benchmarks/bench_prefill.py --rep-ms 50 --head-dim $d --num-heads 32 --num-kv-heads 32 \
      --compare-fused --out $OUT/pf${d}_$tree > $OUT/pf${d}_$tree.log 2>&1
    echo "pf$d $tree rc $?" >> $OUT/gpu.txt
    rm -f $OUT/pf${d}_$tree/*.png
  done
done
timeout 90 python results/prefill_heads_s32/scripts/bf16_parts.py > $OUT/bf16_parts.log 2>&1
echo "bf16 parts rc $?" >> $OUT/gpu.txt
timeout 200 python -m pytest -m gpu tests/test_kernels_prefill.py tests/test_kernels_write.py tests/test_cuda_graph.py \
  tests/test_gpu_engine.py tests/test_fused_ops.py tests/test_kernels_rotate.py tests/test_formats_fp8.py -n 14 -q \
  -p no:cacheprovider > $OUT/gpu_other.log 2>&1
echo "tests rc $?" >> $OUT/gpu.txt
