# session 37, device call 3: where the separate split merge is launched (KVPACK_DECODE_PDL: default, off, trigger at
# the program's start, after its loop) at the plans that do not measure it yet (SmolLM2's "dot" int4, "fragt" 8-bit
# with 288 merge programs) and beside the ones that do
cd "$(dirname "$0")/../../.."
git log -1 --format=%H > $OUT/env.txt; git status --short >> $OUT/env.txt
CASES=smollm2-32x4096:bf16,smollm2-32x4096:int4,smollm2-32x4096:int8,smollm2-32x4096:fp8_e4m3,smollm2-32x4096:fp8_e5m2,llama8b-8x8192:int8,llama8b-8x8192:fp8_e4m3,llama8b-1x32768:fp8_e4m3 \
  timeout 400 python results/allq_s37/scripts/env_ab.py 2>&1 | grep -v Warning > $OUT/pdl_ab.jsonl
python - <<'PY'
import json, os, collections
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/pdl_ab.jsonl") if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    agg[(r["shape"], r["format"], r["variant"], r["splits"], r["setting"], r["PDL"])].append(r)
base = {}
for k, rs in agg.items():
    if k[4] == "default": base[k[:2]] = min(x["us_layer"] for x in rs)
for k, rs in agg.items():
    print(*k, [x["us_layer"] for x in rs], round(min(x["us_layer"] for x in rs) / base[k[:2]], 4), set(x["bits_equal"] for x in rs))
PY
