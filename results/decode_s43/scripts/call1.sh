#!/bin/bash
# Session 43, device call 1: 8-bit head-dim-64 V loads pulled ahead (V_EARLY8 1 / 2 / 4), and "frag"'s fused merge at
# head dim 128, side by side. Run from the repository root with OUT set.
set -x
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
SHAPES=smollm2-32x4096:32:4096:9:3,llama1b-32x4096:32:4096:32:8,smollm2-16x4096:16:4096:9:3,llama1b-8x8192:8:8192:32:8 \
FORMATS=int8,fp8_e4m3 ROUNDS=2 REP_MS=20 \
SETTINGS="base|;bar|A.FRAGT_HEAD64_VEARLY8=1;l1v|A.FRAGT_HEAD64_VEARLY8=2;l1next|A.FRAGT_HEAD64_VEARLY8=4" \
  timeout 300 python benchmarks/ab_decode.py > $OUT/h64_ab.jsonl 2> $OUT/h64_ab.err
SHAPES=llama8b-32x4096:32:4096:32:8:128,llama8b-8x8192:8:8192:32:8:128,llama8b-1x32768:1:32768:32:8:128 \
FORMATS=int8,fp8_e4m3 ROUNDS=2 REP_MS=20 SETTINGS="base|;fused|merge=fused" \
  timeout 200 python benchmarks/ab_decode.py > $OUT/merge_ab.jsonl 2> $OUT/merge_ab.err
tail -3 $OUT/*.err
python - <<'PY'
import json, os, collections
for f in ("h64_ab.jsonl", "merge_ab.jsonl"):
    rows = [json.loads(l) for l in open(os.path.join(os.environ["OUT"], f)) if l.startswith("{")]
    d = collections.defaultdict(list)
    for r in rows:
        if "setting" in r:
            d[(r["shape"], r["format"], r["setting"])].append(r)
    for k, v in d.items():
        print(f, *k, [x["us_layer"] for x in v], v[0]["vs_bf16"], v[0]["variant"], v[0]["splits"], v[0]["prefetch"], "diff", max(x["max_abs_diff"] for x in v))
PY
