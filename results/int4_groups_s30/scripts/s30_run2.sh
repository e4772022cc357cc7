set -x
mkdir -p $OUT/attn2
python -m pytest -m gpu tests/test_kernels_decode.py tests/test_kernels_prefill.py -k "int4 or group" -n 14 -q 2>&1 | tail -4
python benchmarks/bench_attention.py --shapes smollm2-32x4096,llama8b-8x8192,llama8b-32x4096 --formats bf16,int4,int4-g64,int4-g128 --check --no-sdpa --rep-ms 20 --write-tokens "" --out $OUT/attn2 > $OUT/attn2/log.txt 2>&1
grep -E "^\| (smollm2|llama8b)" $OUT/attn2/bench_attention.md
for tree in old new; do
  for hd in "9 3 64" "32 8 128"; do
    set -- $hd
    if [ $tree = old ]; then r="python _ab/run_old.py"; else r="python"; fi
    $r benchmarks/bench_prefill.py --formats bfloat16,int4,int4-g64,int4-g128 --num-heads $1 --num-kv-heads $2 --head-dim $3 --prefixes 0,8192 --rep-ms 50 --out $OUT/prefill_${tree}_$3 2>&1 | grep -E "^prefix"
  done
done
python _ab/hd_probe.py 2>&1 | grep -v Warning
