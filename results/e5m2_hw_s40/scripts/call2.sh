# Session 40, call 2: e5m2 decoded by the FP8 conversion instruction (KVPACK_E5M2_HW=1) against its byte permute
# (=0), side by side per layer (results/dyn_s39/scripts/dyn_ab.py: settings alternate, order reversed every other
# round), at every bench shape, e4m3 at SmolLM2's as a control; and the gpu tests of the setting.
set -x
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
timeout 200 python -m pytest -m gpu tests/test_kernels_decode.py -k "e5m2_hw or hw_fp8" -n 15 -q > $OUT/tests_e5m2_hw.log 2>&1
tail -2 $OUT/tests_e5m2_hw.log
CASES=smollm2-32x4096:fp8_e5m2,smollm2-32x4096:fp8_e4m3,llama8b-1x32768:fp8_e5m2,llama8b-8x8192:fp8_e5m2,llama8b-32x4096:fp8_e5m2,llama8b-64x2048:fp8_e5m2,llama8b-128x1024:fp8_e5m2 \
SETTINGS="KVPACK_E5M2_HW=0;KVPACK_E5M2_HW=1" ROUNDS=4 REP_MS=20 timeout 330 python results/dyn_s39/scripts/dyn_ab.py > $OUT/ab.jsonl 2> $OUT/ab.err
tail -3 $OUT/ab.err
python - <<'PY'
import json, os, collections
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/ab.jsonl")]
t = collections.defaultdict(list)
for r in rows:
    t[(r["shape"], r["format"], r["setting"])].append(r["us_layer"])
for (shape, fmt) in dict.fromkeys((k[0], k[1]) for k in t):
    a, b = t[(shape, fmt, "KVPACK_E5M2_HW=0")], t[(shape, fmt, "KVPACK_E5M2_HW=1")]
    diff = max(r["max_abs_diff"] for r in rows if r["shape"] == shape and r["format"] == fmt)
    print(f"{shape:18s} {fmt:9s} permute {sorted(a)} conversion {sorted(b)} ratio(median) {sorted(b)[len(b)//2] / sorted(a)[len(a)//2]:.3f} max_abs_diff {diff}")
PY
