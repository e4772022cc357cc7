# call 5 (final kernels): the 300 prefill / write / graph / engine / fused-op / rotation / FP8 gpu tests, bench_attention,
# then the 1,330 decode gpu tests
set -x
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
python -m pytest -m gpu tests/test_kernels_prefill.py tests/test_kernels_write.py tests/test_cuda_graph.py tests/test_gpu_engine.py tests/test_fused_ops.py tests/test_kernels_rotate.py tests/test_formats_fp8.py -n 15 -p no:cacheprovider -q > $OUT/tests_other.log 2>&1
tail -3 $OUT/tests_other.log
python benchmarks/bench_attention.py --rep-ms 20 --out $OUT/attn > $OUT/bench.log 2>&1
tail -3 $OUT/bench.log
python -m pytest -m gpu tests/test_kernels_decode.py -n 15 -p no:cacheprovider -q > $OUT/tests_decode.log 2>&1
tail -3 $OUT/tests_decode.log
