# session 36, device call 2: the ring's programs an SM (the split count of "frag" with its ring), and int4's splits
cd "$(dirname "$0")/../../.."
S=results/merge_s36/scripts/merge_ab.py
SHAPES=llama8b-8x8192,llama8b-1x32768,llama8b-32x4096 FMTS=bf16,int8,fp8_e4m3,fp8_e5m2 CONFIGS=auto,auto@3,auto@5,auto@6 timeout 250 python $S tree 2>&1 | grep -v Warning > $OUT/ring_ab.jsonl
SHAPES=llama8b-32x4096 FMTS=bf16,int4 CONFIGS=auto,auto:3,auto:5,auto:6,auto:8,separate timeout 120 python $S tree 2>&1 | grep -v Warning > $OUT/int4_32x4096.jsonl
SHAPES=llama8b-64x2048 FMTS=bf16,int4 CONFIGS=auto,auto:1,auto:3,auto:4,separate timeout 120 python $S tree 2>&1 | grep -v Warning > $OUT/int4_64x2048.jsonl
for f in $OUT/*.jsonl; do grep -v '^{' $f | tail -3; done
python - <<'PY'
import json, glob, os, collections
rows = [json.loads(l) for f in sorted(glob.glob(os.environ["OUT"] + "/*.jsonl")) for l in open(f) if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows: agg[(r["shape"], r["format"], r["config"], r["variant"], r["splits"], r["merge_kernel"])].append(r)
for k, rs in agg.items():
    print(*k, [x["us_layer"] for x in rs], [x["vs_bf16"] for x in rs], "%.2g" % max(x["max_diff_vs_first"] for x in rs))
PY
