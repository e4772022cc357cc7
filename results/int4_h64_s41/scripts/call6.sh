# Session 41, device call 6 (from the repository root): OUT=dir bash results/int4_h64_s41/scripts/call6.sh
# int4 at head dim 64 (P_WORDS) on thin grids: the 128-register cap against none (161 registers, no spills)
D=$OUT/call6; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
SHAPES=smollm2-1x32768:1:32768:9:3,smollm2-1x8192:1:8192:9:3,smollm2-4x8192:4:8192:9:3,smollm2-2x16384:2:16384:9:3,llama1b-1x32768:1:32768:32:8,llama1b-1x8192:1:8192:32:8,llama1b-4x4096:4:4096:32:8 \
SETTINGS="cap128|variant=fragt;nocap|variant=fragt+A.FRAGT_HEAD64_MAXNREG=0;dot|variant=dot" ROUNDS=3 \
  timeout 300 python results/int4_h64_s41/scripts/int4_h64_ab.py > $D/ab.jsonl 2> $D/ab.err; tail -2 $D/ab.err
python - <<'PY'
import json, collections, os
p = os.path.join(os.environ["OUT"], "call6", "ab.jsonl")
rows = [json.loads(l) for l in open(p) if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    if "setting" in r: agg[(r["shape"], r["format"], r["setting"])].append(r)
    else: print(r["shape"], "bf16", r["us_layer"])
for (s, fm, st), rs in agg.items():
    print(s, fm, st, rs[0]["variant"], "splits", rs[0]["splits"], "pf", rs[0]["prefetch"], "cap", rs[0]["maxnreg"],
          [r["us_layer"] for r in rs], "diff", max(r["max_abs_diff"] for r in rs))
PY
