#!/bin/bash
# Session 44, call 2: the epilogue-vs-merge bits case with V8_PAIRS on and off (determinism), then the whole gpu suite
# with the new defaults (V8_PAIRS: int8 V in "frag" and "fragt", FP8 V in "frag").
mkdir -p $OUT
timeout 120 python results/decode_s44/scripts/bits_debug.py > $OUT/bits_debug.log 2>&1; tail -40 $OUT/bits_debug.log
timeout 330 python -m pytest -m gpu tests/test_kernels_decode.py -n 15 -q -p no:cacheprovider > $OUT/tests_decode.log 2>&1
tail -8 $OUT/tests_decode.log
timeout 100 python -m pytest -m gpu tests/test_kernels_prefill.py tests/test_kernels_write.py tests/test_cuda_graph.py \
  tests/test_gpu_engine.py tests/test_fused_ops.py tests/test_kernels_rotate.py tests/test_formats_fp8.py -n 15 -q \
  -p no:cacheprovider > $OUT/tests_other.log 2>&1
tail -5 $OUT/tests_other.log
