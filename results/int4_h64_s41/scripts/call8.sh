# Session 41, device call 8 (call 7 ran -k "int4_head64 or fragt_8bit_head64 or head64_prefetch" on 0b65ce3: 6 failures, all this test's wrong assumption that its grids are thin) (from the repository root): OUT=dir bash results/int4_h64_s41/scripts/call7.sh
D=$OUT/call8; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
timeout 200 python -m pytest -m gpu tests/test_kernels_decode.py -k "int4_head64" -n 15 -q -p no:cacheprovider > $D/tests.log 2>&1; tail -2 $D/tests.log
