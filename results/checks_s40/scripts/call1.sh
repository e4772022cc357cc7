# Session 40, call 1: the write launcher's tile checks (plan_write refuses row-layout tiles with more threads than
# quarter rows) on the GPU: the 300 non-decode gpu tests, probe_write's default tiles at Llama-3.1-8B's and SmolLM2's
# shapes (the plans are unchanged), and a sweep that includes refused tiles (skipped by name).
set -x
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
timeout 300 python -m pytest -m gpu tests/test_kernels_prefill.py tests/test_kernels_write.py tests/test_cuda_graph.py tests/test_gpu_engine.py tests/test_fused_ops.py tests/test_kernels_rotate.py tests/test_formats_fp8.py -n 15 -q > $OUT/tests_other.log 2>&1
tail -2 $OUT/tests_other.log
python benchmarks/probe_write.py --tokens 65536 --slots random,blocks --block-t auto --warps 4 > $OUT/llama_defaults.log 2>&1
python benchmarks/probe_write.py --tokens 65536 --kv-heads 3 --head-dim 64 --slots random,blocks --block-t auto --warps 4 > $OUT/smollm2_defaults.log 2>&1
python benchmarks/probe_write.py --tokens 65536 --formats int4 --slots random --block-t 16,32 --warps 4,8 > $OUT/refused_tiles.log 2>&1
cat $OUT/env.txt $OUT/llama_defaults.log $OUT/smollm2_defaults.log $OUT/refused_tiles.log
