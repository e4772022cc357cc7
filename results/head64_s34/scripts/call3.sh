# session 34, device call 3: every gpu-marked test on this tree (the decode kernels in one run, the rest in another)
cd "$(dirname "$0")/../../.."
timeout 110 python -m pytest -m gpu tests/test_kernels_prefill.py tests/test_kernels_write.py tests/test_cuda_graph.py \
  tests/test_gpu_engine.py tests/test_fused_ops.py tests/test_kernels_rotate.py tests/test_formats_fp8.py -n 15 -q \
  -p no:cacheprovider > $OUT/tests_rest.log 2>&1
echo "rest rc $?"; tail -2 $OUT/tests_rest.log
timeout 465 python -m pytest -m gpu tests/test_kernels_decode.py -n 15 -q -p no:cacheprovider > $OUT/tests_decode.log 2>&1
echo "decode rc $?"; tail -2 $OUT/tests_decode.log
