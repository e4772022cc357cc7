# session 34, device call 1: the head-dim-64 L2 prefetch and register cap at five shapes (two rounds), then the tests
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
NAME=h64_pf timeout 330 python results/head64_s34/scripts/h64_pf.py > $OUT/h64_pf.log 2>&1; echo "ab rc $?"
grep -v '^{' $OUT/h64_pf.log | tail -3
timeout 150 python -m pytest -m gpu tests/test_kernels_decode.py -k "head64" -n 14 -q > $OUT/tests_head64.log 2>&1
tail -3 $OUT/tests_head64.log
