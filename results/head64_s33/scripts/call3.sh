# session 33, device call 3: int8 K as int8 MMAs or as fp16 (K8_F16), capped at 128 registers or not, at five shapes
cd "$(dirname "$0")/../../.."
NAME=h64_k8 SHAPES=smollm2-32x4096,llama1b-32x4096,smollm2-1x32768,llama1b-8x8192,smollm2-8x8192 timeout 400 \
  python results/head64_s33/scripts/h64_ab.py > $OUT/h64_k8.log 2>&1; grep -v '^{' $OUT/h64_k8.log | tail -3
