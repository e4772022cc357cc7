# Session 41, device call 4 (from the repository root): OUT=dir bash results/int4_h64_s41/scripts/call4.sh
D=$OUT/call4; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
SETTINGS="halves|variant=fragt+A.FRAGT_HEAD64_INT4_WORDS=0;words|variant=fragt;dot|variant=dot;words-nocap|variant=fragt+A.FRAGT_HEAD64_MAXNREG=0;words-pf1|variant=fragt+prefetch=1;words-pf0|variant=fragt+prefetch=0" \
  timeout 240 python results/int4_h64_s41/scripts/int4_h64_ab.py > $D/ab.jsonl 2> $D/ab.err; tail -2 $D/ab.err
python - <<'PY'
import json, collections, os
p = os.path.join(os.environ["OUT"], "call4", "ab.jsonl")
rows = [json.loads(l) for l in open(p) if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    if "setting" in r: agg[(r["shape"], r["format"], r["setting"])].append(r)
    else: print(r["shape"], "bf16", r["us_layer"])
for (s, fm, st), rs in agg.items():
    print(s, fm, st, rs[0]["variant"], "splits", rs[0]["splits"], "pf", rs[0]["prefetch"], "cap", rs[0]["maxnreg"],
          [r["us_layer"] for r in rs], [r["vs_bf16"] for r in rs], "diff", max(r["max_abs_diff"] for r in rs))
PY
timeout 300 python -m pytest -m gpu tests/test_kernels_decode.py -k "int4" -n 15 -q -p no:cacheprovider > $D/tests_int4.log 2>&1; tail -3 $D/tests_int4.log
