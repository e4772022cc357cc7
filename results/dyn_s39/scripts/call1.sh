# Session 39, call 1: the dynamic-tile tests, the bit-comparison tests they touch, the A/B and the timeline probe.
set -x
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
timeout 200 python -m pytest -m gpu tests/test_kernels_decode.py -n 12 -q -k "dynamic or frag_ring_gpu or pdl_merge_gpu or hw_fp8_gpu or all_q_bits_gpu" > $OUT/tests_dyn.log 2>&1
tail -5 $OUT/tests_dyn.log
timeout 260 python results/dyn_s39/scripts/dyn_ab.py > $OUT/dyn_ab.jsonl 2> $OUT/dyn_ab.err
tail -3 $OUT/dyn_ab.err
for d in 0 1; do
  KVPACK_DECODE_DYNAMIC=$d timeout 90 python benchmarks/probe_decode_timeline.py --shapes llama8b-1x32768,llama8b-8x8192 --formats int8,fp8_e4m3 --out $OUT/timeline_dyn$d.json > $OUT/timeline_dyn$d.log 2>&1
  tail -12 $OUT/timeline_dyn$d.log
done
