# Session 42, device call 5 (from the repository root): OUT=dir bash results/int4_vpairs_s42/scripts/call5.sh
# RING8 = 1 against the direct loads (the L2 prefetch) on grids of 1.5-7.8 programs an SM, side by side
D=$OUT/call5; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
SHAPES=smollm2-4x4096:4:4096:9:3,smollm2-4x8192:4:8192:9:3,smollm2-2x16384:2:16384:9:3,llama1b-1x8192:1:8192:32:8,llama1b-1x32768:1:32768:32:8,llama1b-4x4096:4:4096:32:8 \
FORMATS=fp8_e4m3,int8,int8-static SETTINGS="direct|A.FRAGT_HEAD64_RING8=0;r1|A.FRAGT_HEAD64_RING8=1" ROUNDS=2 \
  timeout 300 python results/int4_vpairs_s42/scripts/ab.py > $D/ab8.jsonl 2> $D/ab8.err; tail -2 $D/ab8.err
python - $D/ab8.jsonl <<'PY'
import json, collections, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    if "setting" in r: agg[(r["shape"], r["format"], r["setting"])].append(r)
    else: print(r["shape"], "bf16", r["us_layer"])
for (s, fm, st), rs in agg.items():
    print(s, fm, st, rs[0]["variant"], "splits", rs[0]["splits"], "pf", rs[0]["prefetch"], "cap", rs[0]["maxnreg"],
          [r["us_layer"] for r in rs], "diff", max(r["max_abs_diff"] for r in rs))
PY
