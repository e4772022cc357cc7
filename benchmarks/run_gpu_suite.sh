#!/usr/bin/env bash
# The GPU suite, one command on one H200 (about 8 minutes): every benchmark the done-when criteria
# need, then the gpu-marked tests, then kvpack vs transformers (skipped if the time budget is spent), preset llama-3.1-8b with dummy bf16 weights, one KV budget for every
# format. Writes at most five files into $OUT (default results/gpu):
#   summary.md    tables of each benchmark + the criteria with PASS/FAIL
#   summary.json  every benchmark's JSON (env: GPU, driver, torch, triton, commit, command) + step timings
#   formats.png   capacity, KV-bound and short throughput, 32k decode latency per format
#   tests.log     pytest -m gpu output           run.log   every benchmark's output
# Knobs (environment): MODEL, DTYPE (bfloat16), KV_BUDGET (16GiB), KV_REQUESTS (256), KV_IN (2048:8192),
# KV_OUT (256:512), SHORT_REQUESTS (256), SHORT_LEN (128), SHORT_REPEATS (3: median run, spread shown), SHORT_FORMATS, KV_FORMATS, LAT_CONTEXT (32768),
# KV_BOUND_CAP (260 s: too short for bf16 + int8 + int4 at 256 requests on an H200, measured ~100 s per
# format plus ~20 s of int4 compiles: run it alone, STEPS=kv_bound KV_BOUND_CAP=450 TESTS=0),
# STEPS (comma list of capacity,latency,short,kv_bound,e2e; default all),
# LAT_BATCH (1), LAT_BUDGET (8GiB), E2E_KV_REQUESTS (8), SUITE_BUDGET_S (480), PY (python3), QUICK=1 (a dry run: 64
# KV-bound requests, no transformers comparison). The criteria need the defaults.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu}
PY=${PY:-python3}
MODEL=${MODEL:-dummy:llama-3.1-8b}
KV_BUDGET=${KV_BUDGET:-16GiB}
KV_REQUESTS=${KV_REQUESTS:-256}
KV_FORMATS=${KV_FORMATS:-bfloat16,int8,int4}
SHORT_FORMATS=${SHORT_FORMATS:-bfloat16,int8,int4,fp8_e4m3,fp8_e5m2}
LAT_CONTEXT=${LAT_CONTEXT:-32768}
LAT_BUDGET=${LAT_BUDGET:-8GiB}
LAT_BATCH=${LAT_BATCH:-1}
DTYPE=${DTYPE:-bfloat16}
KV_IN=${KV_IN:-2048:8192}
KV_OUT=${KV_OUT:-256:512}
SHORT_REQUESTS=${SHORT_REQUESTS:-256}
SHORT_LEN=${SHORT_LEN:-128}
E2E_KV_REQUESTS=${E2E_KV_REQUESTS:-8}
SUITE_BUDGET_S=${SUITE_BUDGET_S:-480}
if [ "${QUICK:-0}" = 1 ]; then KV_REQUESTS=64; fi
mkdir -p "$OUT"
W=$(mktemp -d)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
: > "$OUT/run.log"
: > "$W/steps.tsv"

