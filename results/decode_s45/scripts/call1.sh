#!/bin/bash
# Session 45, call 1: the gpu decode file at f8bf596 (session 44's last commit), a call of its own.
# OUT=dir bash results/decode_s45/scripts/call1.sh   (from the repository root, on the GPU machine)
set -u
mkdir -p "$OUT"
timeout 570 python -m pytest -m gpu tests/test_kernels_decode.py -n 15 -q -p no:cacheprovider -rf 2>&1 \
  | tee $OUT/decode_suite.log | tail -25
