# session 35, device call 1: old (HEAD f1f646e, _ab/old) against new (the working tree) alternately, two rounds,
# then the gpu-marked tests of the one-split rotation
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
S=results/frag_epilogue_s35/scripts/rot_ab.py
for t in old new old new; do
  if [ $t = old ]; then timeout 150 python $S _ab/old old; else timeout 150 python $S . new; fi 2>&1 | grep -v Warning
done > $OUT/rot_ab.jsonl
grep -v '^{' $OUT/rot_ab.jsonl | tail -5; grep -c '^{' $OUT/rot_ab.jsonl
timeout 170 python -m pytest -m gpu tests/test_kernels_decode.py -k "rot_epilogue_bits or rotation_gpu" -n 15 -q > $OUT/tests_rot.log 2>&1
tail -15 $OUT/tests_rot.log
