# session 37, device call 1: ALL_Q in "dot" / "imma" (`_decode_kernel`) on and off side by side at every bench_attention
# shape whose plan is one of them; then SmolLM2's bf16 decode with ALL_Q over a few split / tile choices
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
git log -1 --format=%H >> $OUT/env.txt; git status --short >> $OUT/env.txt
ROUNDS=3 timeout 300 python results/allq_s37/scripts/allq_dot_ab.py 2>&1 | grep -v Warning > $OUT/allq_dot_ab.jsonl
grep -v '^{' $OUT/allq_dot_ab.jsonl | tail -3
python - <<'PY'
import json, os, collections
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/allq_dot_ab.jsonl") if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    if "skipped" in r: continue
    agg[(r["shape"], r["format"], r["variant"], r["splits"], r["all_q"])].append(r)
for k, rs in agg.items():
    print(*k, [x["us_layer"] for x in rs], [x["vs_bf16"] for x in rs], set(x["bits_equal"] for x in rs))
PY
C="plan;num_splits=8;num_splits=12;num_splits=16;block_n=64;merge=fused;num_stages=3"
KVPACK_DECODE_ALL_Q=all SHAPES=smollm2-32x4096 FMTS=bf16 CONFIGS="$C" timeout 150 python results/merge_s36/scripts/kw_sweep.py 2>&1 | grep -v Warning > $OUT/bf16_smollm2_allq.jsonl
python - <<'PY'
import json, os, collections
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/bf16_smollm2_allq.jsonl") if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    if "error" in r: print(r); continue
    agg[(r["config"], tuple(r["grid"]), r["merge_kernel"], r["options"].get("ALL_Q"))].append(r)
for k, rs in sorted(agg.items(), key=lambda kv: min(x["us_layer"] for x in kv[1])):
    print(*k, [x["us_layer"] for x in rs], [x["TBps"] for x in rs], "%.2g" % max(x["max_diff_vs_plan"] for x in rs))
PY
