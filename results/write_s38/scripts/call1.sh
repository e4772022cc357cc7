# call 1: the write layouts A/B, then the gpu-marked write tests under lane bits 2 and 4
set -x
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
python results/write_s38/scripts/write_layout_ab.py > $OUT/write_layout_ab.jsonl 2> $OUT/ab.err
for lb in 2 4; do
  KVPACK_WRITE_LANE_BIT=$lb python -m pytest -m gpu tests/test_kernels_write.py -n 8 -q -p no:cacheprovider > $OUT/tests_write_lb$lb.log 2>&1
  tail -3 $OUT/tests_write_lb$lb.log
done
