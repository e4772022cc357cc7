# session 46, device call 2: where a decode call's time goes now (the timeline probe), at the closest misses of #4
cd "$(dirname "$0")/../../.."
timeout 400 python benchmarks/probe_decode_timeline.py --shapes llama8b-8x8192,llama8b-64x2048,llama8b-1x32768,smollm2-32x4096 \
  --formats bf16,int8,int8-static,fp8_e4m3 --out $OUT/timeline.json --raw $OUT/raw.pt \
  --plot $OUT/timeline_8x8192.png --plot-cases llama8b-8x8192/bf16,llama8b-8x8192/int8,llama8b-8x8192/fp8_e4m3 2>&1 \
  | grep -v Warning | cut -c1-300
ls -la $OUT
