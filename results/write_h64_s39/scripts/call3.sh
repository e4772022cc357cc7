# Session 39, call 3: the write's new tiles at head dim 64 (plan_write: 32 tokens a program) against the old (64 in
# the row layout, 16 in the plain one), side by side twice; Llama's defaults (unchanged); the write's gpu tests.
set -x
for r in 1 2; do
python benchmarks/probe_write.py --tokens 65536 --kv-heads 3 --head-dim 64 --slots random,blocks --block-t auto,16,64 --warps 4 > $OUT/smollm2_ab$r.log 2>&1
done
python benchmarks/probe_write.py --tokens 65536 --slots random,blocks --block-t auto --warps 4 > $OUT/llama_defaults.log 2>&1
timeout 240 python -m pytest -m gpu tests/test_kernels_write.py -n 12 -q > $OUT/tests_write.log 2>&1
tail -2 $OUT/tests_write.log
cat $OUT/smollm2_ab1.log $OUT/smollm2_ab2.log $OUT/llama_defaults.log
