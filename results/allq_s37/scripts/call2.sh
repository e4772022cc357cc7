# session 37, device call 2 (ALL_Q planned for "dot" / "imma" now): SmolLM2's bf16 and int4 decode ("dot", head dim
# 64) over split counts and stages; the gpu-marked ALL_Q tests (every variant's bits with and without it)
cd "$(dirname "$0")/../../.."
git log -1 --format=%H > $OUT/env.txt; git status --short >> $OUT/env.txt
S=results/merge_s36/scripts/kw_sweep.py
C="plan;num_splits=12;num_splits=14;num_splits=16;num_splits=18;num_splits=20;num_splits=22;num_splits=24;num_splits=32"
C="$C;num_stages=3;num_splits=14+num_stages=3;num_splits=16+num_stages=3;num_splits=20+num_stages=3;num_splits=22+num_stages=3"
SHAPES=smollm2-32x4096 FMTS=bf16 ROUNDS=3 CONFIGS="$C" timeout 200 python $S 2>&1 | grep -v Warning > $OUT/sweep_bf16.jsonl
C="plan;num_splits=11;num_splits=16;num_splits=28;num_splits=32;num_splits=44"
SHAPES=smollm2-32x4096 FMTS=bf16,int4 ROUNDS=3 CONFIGS="$C" timeout 150 python $S 2>&1 | grep -v Warning > $OUT/sweep_int4.jsonl
python - <<'PY'
import json, os, collections
for f in ("sweep_bf16", "sweep_int4"):
    rows = [json.loads(l) for l in open(os.environ["OUT"] + f"/{f}.jsonl") if l.startswith("{")]
    agg = collections.defaultdict(list)
    for r in rows:
        if "error" in r: print(r); continue
        agg[(r["format"], r["config"], tuple(r["grid"]), r["options"].get("num_stages"), r["options"].get("ALL_Q"))].append(r)
    for k, rs in sorted(agg.items(), key=lambda kv: (kv[0][0], min(x["us_layer"] for x in kv[1]))):
        print(*k, [x["us_layer"] for x in rs], [x["TBps"] for x in rs], [x["vs_bf16"] for x in rs], "%.2g" % max(x["max_diff_vs_plan"] for x in rs))
PY
timeout 200 python -m pytest -m gpu tests/test_kernels_decode.py -k "all_q" -n 15 -q > $OUT/tests_allq.log 2>&1
tail -3 $OUT/tests_allq.log
