# Session 42, device call 2 (from the repository root): OUT=dir bash results/int4_vpairs_s42/scripts/call2.sh
# V_PF0 (each tile's own V rows into L2 as its K loads go out) for 8-bit codes at head dim 64 and for int4 groups of
# 16 / 64, off / on side by side; int4 groups of 32 with the plan's rule (V_PAIRS where capped, V_PF0 without the next
# tile's prefetch) against both forced; the head-64 gpu tests
D=$OUT/call2; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
timeout 200 python -m pytest -m gpu tests/test_kernels_decode.py -k "int4_head64 or fragt_head64 or head64_prefetch" -n 15 -q > $D/tests.log 2>&1; tail -3 $D/tests.log
summ() { python - "$1" <<'PY'
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
}
SHAPES=smollm2-32x4096:32:4096:9:3,smollm2-8x8192:8:8192:9:3,llama1b-32x4096:32:4096:32:8,llama1b-8x8192:8:8192:32:8 \
FORMATS=int8,int8-static,fp8_e4m3,fp8_e5m2 SETTINGS="off|A.FRAGT_HEAD64_VPF0=0;on|A.FRAGT_HEAD64_VPF0=1" ROUNDS=3 \
  timeout 200 python results/int4_vpairs_s42/scripts/ab.py > $D/ab8.jsonl 2> $D/ab8.err; tail -2 $D/ab8.err; summ $D/ab8.jsonl
SHAPES=smollm2-32x4096:32:4096:9:3,smollm2-8x8192:8:8192:9:3,llama1b-32x4096:32:4096:32:8,llama1b-8x8192:8:8192:32:8 \
INT4_GROUPS=32,16,64 SETTINGS="rule|variant=fragt;off|variant=fragt+A.FRAGT_HEAD64_VPF0=0;on|variant=fragt+A.FRAGT_HEAD64_VPF0=1" ROUNDS=3 \
  timeout 200 python results/int4_vpairs_s42/scripts/ab.py > $D/ab4.jsonl 2> $D/ab4.err; tail -2 $D/ab4.err; summ $D/ab4.jsonl
