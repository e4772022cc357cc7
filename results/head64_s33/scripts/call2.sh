# session 33, device call 2: the default plan (no register cap) at the other head-dim-64 shapes, with split counts
cd "$(dirname "$0")/../../.."
run() { NAME=$1 SHAPES=$2 SPLITS=$3 timeout $4 python results/head64_s33/scripts/h64_ab.py > $OUT/$1.log 2>&1; grep -v '^{' $OUT/$1.log | tail -3; }
run h64_smol2 smollm2-32x4096,llama1b-32x4096 "" 150
run h64_long smollm2-1x32768,llama1b-8x8192 "64,96,128" 200
run h64_8x smollm2-8x8192 "16,24,48" 120
