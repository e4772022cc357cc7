# Session 41, device call 2 (from the repository root): OUT=dir bash results/int4_h64_s41/scripts/call2.sh
D=$OUT/call2; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
timeout 560 python -m pytest -m gpu tests/test_kernels_decode.py -n 15 -q -p no:cacheprovider > $D/tests_decode.log 2>&1; tail -3 $D/tests_decode.log
