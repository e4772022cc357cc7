# Session 42, device call 9 (from the repository root): OUT=dir bash results/int4_vpairs_s42/scripts/call9.sh
# call 8 again after the fix of its bug (the V-only ring loaded K from the split's first tile: n0 was 0), one round
D=$OUT/call9; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
timeout 60 python -m pytest -m gpu tests/test_kernels_decode.py -k "ring8 and False" -n 15 -q > $D/tests.log 2>&1; tail -2 $D/tests.log
SHAPES=smollm2-32x4096:32:4096:9:3,smollm2-8x8192:8:8192:9:3,llama1b-32x4096:32:4096:32:8,llama1b-8x8192:8:8192:32:8 \
FORMATS=fp8_e4m3,int8,int8-static SETTINGS="direct|A.FRAGT_HEAD64_RING8V=0;v1|A.FRAGT_HEAD64_RING8V=1" ROUNDS=1 \
  timeout 70 python results/int4_vpairs_s42/scripts/ab.py > $D/ab8.jsonl 2> $D/ab8.err; tail -2 $D/ab8.err
python - $D/ab8.jsonl <<'PY'
import json, collections, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    if "setting" in r: agg[(r["shape"], r["format"], r["setting"])].append(r)
    else: print(r["shape"], "bf16", r["us_layer"])
for (s, fm, st), rs in agg.items():
    print(s, fm, st, rs[0]["splits"], [r["us_layer"] for r in rs], "diff", max(r["max_abs_diff"] for r in rs))
PY
