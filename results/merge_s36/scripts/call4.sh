# session 36, device call 4: ALL_Q on / off side by side, the gpu-marked tests of ALL_Q and the one-split epilogue,
# then bench_attention's table
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
git log -1 --format=%H >> $OUT/env.txt; git status --short >> $OUT/env.txt
S=results/merge_s36/scripts/allq_ab.py
SHAPES=llama8b-64x2048,llama8b-128x1024 timeout 240 python $S 2>&1 | grep -v Warning > $OUT/allq_ab.jsonl
SHAPES=llama8b-32x4096,llama8b-8x8192,smollm2-32x4096 FMTS=bf16,int8,fp8_e4m3,int4 ROUNDS=2 timeout 150 python $S 2>&1 | grep -v Warning > $OUT/allq_ab_split.jsonl
for f in $OUT/allq_ab*.jsonl; do grep -v '^{' $f | tail -3; done
python - <<'PY'
import json, glob, os, collections
rows = [json.loads(l) for f in sorted(glob.glob(os.environ["OUT"] + "/allq_ab*.jsonl")) for l in open(f) if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows: agg[(r["shape"], r["format"], r["variant"], r["splits"], r["all_q"])].append(r)
for k, rs in agg.items():
    print(*k, [x["us_layer"] for x in rs], [x["vs_bf16"] for x in rs], set(x["bits_equal"] for x in rs))
PY
timeout 150 python -m pytest -m gpu tests/test_kernels_decode.py -k "all_q or rot_epilogue_bits" -n 15 -q > $OUT/tests_allq.log 2>&1
tail -3 $OUT/tests_allq.log
timeout 200 python benchmarks/bench_attention.py --rep-ms 20 --out $OUT/attn > $OUT/bench.log 2>&1
tail -12 $OUT/attn/bench_attention.md 2>/dev/null || tail -20 $OUT/bench.log
