python -m pytest -m gpu tests/test_kernels_decode.py tests/test_kernels_prefill.py -k "int4 or group" -n 14 -q > $OUT/gpu_tests_int4.log 2>&1
python _ab/smol_diag.py 2>&1 | grep -v Warn
echo "== old tree"; python _ab/run_old.py _ab/hd_probe.py 2>&1 | grep -v Warn | grep -E "D96|D80"
cp $OUT/hd_probe.json $OUT/hd_probe_old.json
echo "== new tree"; python _ab/hd_probe.py 2>&1 | grep -v Warn
tail -3 $OUT/gpu_tests_int4.log
