# session 33, device call 1: the head-dim-64 "fragt" tests, then the A/B probe at SmolLM2's 32 x 4096 with split counts
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
timeout 300 python -m pytest -m gpu tests/test_kernels_decode.py -k "head64" -n 14 -q > $OUT/tests_h64.log 2>&1
tail -5 $OUT/tests_h64.log
NAME=h64_smol SHAPES=smollm2-32x4096 SPLITS=11,16,32 timeout 250 python results/head64_s33/scripts/h64_ab.py > $OUT/h64_smol.log 2>&1
grep -v '^{' $OUT/h64_smol.log | tail -5
