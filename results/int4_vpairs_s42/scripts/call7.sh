# Session 42, device call 7 (from the repository root): OUT=dir bash results/int4_vpairs_s42/scripts/call7.sh
# the other gpu-marked tests, then bench_attention's whole table
D=$OUT/call7; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
timeout 200 python -m pytest -m gpu tests/test_kernels_prefill.py tests/test_kernels_write.py tests/test_cuda_graph.py tests/test_gpu_engine.py tests/test_fused_ops.py tests/test_kernels_rotate.py tests/test_formats_fp8.py -n 15 -q > $D/tests_other.log 2>&1; tail -3 $D/tests_other.log
timeout 300 python benchmarks/bench_attention.py --rep-ms 20 --out $D/attn > $D/attn.log 2>&1; tail -3 $D/attn.log; grep "^| " $D/attn/bench_attention.md | head -60
