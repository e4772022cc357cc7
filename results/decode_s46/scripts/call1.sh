# session 46, device call 1: (a) the read-only floor at every #4 shape, over a wider set of readers; (b) SmolLM2's
# bf16 decode ("dot", head dim 64) at the plan and its neighbours, side by side; (c) bench_attention, every format
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python benchmarks/probe_read_floor.py --shapes llama8b-1x32768,llama8b-8x8192,llama8b-32x4096,llama8b-64x2048,smollm2-32x4096 \
  --programs-per-sm 0,4,8,16 --readers 4x512x4,8x1024x4,8x1024x8,4x512x16 --out $OUT/read_floor.json 2>&1 | grep -v Warning | cut -c1-400
C="plan;num_stages=3;num_stages=4;num_splits=12;num_splits=14;num_splits=18;num_splits=20;num_stages=3+num_splits=12;num_stages=3+num_splits=20"
SHAPES=smollm2-32x4096 FMTS=bf16 ROUNDS=3 CONFIGS="$C" timeout 200 python results/merge_s36/scripts/kw_sweep.py 2>&1 | grep -v Warning > $OUT/bf16_smollm2.jsonl
python - <<'PY'
import json, os, collections
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/bf16_smollm2.jsonl") if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    if "error" in r: print(r); continue
    agg[(r["config"], tuple(r["grid"]), r["merge_kernel"])].append(r)
for k, rs in sorted(agg.items(), key=lambda kv: min(x["us_layer"] for x in kv[1])):
    print(*k, [x["us_layer"] for x in rs], [x["TBps"] for x in rs], "%.2g" % max(x["max_diff_vs_plan"] for x in rs))
PY
timeout 200 python benchmarks/bench_attention.py --rep-ms 20 --out $OUT/attn 2>&1 | grep -v Warning | tail -5
