# Session 42, device call 1 (from the repository root): OUT=dir bash results/int4_vpairs_s42/scripts/call1.sh
# int4 at head dim 64 ("fragt", P_WORDS): V by channel pairs (session 41) / by token pairs / token pairs + each tile's
# own V asked into L2; the int4 head-64 gpu tests; bench_attention at SmolLM2's shape
D=$OUT/call1; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log -1 --format=%H; git status --short) > $D/env.txt 2>&1
timeout 200 python -m pytest -m gpu tests/test_kernels_decode.py -k "int4_head64 or fragt_head64 or head64_prefetch" -n 15 -q > $D/tests.log 2>&1; tail -3 $D/tests.log
SHAPES=smollm2-32x4096:32:4096:9:3,smollm2-8x8192:8:8192:9:3,smollm2-1x32768:1:32768:9:3,smollm2-1x8192:1:8192:9:3,llama1b-32x4096:32:4096:32:8,llama1b-8x8192:8:8192:32:8 \
SETTINGS="chan|variant=fragt+A.FRAGT_HEAD64_INT4_VPAIRS=0;pairs|variant=fragt;pairs_vpf0|variant=fragt+A.FRAGT_HEAD64_INT4_VPF0=1" ROUNDS=3 \
  timeout 260 python results/int4_vpairs_s42/scripts/ab.py > $D/ab.jsonl 2> $D/ab.err; tail -2 $D/ab.err
python - <<'PY'
import json, collections, os
p = os.path.join(os.environ["OUT"], "call1", "ab.jsonl")
rows = [json.loads(l) for l in open(p) if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    if "setting" in r: agg[(r["shape"], r["format"], r["setting"])].append(r)
    else: print(r["shape"], "bf16", r["us_layer"])
for (s, fm, st), rs in agg.items():
    print(s, fm, st, rs[0]["variant"], "splits", rs[0]["splits"], "pf", rs[0]["prefetch"], "cap", rs[0]["maxnreg"],
          [r["us_layer"] for r in rs], "diff", max(r["max_abs_diff"] for r in rs))
PY
timeout 100 python benchmarks/bench_attention.py --shapes smollm2-32x4096 --rep-ms 20 --write-tokens "" --out $D/attn > $D/attn.log 2>&1; grep -i "smollm2" $D/attn/*.md | head -3
