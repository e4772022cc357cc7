python _ab/smol_diag.py 2>&1 | grep -v Warn | cut -c1-220
HD=96,80 FMTS=bf16,int4 python _ab/hd_probe.py 2>&1 | grep -v Warn
python -m pytest -m gpu tests/test_kernels_decode.py -n 14 -q > $OUT/gpu_decode.log 2>&1
python -m pytest -m gpu tests/test_kernels_prefill.py tests/test_kernels_write.py tests/test_cuda_graph.py tests/test_gpu_engine.py -n 14 -q > $OUT/gpu_other.log 2>&1
tail -2 $OUT/gpu_decode.log $OUT/gpu_other.log
