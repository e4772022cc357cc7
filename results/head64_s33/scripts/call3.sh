# session 33, device call 3: int8 K as int8 MMAs or as fp16 (K8_F16), capped at 128 registers or not, at five shapes
cd "$(dirname "$0")/../../.."
NAME=h64_k8 SHAPES=smollm2-32x4096,llama1b-32x4096,smollm2-1x32768,llama1b-8x8192,smollm2-8x8192 timeout 400 \
  python results/head64_s33/scripts/h64_ab.py > $OUT/h64_k8.log 2>&1; grep -v '^{' $OUT/h64_k8.log | tail -3
# split counts of the capped runs (the plan keeps >= 4 tiles a split: 16 at SmolLM2's 32 x 4096, 32 at 8 x 8192)
NAME=h64_splits SHAPES=smollm2-32x4096,smollm2-8x8192,llama1b-8x8192 FMTS=int8,fp8_e4m3 ONLY="fragt k8f16 cap128,fragt cap128" \
  SPLITS=22,43,64 timeout 150 python results/head64_s33/scripts/h64_ab.py > $OUT/h64_splits.log 2>&1; grep -v '^{' $OUT/h64_splits.log | tail -3
