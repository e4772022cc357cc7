# session 34, device call 2: the prefetch rule at grids of 1.5-8 programs an SM, 256 splits at 1 x 32768, then
# bench_attention's whole table (every shape, format and write row) on this tree
cd "$(dirname "$0")/../../.."
NAME=h64_rule RUNSET=rule ROUNDS=1 FMTS=int8,fp8_e4m3 \
  SHAPES=smollm2-1x8192,smollm2-4x4096,smollm2-1x32768,smollm2-2x16384,smollm2-4x8192,llama1b-1x8192,llama1b-1x32768 \
  timeout 170 python results/head64_s34/scripts/h64_pf.py > $OUT/h64_rule.log 2>&1; echo "rule rc $?"
NAME=h64_s256 RUNSET=rule ROUNDS=1 FMTS=int8,fp8_e4m3 SPLITS=256 SHAPES=smollm2-1x32768,llama1b-1x32768 \
  timeout 80 python results/head64_s34/scripts/h64_pf.py > $OUT/h64_s256.log 2>&1; echo "s256 rc $?"
timeout 290 python benchmarks/bench_attention.py --rep-ms 20 --out $OUT/attn > $OUT/attn.log 2>&1; echo "attn rc $?"
tail -3 $OUT/attn.log
