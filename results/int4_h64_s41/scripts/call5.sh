# Session 41, device call 5 (from the repository root): OUT=dir bash results/int4_h64_s41/scripts/call5.sh
D=$OUT/call5; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
timeout 150 python benchmarks/bench_attention.py --rep-ms 20 --out $D/attn > $D/attn.log 2>&1; tail -1 $D/attn.log
grep -E "^\| smollm2" $D/attn/bench_attention.md | head -6
timeout 150 python -m pytest -m gpu tests/test_kernels_decode.py -k "int4_head64 or fragt_8bit_head64 or head64_prefetch" -n 15 -q -p no:cacheprovider > $D/tests_head64.log 2>&1; tail -2 $D/tests_head64.log