# step NAME CAP_SECONDS CMD...: run with a time cap (never past the suite budget), log, record rc and seconds
step() {
  local name=$1 cap=$2; shift 2
  if [ -n "${STEPS:-}" ] && [[ ",$STEPS," != *",$name,"* ]]; then printf '%s\tskipped\t0\n' "$name" >> "$W/steps.tsv"; return; fi
  local left=$(( SUITE_BUDGET_S + 60 - ($(date +%s) - T0) ))
  (( left < cap )) && cap=$left
  if (( cap < 20 )); then printf '%s\tskipped\t0\n' "$name" >> "$W/steps.tsv"; echo "== $name: skipped (suite budget spent)"; return; fi
  echo "== $name (cap ${cap}s): $*" | tee -a "$OUT/run.log"
  local s=$(date +%s)
  timeout --signal=INT --kill-after=15 "$cap" "$@" >> "$OUT/run.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - s ))" >> "$W/steps.tsv"
  echo "   rc=$rc in $(( $(date +%s) - s ))s" | tee -a "$OUT/run.log"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$OUT/run.log" 2>&1 || true
# SM / memory clock, power and temperature every 0.5 s while the suite runs: formats run one after
# another, so a later one could meet a hotter, slower card; the summary gives each run's means
SAMPLER=
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader,nounits \
    -lms 500 > "$W/gpu_clocks.csv" 2> /dev/null &
  SAMPLER=$!
  trap 'kill "$SAMPLER" 2> /dev/null' EXIT  # also when the suite is interrupted
fi
"$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' >> "$OUT/run.log" 2>&1

step capacity 30 "$PY" -m kvpack bench capacity --model "$MODEL" --kv-cache-memory "$KV_BUDGET" \
  --kv-cache-dtype bfloat16,int8,int4,fp8_e4m3,fp8_e5m2 --json "$W/capacity.json"

step latency 75 "$PY" -m kvpack bench latency --model "$MODEL" --dtype "$DTYPE" --context "$LAT_CONTEXT" \
  --batch-size "$LAT_BATCH" --output-len 32 --num-iters 2 --kv-cache-memory "$LAT_BUDGET" --kv-cache-dtype bfloat16,int8,int4 \
  --output-json "$W/latency.json"

step short 170 "$PY" -m kvpack bench throughput --model "$MODEL" --dtype "$DTYPE" --num-prompts "$SHORT_REQUESTS" \
  --input-len "$SHORT_LEN" --output-len "$SHORT_LEN" --kv-cache-memory "$KV_BUDGET" --kv-cache-dtype "$SHORT_FORMATS" \
  --repeats "${SHORT_REPEATS:-3}" --output-json "$W/throughput_short.json"

step kv_bound "${KV_BOUND_CAP:-260}" "$PY" -m kvpack bench throughput --model "$MODEL" --dtype "$DTYPE" --num-prompts "$KV_REQUESTS" \
  --input-len "$KV_IN" --output-len "$KV_OUT" --kv-cache-memory "$KV_BUDGET" --kv-cache-dtype "$KV_FORMATS" \
  --output-json "$W/throughput_kv.json" ${STEP_LOG:+--step-log "$STEP_LOG"}

# the gpu-marked tests (Triton compiles dominate: spread over 4 workers when pytest-xdist is there);
# TESTS=0 skips them (when they ran in another call: the suite alone then fits in one 10-minute call)
if [ "${TESTS:-1}" != 0 ]; then
  XDIST=$("$PY" -c 'import xdist' 2>/dev/null && echo "-n 4")
  echo "== tests (cap 200s): pytest -m gpu $XDIST" | tee -a "$OUT/run.log"
  s=$(date +%s)
  timeout --signal=INT --kill-after=15 200 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider -rfE $XDIST > "$OUT/tests.log" 2>&1
  printf 'tests\t%s\t%s\n' "$?" "$(( $(date +%s) - s ))" >> "$W/steps.tsv"
  tail -n 3 "$OUT/tests.log" | tee -a "$OUT/run.log"
fi

if [ "${QUICK:-0}" != 1 ]; then
  step e2e 120 "$PY" benchmarks/bench_e2e.py --model "$MODEL" --dtype "$DTYPE" --kv-cache-memory "$KV_BUDGET" \
    --kv-cache-dtype bfloat16 --kv-requests "$E2E_KV_REQUESTS" --short-requests "$SHORT_REQUESTS" \
    --short-input-len "$SHORT_LEN" --short-output-len "$SHORT_LEN" --kv-input-len "$KV_IN" --kv-output-len "$KV_OUT" \
    --out "$W/e2e"
fi

[ -n "$SAMPLER" ] && kill "$SAMPLER" 2> /dev/null

# ---- summary: criteria, tables, plot ------------------------------------------------------------
"$PY" - "$W" "$OUT" "$(( $(date +%s) - T0 ))" <<'EOF'
import json, os, sys
W, OUT, TOTAL = sys.argv[1], sys.argv[2], int(sys.argv[3])

def load(name):
    try:
        with open(os.path.join(W, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

cap, lat = load("capacity.json"), load("latency.json")
short, kv, e2e = load("throughput_short.json"), load("throughput_kv.json"), load("e2e/e2e.json")
steps = [line.rstrip("\n").split("\t") for line in open(os.path.join(W, "steps.tsv"))]
rows = lambda d: {r["kv_cache_dtype"]: r for r in (d or {}).get("results", [])}  # noqa: E731
crit = []

def check(name, ok, detail):
    crit.append((name, "PASS" if ok else ("FAIL" if ok is not None else "MISSING"), detail))

# capacity: ratios vs the format definition's bytes per token (llama-3.1-8b, head_dim 128: int8 256/130
# = 1.969, int4 with groups of 32 256/80 = 3.2) and equal to what the engine's planner allocated in the
# throughput runs (same budget)
c = {r["kv_cache_dtype"]: r for r in cap or []}
for fmt in ("int8", "int4"):
    got = c.get(fmt, {}).get("capacity_vs_bf16")
    want = c["bfloat16"]["bytes_per_token"] / c[fmt]["bytes_per_token"] if fmt in c and "bfloat16" in c else 0
    check(f"capacity {fmt}/bf16 = {want:.3f} +-1%", None if got is None else abs(got / want - 1) <= 0.01,
          "-" if got is None else f"{got:.3f}")
engine_tokens = {k: r["kv_cache_tokens"] for d in (short, kv) for k, r in rows(d).items()}
same = [engine_tokens[k] == c[k]["tokens"] for k in engine_tokens if k in c]
check("capacity bench == engine planner (tokens)", all(same) if same else None,
      ", ".join(f"{k} {engine_tokens[k]:,}" for k in engine_tokens))
k = rows(kv)
for fmt, want in (("int8", 1.6), ("int4", 2.4)):
    r = k.get(fmt, {}).get("output_tok_s_vs_bf16")
    d = k.get(fmt, {}).get("decode_tok_s_vs_bf16")
    n = (kv or {}).get("config", {}).get("num_prompts", 0)
    row = k.get(fmt, {})
    split = f", {row['elapsed_s'] - row['decode_s']:.0f} s outside pure-decode steps" if row.get("decode_s") else ""
    base = k.get("bfloat16", {})
    if row.get("decode_s") and base.get("decode_s"):
        # what the format could reach if its pure-decode phase ran bf16's faster by exactly its capacity
        # ratio (twice the sequences per step at the same step time) and the rest took what it took
        cap_x = row["kv_cache_tokens"] / base["kv_cache_tokens"]
        ideal = base["elapsed_s"] / (row["elapsed_s"] - row["decode_s"] + base["decode_s"] / cap_x)
        split += f"; {ideal:.2f}x if decode scaled with its {cap_x:.2f}x capacity"
    if row.get("triton_compiles", {}).get("count"):  # JIT compiles inside the timed run
        split += f"; {row['triton_compiles']['count']} Triton compiles in the run ({row['triton_compiles']['seconds']:.1f} s)"
    if row.get("mean_decode_batch") and base.get("mean_decode_batch"):  # pure-decode steps: batch, step time
        split += (f"; pure-decode steps: mean batch {row['mean_decode_batch']:.0f} at {row['mean_decode_step_ms']:.1f} ms"
                  f" (bf16 {base['mean_decode_batch']:.0f} at {base['mean_decode_step_ms']:.1f} ms)")
    check(f"KV-bound ({n} req) output tok/s {fmt} >= {want}x bf16", None if r is None else (r >= want and n >= 256),
          "-" if r is None else f"{r:.2f}x (decode phase {d:.2f}x{split})" if d else f"{r:.2f}x")
s = rows(short)
worst = min((r["output_tok_s_vs_bf16"], f) for f, r in s.items()) if s else None
check("short workload: every format >= 0.9x bf16", None if worst is None else worst[0] >= 0.9,
      "-" if worst is None else ", ".join(
          f"{f} {r['output_tok_s_vs_bf16']:.2f}" + (f" (spread {r['output_tok_s_spread']:.0%})"
                                                    if "output_tok_s_spread" in r else "") for f, r in s.items()))
l = rows(lat)
r = l.get("int8", {}).get("median_vs_bf16")
b = l.get("int8", {}).get("bytes_vs_bf16")
check(f"decode latency at {(lat or {}).get('config', {}).get('context', '?')} int8 <= 0.8x bf16",
      None if r is None else r <= 0.8, "-" if r is None else f"{r:.2f}x (bytes read per step {b:.2f}x)" if b else f"{r:.2f}x")
free = [r.get("all_blocks_free") for d in (short, kv, lat) for r in rows(d).values()]
bad_rc = [n for n, rc, _ in steps if rc not in ("0", "skipped")]
check("no OOM / failed step, all blocks free", (all(free) and not bad_rc) if free else None,
      ("failed: " + ", ".join(bad_rc)) if bad_rc else f"{len(free)} runs")
tests_rc = next((rc for n, rc, _ in steps if n == "tests"), None)
tail = open(os.path.join(OUT, "tests.log")).read().strip().splitlines()[-1:] if os.path.exists(os.path.join(OUT, "tests.log")) else []
check("gpu tests", None if tests_rc is None else tests_rc == "0", tail[0] if tail else "-")
if e2e:
    for r in e2e["results"]:
        if r["engine"] == "kvpack":
            crit.append((f"e2e {r['workload']}: kvpack {r['kv_cache_dtype']} vs transformers", "info",
                         f"{r['vs_transformers']:.2f}x ({r['output_tok_s']:,.0f} tok/s)"))

def table(head, body):
    w = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(n) for c, n in zip(cells, w)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (n + 2) for n in w) + "|", *map(line, body)])

