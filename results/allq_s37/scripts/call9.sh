# session 37, device call 9 (the last seconds of the budget): SmolLM2's bf16 ("dot", 16 splits with ALL_Q and its
# early merge) over tiles, stages, warps and the L2 prefetch once more: a lead for the next session, nothing changed
cd "$(dirname "$0")/../../.."
git log -1 --format=%H > $OUT/env.txt; git status --short >> $OUT/env.txt
C="plan;prefetch=1;prefetch=2;block_n=16;block_n=64;num_warps=2+block_n=64;num_stages=3;num_stages=1;num_splits=13;num_splits=13+prefetch=1"
SHAPES=smollm2-32x4096 FMTS=bf16 ROUNDS=2 CONFIGS="$C" timeout 150 python results/merge_s36/scripts/kw_sweep.py 2>&1 | grep -v Warning > $OUT/sweep_bf16.jsonl
python - <<'PY'
import json, os, collections
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/sweep_bf16.jsonl") if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    if "error" in r: print(r); continue
    agg[(r["config"], tuple(r["grid"]), r["options"].get("num_stages"), r["options"].get("num_warps"))].append(r)
for k, rs in sorted(agg.items(), key=lambda kv: min(x["us_layer"] for x in kv[1])):
    print(*k, [x["us_layer"] for x in rs], [x["TBps"] for x in rs], "%.2g" % max(x["max_diff_vs_plan"] for x in rs))
PY
