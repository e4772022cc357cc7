#!/bin/bash
# Session 45, call 2: the whole gpu suite after the add_rn change (every V-mean add rounds on its own).
# OUT=dir bash results/decode_s45/scripts/call2.sh   (from the repository root, on the GPU machine)
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
T0=$(date +%s)
timeout 120 python -m pytest -m gpu tests/test_kernels_decode.py -k test_frag_rot_epilogue_bits_gpu -n 15 -q \
  -p no:cacheprovider -rf 2>&1 | tail -20 > "$OUT/bits.log"; tail -3 "$OUT/bits.log"
timeout 150 python -m pytest -m gpu tests/test_kernels_prefill.py tests/test_kernels_write.py tests/test_cuda_graph.py \
  tests/test_gpu_engine.py tests/test_fused_ops.py tests/test_kernels_rotate.py tests/test_formats_fp8.py -n 15 -q \
  -p no:cacheprovider -rf 2>&1 | tail -20 > "$OUT/others.log"; tail -3 "$OUT/others.log"