def f(x, spec):
    return "-" if x is None else format(x, spec)

env = next((d["env"] for d in (kv, short, lat, e2e) if d and "env" in d), {})
md = [f"# kvpack GPU suite: {env.get('gpu')} (driver {env.get('driver')}), torch {env.get('torch')}, "
      f"triton {env.get('triton')}, commit {env.get('commit')}, {TOTAL} s", "",
      "## Criteria", "", table(["criterion", "result", "measured"], crit), ""]
if cap:
    md += ["## Capacity", "", table(["format", "bytes/token", "tokens", "vs bf16"],
           [[r["kv_cache_dtype"], r["bytes_per_token"], f"{r['tokens']:,}", f(r["capacity_vs_bf16"], ".3f")] for r in cap]), ""]
for title, d in (("KV-bound throughput", kv), ("Short throughput", short)):
    if d:
        cfg = d["config"]
        md += [f"## {title}: {cfg['num_prompts']} requests, input {cfg['input_len']}, output {cfg['output_len']}, "
               f"KV {cfg['kv_cache_memory'] / 2**30:.0f} GiB", "",
               table(["format", "KV tokens", "req/s", "output tok/s", "vs bf16", "decode tok/s", "vs bf16",
                      "TTFT ms", "TPOT ms", "preempt", "peak KV", "blocks free"],
                     [[r["kv_cache_dtype"], f"{r['kv_cache_tokens']:,}", f(r["requests_per_s"], ".2f"),
                       f(r["output_tok_s"], ",.0f"), f(r["output_tok_s_vs_bf16"], ".2f"), f(r["decode_tok_s"], ",.0f"),
                       f(r.get("decode_tok_s_vs_bf16"), ".2f"), f(r["mean_ttft_ms"], ",.0f"), f(r["mean_tpot_ms"], ".1f"),
                       r["preemptions"], f(r["peak_kv_usage"], ".0%"), r["all_blocks_free"]] for r in d["results"]]), ""]
