#!/usr/bin/env bash
# Does int4's cp.async ring ("fragt", the default on an H200 since session 26) gain from more resident programs?
# Session 26's ncu (results/int4_ring_s26/ncu): 255 registers, 8 one-warp programs an SM, 1.87 warps a scheduler,
# issue slots 50 % busy, DRAM 65 %: latency-bound. A 168-register cap at 1.25x the splits (32 x 4096: 5 splits,
# 1,280 programs) took 64.0 us per layer against 69.5 uncapped at 5 splits, but 54.8 at the plan's 4 splits. Open:
# whether the driver's shared-memory carveout let 10 programs an SM in (one wave) or 9 (a second wave). One device
# call (~3 minutes on an H200):
#   1. ncu (Occupancy, LaunchStats, SpeedOfLight, SchedulerStats) on 32 x 4096: uncapped at 4 splits, 168
#      registers at 4 and at 5 splits;
#   2. bench_attention --tune at 1.125x / 1.25x the plan's splits (8 x 8192: 18 and 20 splits; 32 x 4096: 5),
#      uncapped, at 168 registers with the plan's merge and with the fused merge.
#
#   OUT=results/int4_occupancy TAR=1 bash benchmarks/ab_int4_occupancy.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/int4_occupancy}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
SECTIONS="--section Occupancy --section LaunchStats --section SpeedOfLight --section SchedulerStats"
for spec in 0:4 168:4 168:5; do
  IFS=: read -r reg sp <<< "$spec"
  cap=()
  [ "$reg" != 0 ] && cap=(--maxnreg "$reg")
  timeout 100 ncu --clock-control none $SECTIONS -k regex:fragt --launch-skip 1 --launch-count 1 \
    python benchmarks/profile_decode.py --format int4 --shape llama8b-32x4096 --splits "$sp" "${cap[@]}" \
    > "$OUT/ncu_r${reg}_sp${sp}.txt" 2>&1
  echo "ncu maxnreg=$reg splits=$sp rc=$?"
  grep -E "Duration|Registers Per Thread|Block Limit (Registers|Shared Mem)|Shared Memory Configuration|Waves Per SM|Achieved Active Warps|Issue Slots|Eligible Warps" \
    "$OUT/ncu_r${reg}_sp${sp}.txt"
done
python benchmarks/bench_attention.py --tune --tune-configs fragt-ring1,fragt-ring1-r168,fragt-ring1-r168-fused \
  --formats int4 --shapes llama8b-8x8192,llama8b-32x4096 --tune-splits 0,1.125,1.25 --tune-layers 8 --rep-ms 20 \
  --budget-s 150 --out "$OUT/tune" > "$OUT/tune.log" 2>&1
echo "tune rc=$?"
grep -E "^llama" "$OUT/tune.log"
if [ "${TAR:-0}" = 1 ]; then
  (cd "$OUT" && tar czf all.tgz --remove-files $(ls -A | grep -vx all.tgz))
fi
