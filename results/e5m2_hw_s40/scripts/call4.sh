# Session 40, call 4: bench_attention on the final kernels (the README's table).
set -x
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
timeout 480 python benchmarks/bench_attention.py --rep-ms 20 --out $OUT/attn > $OUT/bench.log 2>&1
tail -3 $OUT/bench.log
