# session 34, device call 4: "dot" at head dim 64 (bf16 and int4 K and V) with and without its L2 prefetch
cd "$(dirname "$0")/../../.."
NAME=h64_dot RUNSET=dot ROUNDS=2 \
  SHAPES=smollm2-1x8192,smollm2-4x4096,smollm2-1x32768,smollm2-2x16384,smollm2-8x8192,smollm2-32x4096,llama1b-1x32768,llama1b-8x8192 \
  timeout 200 python results/head64_s34/scripts/h64_pf.py > $OUT/h64_dot.log 2>&1; echo "dot rc $?"
grep -v '^{' $OUT/h64_dot.log | tail -3
