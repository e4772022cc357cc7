# Session 41, device call 3 (from the repository root): OUT=dir bash results/int4_h64_s41/scripts/call3.sh
D=$OUT/call3; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
timeout 200 python -m pytest -m gpu tests/test_kernels_prefill.py tests/test_kernels_write.py tests/test_cuda_graph.py tests/test_gpu_engine.py tests/test_fused_ops.py tests/test_kernels_rotate.py tests/test_formats_fp8.py -n 15 -q -p no:cacheprovider > $D/tests_other.log 2>&1; tail -2 $D/tests_other.log
timeout 150 python benchmarks/bench_attention.py --rep-ms 20 --out $D/attn > $D/attn.log 2>&1; tail -2 $D/attn.log
INT4_GROUPS=16,64 SHAPES=smollm2-32x4096:32:4096:9:3,llama1b-8x8192:8:8192:32:8 SETTINGS="dot|variant=dot;fragt|variant=fragt" \
  timeout 100 python results/int4_h64_s41/scripts/int4_h64_ab.py > $D/ab_groups.jsonl 2> $D/ab_groups.err; tail -2 $D/ab_groups.err
grep -h '"setting"' $D/ab_groups.jsonl | python -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['shape'], r['format'], r['setting'], r['variant'], r['splits'], r['prefetch'], r['us_layer'], r['vs_bf16'], r['max_abs_diff'])"
