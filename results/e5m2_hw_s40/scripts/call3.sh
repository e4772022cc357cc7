# Session 40, call 3: every gpu-marked decode test on the final kernels (e5m2 through the conversion instruction in
# "fragt" by default), then the other 300.
set -x
timeout 470 python -m pytest -m gpu tests/test_kernels_decode.py -n 15 -q > $OUT/tests_decode.log 2>&1
tail -2 $OUT/tests_decode.log
timeout 110 python -m pytest -m gpu tests/test_kernels_prefill.py tests/test_kernels_write.py tests/test_cuda_graph.py tests/test_gpu_engine.py tests/test_fused_ops.py tests/test_kernels_rotate.py tests/test_formats_fp8.py -n 15 -q > $OUT/tests_other.log 2>&1
tail -2 $OUT/tests_other.log
