# Session 41, device call 1 (from the repository root): OUT=dir bash results/int4_h64_s41/scripts/call1.sh
# (as it ran, its group-size run was named GROUPS=, which bash ignores: it ran groups of 32; INT4_GROUPS now)
set -x
D=$OUT/call1; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
timeout 200 python -m pytest -m gpu tests/test_kernels_decode.py -k "int4_head64" -n 15 -q -p no:cacheprovider > $D/tests_int4_head64.log 2>&1; tail -3 $D/tests_int4_head64.log
SETTINGS="dot|variant=dot;fragt|variant=fragt;fragt-nocap|variant=fragt+A.FRAGT_HEAD64_MAXNREG=0;fragt-cap168|variant=fragt+maxnreg=168;fragt-pf1|variant=fragt+prefetch=1;fragt-pf0|variant=fragt+prefetch=0" \
  timeout 260 python results/int4_h64_s41/scripts/int4_h64_ab.py > $D/ab.jsonl 2> $D/ab.err; tail -2 $D/ab.err
INT4_GROUPS=16,64 SHAPES=smollm2-32x4096:32:4096:9:3,llama1b-8x8192:8:8192:32:8 SETTINGS="dot|variant=dot;fragt|variant=fragt" \
  timeout 90 python results/int4_h64_s41/scripts/int4_h64_ab.py > $D/ab_groups.jsonl 2> $D/ab_groups.err; tail -2 $D/ab_groups.err
python - <<'PY'
import json, collections, os
for f in ("ab.jsonl", "ab_groups.jsonl"):
    p = os.path.join(os.environ["OUT"], "call1", f)
    if not os.path.exists(p): continue
    rows = [json.loads(l) for l in open(p) if l.startswith("{")]
    agg = collections.defaultdict(list)
    for r in rows:
        if "setting" in r: agg[(r["shape"], r["format"], r["setting"])].append(r)
        else: print(r["shape"], "bf16", r["us_layer"])
    for (s, fm, st), rs in agg.items():
        print(s, fm, st, rs[0]["variant"], "splits", rs[0]["splits"], "pf", rs[0]["prefetch"], "cap", rs[0]["maxnreg"],
              [r["us_layer"] for r in rs], [r["vs_bf16"] for r in rs], "diff", max(r["max_abs_diff"] for r in rs))
PY
