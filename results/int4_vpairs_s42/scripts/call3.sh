# Session 42, device call 3 (from the repository root): OUT=dir bash results/int4_vpairs_s42/scripts/call3.sh
# V_PF0 for 8-bit codes at head dim 64 asking for V's code rows only (call 2 also asked for the scale rows: int8 spilled
# 105 words, fp8 66), off / on side by side
D=$OUT/call3; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
SHAPES=smollm2-32x4096:32:4096:9:3,smollm2-8x8192:8:8192:9:3,llama1b-32x4096:32:4096:32:8,llama1b-8x8192:8:8192:32:8 \
FORMATS=fp8_e4m3,fp8_e5m2,int8 SETTINGS="off|A.FRAGT_HEAD64_VPF0=0;on|A.FRAGT_HEAD64_VPF0=1" ROUNDS=3 \
  timeout 200 python results/int4_vpairs_s42/scripts/ab.py > $D/ab8.jsonl 2> $D/ab8.err; tail -2 $D/ab8.err
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