if lat:
    md += [f"## Decode latency, batch {lat['config']['batch_size']}, context {lat['config']['context']:,}", "",
           table(["format", "median ms/token", "vs bf16", "bytes/step vs bf16", "KV GB/s", "KV+weights GB/s"],
                 [[r["kv_cache_dtype"], f(r["median_ms"], ".3f"), f(r["median_vs_bf16"], ".2f"), f(r.get("bytes_vs_bf16"), ".2f"),
                   f(r["kv_gb_s"], ",.0f"), f(r["total_gb_s"], ",.0f")] for r in lat["results"]]), ""]
if e2e:
    md += ["## kvpack vs transformers (same weights, same KV budget)", "",
           table(["workload", "engine", "format", "requests", "output tok/s", "vs transformers"],
                 [[r["workload"], r["engine"], r["kv_cache_dtype"], r["num_requests"], f(r["output_tok_s"], ",.0f"),
                   f(r["vs_transformers"], ".2f")] for r in e2e["results"]]), ""]

def read_clocks():
    """The sampler's rows: (unix seconds, [SM MHz, memory MHz, W, deg C])."""
    import datetime
    rows = []
    try:
        lines = open(os.path.join(W, "gpu_clocks.csv")).readlines()
    except OSError:
        return rows
    for line in lines:
        p = [x.strip() for x in line.split(",")]
        try:  # nvidia-smi's timestamp is local time, as time.time() reads it
            rows.append((datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp(),
                         [float(x) for x in p[1:5]]))
        except (ValueError, IndexError):
            continue
    return rows

