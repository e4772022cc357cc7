# session 36, device call 5 (the final tree: ALL_Q for "fragt" only): bench_attention's table, then every gpu-marked test
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
git log -1 --format=%H >> $OUT/env.txt; git status --short >> $OUT/env.txt
timeout 110 python benchmarks/bench_attention.py --rep-ms 20 --out $OUT/attn > $OUT/bench.log 2>&1
echo "bench rc $?"
timeout 100 python -m pytest -m gpu tests/test_kernels_prefill.py tests/test_kernels_write.py tests/test_cuda_graph.py tests/test_gpu_engine.py tests/test_fused_ops.py tests/test_kernels_rotate.py tests/test_formats_fp8.py -n 15 -q > $OUT/tests_other.log 2>&1
tail -2 $OUT/tests_other.log
timeout 370 python -m pytest -m gpu tests/test_kernels_decode.py -n 15 -q > $OUT/tests_decode.log 2>&1
tail -4 $OUT/tests_decode.log
