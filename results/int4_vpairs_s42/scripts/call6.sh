# Session 42, device call 6 (from the repository root): OUT=dir bash results/int4_vpairs_s42/scripts/call6.sh
# every gpu-marked decode test on the session's final kernels
D=$OUT/call6; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
timeout 560 python -m pytest -m gpu tests/test_kernels_decode.py -n 15 -q > $D/tests_decode.log 2>&1; tail -3 $D/tests_decode.log
