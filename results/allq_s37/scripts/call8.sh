# session 37, device call 8: "frag"'s 8-bit cp.async ring two tiles ahead (three slots, 50 KB a program; 4 an SM
# still fit) against the plan's one tile ahead, at the ring's own split counts
cd "$(dirname "$0")/../../.."
git log -1 --format=%H > $OUT/env.txt; git status --short >> $OUT/env.txt
S=results/merge_s36/scripts/kw_sweep.py
for sc in llama8b-64x2048:1 llama8b-32x4096:2 llama8b-8x8192:8; do
  SHAPES=${sc%:*} FMTS=bf16,int8,fp8_e4m3 ROUNDS=3 CONFIGS="plan;prefetch=2+num_splits=${sc#*:}" \
    timeout 120 python $S 2>&1 | grep -v Warning >> $OUT/ring2.jsonl
done
python - <<'PY'
import json, os, collections
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/ring2.jsonl") if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    if "error" in r: print(r); continue
    agg[(r["shape"], r["format"], r["config"], r["variant"], tuple(r["grid"]))].append(r)
for k, rs in agg.items():
    print(*k, [x["us_layer"] for x in rs], [x["vs_bf16"] for x in rs], "%.2g" % max(x["max_diff_vs_plan"] for x in rs))
PY
