# session 37, device call 5 (ALL_Q in "dot" / "imma", 16-bit head-dim-64 splits, PDL at head dim 64): SmolLM2's split
# counts again for every format, now that its merges launch early
cd "$(dirname "$0")/../../.."
git log -1 --format=%H > $OUT/env.txt; git status --short >> $OUT/env.txt
C="plan;num_splits=16;num_splits=22;num_splits=28;num_splits=32"
SHAPES=smollm2-32x4096 FMTS=bf16,int8,fp8_e4m3,fp8_e5m2,int4 ROUNDS=2 CONFIGS="$C" timeout 300 python results/merge_s36/scripts/kw_sweep.py 2>&1 | grep -v Warning > $OUT/sweep.jsonl
python - <<'PY'
import json, os, collections
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/sweep.jsonl") if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    if "error" in r: print(r); continue
    agg[(r["format"], r["config"], r["variant"], tuple(r["grid"]), r["options"].get("PDL"), r["merge_kernel"])].append(r)
for k, rs in sorted(agg.items(), key=lambda kv: (kv[0][0], min(x["us_layer"] for x in kv[1]))):
    print(*k, [x["us_layer"] for x in rs], [x["TBps"] for x in rs], [x["vs_bf16"] for x in rs])
PY
