#!/bin/bash
# Session 45, call 3: the rest of the gpu decode file after the add_rn change (call 2 ran its bits test).
# OUT=dir bash results/decode_s45/scripts/call3.sh   (from the repository root, on the GPU machine)
set -u
mkdir -p "$OUT"
timeout 580 python -m pytest -m gpu tests/test_kernels_decode.py -n 15 -q -p no:cacheprovider -rf \
  -k "not test_frag_rot_epilogue_bits_gpu" 2>&1 | tail -30 > "$OUT/decode.log"; tail -5 "$OUT/decode.log"
