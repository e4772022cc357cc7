# Session 39, call 2: the cache write at SmolLM2's shape (3 kv heads, head dim 64), tokens per program x warps,
# beside Llama-3.1-8B's at the launcher's defaults (benchmarks/probe_write.py, CUDA-graph replays, L2 flushed).
set -x
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
python benchmarks/probe_write.py --tokens 65536 --slots random,blocks --block-t auto --warps 4 > $OUT/llama_defaults.log 2>&1
python benchmarks/probe_write.py --tokens 65536 --kv-heads 3 --head-dim 64 --slots random,blocks --block-t auto,16,32,128 --warps 2,4,8 > $OUT/smollm2_sweep.log 2>&1
python benchmarks/probe_write.py --tokens 65536 --kv-heads 3 --head-dim 64 --slots random --block-t auto --warps 4 --rows auto,0 > $OUT/smollm2_rows.log 2>&1
cat $OUT/llama_defaults.log $OUT/smollm2_rows.log
