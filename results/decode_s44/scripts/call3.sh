#!/bin/bash
# Session 44, call 3: where the one-split epilogue and the merge differ (V8_PAIRS), the decode gpu tests with the new
# defaults, and bench_attention with them.
mkdir -p $OUT
timeout 60 python results/decode_s44/scripts/bits_debug2.py > $OUT/bits_debug2.log 2>&1; tail -30 $OUT/bits_debug2.log
timeout 400 python -m pytest -m gpu tests/test_kernels_decode.py -n 15 -q -p no:cacheprovider > $OUT/tests_decode.log 2>&1
grep -E "passed|failed|FAILED" $OUT/tests_decode.log | tail -8
timeout 125 python benchmarks/bench_attention.py --rep-ms 20 --out $OUT/attn > $OUT/attn.log 2>&1; tail -3 $OUT/attn.log; ls $OUT/attn
