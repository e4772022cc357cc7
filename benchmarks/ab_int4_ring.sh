#!/usr/bin/env bash
# int4 decode ("fragt") with whole tiles copied ahead through its cp.async ring (KVPACK_INT4_RING, session 25)
# against its direct loads, in one device call (about 5 minutes on an H200):
#   1. the gpu-marked tests of "fragt" int4: the ring's outputs equal the direct loads' bit for bit;
#   2. bench_attention, bf16 and int4 per layer at #4's Llama-3.1-8B shapes: direct loads, ring distance 1 (also
#      with V converted by channel pairs, KVPACK_INT4_RING_VPAIRS=0, and under 168- and 128-register caps,
#      KVPACK_INT4_RING_MAXNREG), 2, then direct loads again (read at import: one process each; bf16 in every run
#      gives the ratio);
#   3. probe_varlen_decode at the 2 GiB engine's int4 batch (9 sequences of 2304-8704 tokens) and the 16 GiB
#      one (61), ring 0 and 1.
#
#   OUT=results/int4_ring TAR=1 bash benchmarks/ab_int4_ring.sh
#
# TAR=1 packs everything into $OUT/all.tgz (the device returns at most a few files a call).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/int4_ring}
SHAPES=${SHAPES:-llama8b-1x32768,llama8b-8x8192,llama8b-32x4096,llama8b-64x2048,llama8b-128x1024}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >> "$OUT/gpu.txt" 2>&1
python -m pytest -q -m gpu tests/test_kernels_decode.py -k "int4_ring or fragt_int4" -n 12 > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
run() {  # name, then KVPACK_INT4_RING, KVPACK_INT4_RING_MAXNREG, KVPACK_INT4_RING_VPAIRS
  KVPACK_INT4_RING=$2 KVPACK_INT4_RING_MAXNREG=$3 KVPACK_INT4_RING_VPAIRS=$4 python benchmarks/bench_attention.py \
    --rep-ms 20 --formats bf16,int4 --shapes "$SHAPES" --write-tokens "" --no-sdpa --out "$OUT/$1" > "$OUT/$1.log" 2>&1
  echo "$1 rc=$?"
  grep -E "^\| llama8b-[0-9x]+ \| (bf16|int4) \|" "$OUT/$1/bench_attention.md" 2> /dev/null
}
run direct 0 0 1
run ring1 1 0 1
run ring1_vchannels 1 0 0
run ring1_maxnreg168 1 168 1
run ring1_maxnreg128 1 128 1
run ring2 2 0 1
run direct_again 0 0 1
for r in 0 1; do
  KVPACK_INT4_RING=$r KVPACK_INT4_RING_MAXNREG=${VARLEN_MAXNREG:-0} python benchmarks/probe_varlen_decode.py --cases int4:9,int4:61 --splits 0 \
    --out "$OUT/varlen_ring$r.json" > "$OUT/varlen_ring$r.log" 2>&1
  echo "varlen ring $r rc=$?"
  tail -4 "$OUT/varlen_ring$r.log"
done
if [ "${TAR:-0}" = 1 ]; then
  (cd "$OUT" && tar czf all.tgz --remove-files $(ls -A | grep -vx all.tgz))
fi
