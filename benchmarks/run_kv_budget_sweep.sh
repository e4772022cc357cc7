#!/usr/bin/env bash
# The KV-bound workload at several KV budgets: how much of each format's capacity turns into output
# tokens/s as the KV budget tightens (results/kv_budget_s23). Each (budget, workload, format) is its
# own `kvpack bench throughput` process under its own time cap, so a cap loses that run only. On the
# device, one call of at most 10 minutes holds a few runs (measured on an H200, 256 requests of 2048 in
# / 512 out: 2 GiB bf16 141 s, int8 107 s, int4 88-108 s; 16 GiB 44-57 s each, engine start included).
#
#   OUT=results/kv_budget bash benchmarks/run_kv_budget_sweep.sh 2GiB:2048:512:bfloat16:290 2GiB:2048:512:int4:110:128
#   python benchmarks/plot_kv_budget.py results/kv_budget      # table (markdown) and plot of every run there
#
# A run: BUDGET:IN:OUT:FORMAT:CAP_SECONDS[:INT4_GROUP]; IN:OUT = U:U is the issue's mixed workload
# (inputs uniform in 2048..8192, outputs in 256..512). Knobs: MODEL (dummy:llama-3.1-8b), REQUESTS (256),
# WATERMARK (the engine's admission watermark, default 0.01; set, it tags the files _wm<value>),
# TAR=1 packs everything into $OUT/all.tgz (the device returns at most a few files a call).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/kv_budget}
MODEL=${MODEL:-dummy:llama-3.1-8b}
REQUESTS=${REQUESTS:-256}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >> "$OUT/gpu.txt" 2>&1
SAMP=
if command -v nvidia-smi > /dev/null; then  # clocks and power, once a second, to compare runs that ran apart
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader,nounits \
    -lms 1000 > "$OUT/clocks.csv" 2> /dev/null &
  SAMP=$!
  trap 'kill "$SAMP" 2> /dev/null' EXIT
fi
T0=$(date +%s)
for spec in "$@"; do
  IFS=: read -r budget in out fmt cap group <<< "$spec"
  tag=${budget}_${in}_${out}_${fmt}${group:+_g$group}${WATERMARK:+_wm$WATERMARK}
  [ "$in" = U ] && in=2048:8192 && out=256:512
  s=$(date +%s)
  timeout --signal=INT --kill-after=10 "$cap" python -m kvpack bench throughput --model "$MODEL" --dtype bfloat16 \
    --num-prompts "$REQUESTS" --input-len "$in" --output-len "$out" --kv-cache-memory "$budget" \
    --kv-cache-dtype "$fmt" ${group:+--int4-group-size "$group"} ${WATERMARK:+--watermark "$WATERMARK"} \
    --output-json "$OUT/$tag.json" --step-log "$OUT/steps_$tag" > "$OUT/$tag.log" 2>&1
  echo "$tag rc=$? $(( $(date +%s) - s ))s (total $(( $(date +%s) - T0 ))s)"
  tr '\r' '\n' < "$OUT/$tag.log" | grep -E "output tok/s,|GPU KV cache size" | tail -2
done
python benchmarks/summarize_step_log.py "$OUT"/steps_*.tsv > "$OUT/steps_summary.txt" 2>&1
grep -v "^  decode->none" "$OUT/steps_summary.txt"
if [ "${TAR:-0}" = 1 ]; then
  [ -n "$SAMP" ] && kill "$SAMP" 2> /dev/null
  (cd "$OUT" && tar czf all.tgz --remove-files ./*.json ./*.log ./*.tsv ./*.txt ./*.csv)
fi
