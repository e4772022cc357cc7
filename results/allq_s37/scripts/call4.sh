# session 37, device call 4: the separate merge launched early (KVPACK_DECODE_PDL=start) against the default where
# it is not measured: "fragt" int4 with more than 256 merge programs (32 x 4096, 64 x 2048) and at 8 x 8192, "imma"
# and "dot" on 8-bit caches (asked for by KVPACK_DECODE_VARIANT)
cd "$(dirname "$0")/../../.."
git log -1 --format=%H > $OUT/env.txt; git status --short >> $OUT/env.txt
S=results/allq_s37/scripts/env_ab.py
CASES=llama8b-32x4096:int4,llama8b-64x2048:int4,llama8b-8x8192:int4 SETTINGS="default;KVPACK_DECODE_PDL=start" \
  timeout 200 python $S 2>&1 | grep -v Warning > $OUT/pdl_fragt.jsonl
CASES=llama8b-8x8192:int8,llama8b-1x32768:int8,llama8b-32x4096:int8 \
  SETTINGS="KVPACK_DECODE_VARIANT=imma;KVPACK_DECODE_VARIANT=imma+KVPACK_DECODE_PDL=start;KVPACK_DECODE_VARIANT=imma+KVPACK_DECODE_PDL=0" \
  timeout 200 python $S 2>&1 | grep -v Warning > $OUT/pdl_imma.jsonl
CASES=llama8b-8x8192:fp8_e4m3,llama8b-32x4096:fp8_e5m2,llama8b-8x8192:int4 \
  SETTINGS="KVPACK_DECODE_VARIANT=dot;KVPACK_DECODE_VARIANT=dot+KVPACK_DECODE_PDL=start;KVPACK_DECODE_VARIANT=dot+KVPACK_DECODE_PDL=0" \
  timeout 200 python $S 2>&1 | grep -v Warning > $OUT/pdl_dot.jsonl
python - <<'PY'
import json, os, collections, glob
for f in sorted(glob.glob(os.environ["OUT"] + "/pdl_*.jsonl")):
    rows = [json.loads(l) for l in open(f) if l.startswith("{")]
    agg = collections.defaultdict(list)
    for r in rows:
        agg[(r["shape"], r["format"], r["variant"], r["splits"], r["setting"], r["PDL"])].append(r)
    base = {}
    for k, rs in agg.items():
        base.setdefault(k[:2], min(x["us_layer"] for x in rs))
    for k, rs in agg.items():
        print(*k, [x["us_layer"] for x in rs], round(min(x["us_layer"] for x in rs) / base[k[:2]], 4), set(x["bits_equal"] for x in rs))
PY
