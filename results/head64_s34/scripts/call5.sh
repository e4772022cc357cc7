# session 34, device call 5: "dot"'s new prefetch defaults (int4 at head dim 64; 16-bit caches on thin grids) through the
# gpu-marked tests that run "dot" and the engine, then bench_attention's SmolLM2 row
cd "$(dirname "$0")/../../.."
timeout 200 python -m pytest -m gpu tests/test_kernels_decode.py -k "not frag and not head64" -n 15 -q -p no:cacheprovider \
  > $OUT/tests_dot.log 2>&1; echo "dot tests rc $?"; tail -1 $OUT/tests_dot.log
timeout 120 python -m pytest -m gpu tests/test_gpu_engine.py tests/test_cuda_graph.py -n 15 -q -p no:cacheprovider \
  > $OUT/tests_engine.log 2>&1; echo "engine rc $?"; tail -1 $OUT/tests_engine.log
timeout 100 python benchmarks/bench_attention.py --shapes smollm2-32x4096 --rep-ms 20 --write-tokens "" --out $OUT/attn_smol \
  > $OUT/attn_smol.log 2>&1; echo "attn rc $?"; grep smollm2 $OUT/attn_smol/bench_attention.md | head -8
