#!/bin/bash
# Session 43, device call 3: "frag"'s separate merge spinning on per-(sequence, kv head) split counts (MERGE_FLAG)
# against the dependent launch's wait for the whole grid, side by side; then the gpu tests of "frag", its merges and
# CUDA graphs with the flag on. Run from the repository root with OUT set.
set -x
SHAPES=llama8b-8x8192:8:8192:32:8:128 FORMATS=fp8_e4m3 ROUNDS=1 REP_MS=5 SETTINGS="flag|A.MERGE_FLAG=1" \
  timeout 120 python benchmarks/ab_decode.py > $OUT/smoke.jsonl 2> $OUT/smoke.err; echo "smoke rc $?"
cat $OUT/smoke.jsonl
SHAPES=llama8b-8x8192:8:8192:32:8:128,llama8b-32x4096:32:4096:32:8:128,llama8b-1x32768:1:32768:32:8:128 \
FORMATS=int8,int8-static,fp8_e4m3 ROUNDS=3 REP_MS=20 SETTINGS="base|;flag|A.MERGE_FLAG=1" \
  timeout 300 python benchmarks/ab_decode.py > $OUT/flag_ab.jsonl 2> $OUT/flag_ab.err; echo "ab rc $?"
python - <<'PY'
import json, os, collections
rows = [json.loads(l) for l in open(os.path.join(os.environ["OUT"], "flag_ab.jsonl")) if l.startswith("{")]
d = collections.defaultdict(list)
for r in rows:
    if "setting" in r:
        d[(r["shape"], r["format"], r["setting"])].append(r)
    else:
        print(r)
for k, v in d.items():
    print(*k, [x["us_layer"] for x in v], v[0]["vs_bf16"], v[0]["variant"], v[0]["splits"], "diff", max(x["max_abs_diff"] for x in v))
PY
KVPACK_DECODE_MERGE_FLAG=1 timeout 400 python -m pytest -q -m gpu -n 8 tests/test_kernels_decode.py tests/test_cuda_graph.py \
  tests/test_gpu_engine.py -k "frag_ring_gpu or pdl_merge or decode_frag_gpu or cuda_graph or engine" > $OUT/tests_flag.log 2>&1
echo "tests rc $?"; tail -5 $OUT/tests_flag.log
