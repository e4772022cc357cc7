# session 36, device call 3: SmolLM2's bf16 decode ("dot", head dim 64): tiles, warps, stages, splits, merge, prefetch
cd "$(dirname "$0")/../../.."
S=results/merge_s36/scripts/kw_sweep.py
C="plan;merge=fused;num_splits=8;num_splits=10;num_splits=12;num_splits=16;prefetch=1;prefetch=2;num_stages=1;num_stages=3;num_stages=4"
C="$C;block_n=16;block_n=64;block_n=64+num_stages=1;block_n=64+num_stages=3;num_warps=2;num_warps=2+block_n=64;num_warps=4+block_n=64"
C="$C;num_splits=12+block_n=64;num_splits=8+block_n=64;num_splits=16+block_n=16;num_stages=3+prefetch=1;block_n=16+num_stages=4"
SHAPES=smollm2-32x4096 FMTS=bf16 CONFIGS="$C" timeout 300 python $S 2>&1 | grep -v Warning > $OUT/bf16_smollm2.jsonl
grep -v '^{' $OUT/bf16_smollm2.jsonl | tail -3
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
