python -m pytest -m gpu tests/test_kernels_decode.py -n 14 -q -p no:cacheprovider 2>&1 | tail -4 > $OUT/decode_tests.log
cat $OUT/decode_tests.log
python -m pytest -m gpu tests/test_fused_ops.py tests/test_kernels_write.py tests/test_kernels_rotate.py tests/test_kernels_prefill.py tests/test_gpu_engine.py tests/test_cuda_graph.py tests/test_formats_fp8.py -n 14 -q -p no:cacheprovider 2>&1 | tail -4 > $OUT/other_tests.log
cat $OUT/other_tests.log
