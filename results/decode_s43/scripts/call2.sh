#!/bin/bash
# Session 43, device call 2: "frag" (8-bit codes, head dim 128, cp.async ring) split counts and ring distance around
# the plan's, side by side, at Llama-3.1-8B's 8 x 8192, 32 x 4096 and 64 x 2048. Run from the repository root with OUT set.
set -x
F=int8,fp8_e4m3
run() {  # name shapes settings
  SHAPES=$2 FORMATS=$F ROUNDS=2 REP_MS=20 SETTINGS="$3" timeout 250 python benchmarks/ab_decode.py > $OUT/$1.jsonl 2> $OUT/$1.err
}
run s8x8192 llama8b-8x8192:8:8192:32:8:128 "base|;s6|variant=frag+num_splits=6+prefetch=1;s10|variant=frag+num_splits=10+prefetch=1;s12|variant=frag+num_splits=12+prefetch=1;pf2|prefetch=2"
run s32x4096 llama8b-32x4096:32:4096:32:8:128 "base|;s3|variant=frag+num_splits=3+prefetch=1;s4|variant=frag+num_splits=4+prefetch=1;pf2|prefetch=2"
run s64x2048 llama8b-64x2048:64:2048:32:8:128 "base|;s2|variant=frag+num_splits=2+prefetch=1;pf2|prefetch=2"
python - <<'PY'
import json, os, collections, glob
for f in sorted(glob.glob(os.path.join(os.environ["OUT"], "*.jsonl"))):
    rows = [json.loads(l) for l in open(f) if l.startswith("{")]
    d = collections.defaultdict(list)
    for r in rows:
        if "setting" in r:
            d[(r["shape"], r["format"], r["setting"])].append(r)
    for k, v in d.items():
        print(*k, [x["us_layer"] for x in v], v[0]["vs_bf16"], v[0]["variant"], v[0]["splits"], v[0]["prefetch"], "diff", max(x["max_abs_diff"] for x in v))
PY
tail -n 3 $OUT/*.err