CLOCKS = read_clocks()

def clocks_during(t0, t1):
    """Means of the sampled values inside [t0, t1] (unix seconds), and the sample count."""
    got = [v for ts, v in CLOCKS if t0 <= ts <= t1]
    return [sum(c) / len(got) for c in zip(*got)] + [len(got)] if got else None

clock_rows = []
for title, d in (("KV-bound", kv), ("short", short)):
    for r in (d or {}).get("results", []):
        c = clocks_during(r["started_at"], r["ended_at"]) if "started_at" in r else None
        if c:
            clock_rows.append([title, r["kv_cache_dtype"], f"{c[0]:.0f}", f"{c[1]:.0f}", f"{c[2]:.0f}", f"{c[3]:.0f}", c[4]])
if clock_rows:
    md += ["## GPU clocks during each timed run (nvidia-smi every 0.5 s, means)", "",
           table(["workload", "format", "SM MHz", "memory MHz", "power W", "temp C", "samples"], clock_rows), ""]
md += ["## Steps", "", table(["step", "rc", "seconds"], steps), ""]
with open(os.path.join(OUT, "summary.md"), "w") as fh:
    fh.write("\n".join(md))
with open(os.path.join(OUT, "summary.json"), "w") as fh:
    json.dump({"criteria": crit, "steps": steps, "total_s": TOTAL, "capacity": cap, "latency": lat,
               "throughput_short": short, "throughput_kv": kv, "e2e": e2e, "gpu_clocks": clock_rows}, fh, indent=1)

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 4, figsize=(18, 4))
    panels = [("KV cache tokens in budget", {r["kv_cache_dtype"]: r["tokens"] for r in cap or []}),
              ("KV-bound output tok/s", {f_: r["output_tok_s"] for f_, r in rows(kv).items()}),
              ("short output tok/s", {f_: r["output_tok_s"] for f_, r in rows(short).items()}),
              (f"decode ms/token at {LATC}" if (LATC := (lat or {}).get("config", {}).get("context")) else "decode ms/token",
               {f_: r["median_ms"] for f_, r in rows(lat).items()})]
    for a, (title, vals) in zip(ax, panels):
        a.bar(list(vals), list(vals.values()), color="#4a78b5")
        a.set_title(title)
        a.tick_params(axis="x", rotation=30)
        for i, v in enumerate(vals.values()):
            a.annotate(f"{v:,.0f}" if v >= 100 else f"{v:.2f}", (i, v), ha="center", va="bottom", fontsize=8)
    cfg = (kv or short or {}).get("config", {})
    fig.suptitle(f"kvpack on {env.get('gpu')}: {cfg.get('model')} {cfg.get('dtype')}, the same KV budget for every format")
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "formats.png"), dpi=110)
except Exception as e:  # the tables matter more than the picture
    print("plot skipped:", e)
print("\n".join(md[:4 + len(crit) + 2]))
EOF
rm -rf "$W"
echo "results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
