#!/bin/bash
# Session 44, call 1: V8_PAIRS (8-bit V by token pairs) side by side against the plan, then the gpu tests with it on.
set -x
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
mkdir -p $OUT
SHAPES=llama8b-8x8192:8:8192:32:8:128,llama8b-32x4096:32:4096:32:8:128,llama8b-64x2048:64:2048:32:8:128,llama8b-1x32768:1:32768:32:8:128,llama8b-128x1024:128:1024:32:8:128,smollm2-32x4096:32:4096:9:3,smollm2-8x8192:8:8192:9:3,smollm2-1x32768:1:32768:9:3 \
FORMATS=int8,int8-static,fp8_e4m3,fp8_e5m2 SETTINGS="plan|;v8p|A.V8_PAIRS=1" ROUNDS=2 REP_MS=20 \
  timeout 260 python benchmarks/ab_decode.py > $OUT/ab.jsonl 2> $OUT/ab.err
tail -3 $OUT/ab.err
KVPACK_V8_PAIRS=1 timeout 280 python -m pytest -m gpu tests/test_kernels_decode.py -k "not int4 and not imma" -n 15 -q \
  -p no:cacheprovider > $OUT/tests_v8p.log 2>&1
tail -15 $OUT/tests_v8p.log
