# session 35, device call 2: the has_q of "frag"'s one-split epilogue, loaded again after the loop (_ab/reload: the
# tree of call 1) against the prologue's (the working tree), alternately, two rounds; bench_attention; the tests
cd "$(dirname "$0")/../../.."
S=results/frag_epilogue_s35/scripts/rot_ab.py
export SHAPES=llama8b-64x2048,llama8b-128x1024
for t in reload new reload new; do
  if [ $t = reload ]; then timeout 100 python $S _ab/reload reload; else timeout 100 python $S . new; fi 2>&1 | grep -v Warning
done > $OUT/hasq_ab.jsonl
grep -v '^{' $OUT/hasq_ab.jsonl | tail -5; grep -c '^{' $OUT/hasq_ab.jsonl
unset SHAPES
timeout 150 python benchmarks/bench_attention.py --rep-ms 20 --out $OUT/attn > $OUT/attn.log 2>&1; echo "bench rc $?"
timeout 120 python -m pytest -m gpu tests/test_kernels_decode.py -k "rot_epilogue_bits or rotation_gpu" -n 15 -q > $OUT/tests_rot.log 2>&1
tail -2 $OUT/tests_rot.log
