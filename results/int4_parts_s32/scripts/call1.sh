#!/bin/bash
# GPU call 1 of session 32: int4 in parts side by side, the 80 / 96 decode tests, prefill at head dims 80 / 96
cd "$(dirname "$0")/../../.."
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
FMTS=bf16,int4 timeout 170 python results/int4_parts_s32/scripts/hd_int4.py > $OUT/hd_int4.log 2>&1
echo "hd rc $?" >> $OUT/gpu.txt
timeout 200 python -m pytest -m gpu tests/test_kernels_decode.py -k "80 or 96" -n 14 -q -p no:cacheprovider > $OUT/gpu_80_96.log 2>&1
echo "tests rc $?" >> $OUT/gpu.txt
for d in 80 96; do
  timeout 130 python benchmarks/bench_prefill.py --rep-ms 50 --head-dim $d --num-heads 32 --num-kv-heads 32 --compare-fused --out $OUT/pf$d > $OUT/pf$d.log 2>&1
  echo "pf$d rc $?" >> $OUT/gpu.txt
done
