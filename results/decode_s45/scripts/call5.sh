#!/bin/bash
# Session 45, call 5: static-scale 8-bit formats beside bf16 (calibrated scales from `kvpack calibrate` in use).
# OUT=dir bash results/decode_s45/scripts/call5.sh   (from the repository root, on the GPU machine)
set -u
mkdir -p "$OUT"
python benchmarks/bench_attention.py --rep-ms 20 --formats bf16,int8-static,fp8_e4m3-static,fp8_e5m2-static \
  --out $OUT/attn_static > $OUT/bench_static.log 2>&1; tail -45 $OUT/bench_static.log | head -40
