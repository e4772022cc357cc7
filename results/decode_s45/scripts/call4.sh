#!/bin/bash
# Session 45, call 4: the decode / write benchmark on the tree of calls 2-3 (the add_rn change).
# OUT=dir bash results/decode_s45/scripts/call4.sh   (from the repository root, on the GPU machine)
set -u
mkdir -p "$OUT"
python benchmarks/bench_attention.py --rep-ms 20 --out $OUT/attn > $OUT/bench.log 2>&1; tail -30 $OUT/bench.log
