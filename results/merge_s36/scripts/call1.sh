# session 36, device call 1: the split merge fused into "frag" against its separate (PDL) launch, and split counts
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
S=results/merge_s36/scripts/merge_ab.py
SHAPES=llama8b-32x4096,llama8b-64x2048 CONFIGS=separate,fused,separate:3,fused:3 timeout 200 python $S tree 2>&1 | grep -v Warning > $OUT/ab_32x4096.jsonl
SHAPES=llama8b-8x8192 CONFIGS=separate,fused,separate:6,fused:6,separate:12,fused:12,separate:16,fused:16 timeout 200 python $S tree 2>&1 | grep -v Warning > $OUT/ab_8x8192.jsonl
SHAPES=llama8b-1x32768 CONFIGS=separate,separate:48,separate:96,fused:32,fused:16 timeout 150 python $S tree 2>&1 | grep -v Warning > $OUT/ab_1x32768.jsonl
SHAPES=smollm2-32x4096 CONFIGS=auto,auto:11,auto:16,auto:32,auto:44 timeout 150 python $S tree 2>&1 | grep -v Warning > $OUT/ab_smollm2.jsonl
for f in $OUT/ab_*.jsonl; do grep -v '^{' $f | tail -3; done
python - <<'PY'
import json, glob, os, collections
rows = [json.loads(l) for f in sorted(glob.glob(os.environ["OUT"] + "/ab_*.jsonl")) for l in open(f) if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows: agg[(r["shape"], r["format"], r["config"], r["splits"], r["merge_kernel"])].append(r)
for k, rs in agg.items():
    print(*k, [x["us_layer"] for x in rs], [x["vs_bf16"] for x in rs], "%.2g" % max(x["max_diff_vs_first"] for x in rs))
PY
