# session 33, device call 4: gpu-marked tests of the Gluon decode kernels and of the engine / CUDA graphs (SmolLM2's head
# dim 64 now runs "fragt" for 8-bit caches), then bench_attention's SmolLM2 row
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
timeout 330 python -m pytest -m gpu tests/test_kernels_decode.py -k "frag or head64" -n 14 -q > $OUT/tests_decode_frag.log 2>&1
tail -2 $OUT/tests_decode_frag.log
timeout 150 python -m pytest -m gpu tests/test_gpu_engine.py tests/test_cuda_graph.py -n 14 -q > $OUT/tests_engine.log 2>&1
tail -2 $OUT/tests_engine.log
timeout 100 python benchmarks/bench_attention.py --shapes smollm2-32x4096 --rep-ms 20 --out $OUT/attn > $OUT/attn.log 2>&1
tail -3 $OUT/attn.log; rm -f $OUT/attn/*.png
