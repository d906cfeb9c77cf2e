# Session 10 (retry), call 5. Issue 16: the Mosaic kernel's splits rounded down (one wave of CTAs) against
# the old rule (rounded up: at B = 8, 576 CTAs = a wave and a tail), kernel time from a trace; the GPU tests
# of the default-split paths. Issue 14: the README command's failure under JAX_EXPLAIN_CACHE_MISSES (call 4)
# with its traceback; start-up with the compile's host events traced, a cache hit included; README warm x3.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "kernel splits A/B"
PYTHONPATH=.:benchmarks timeout 150 python benchmarks/kernel_diag.py --trace --budget-s 130 --out $OUT/splits \
  --variants base,num_splits=ceil --points 8:32768:1,8:131072:1,4:32768:1,16:32768:1,1:131072:1,64:32768:1,8:32768:5 \
  2>&1 | grep -v '^{' | tail -16
el "gpu tests, default splits"
timeout 100 python -m pytest -q -m gpu tests/test_int2_mosaic.py -k "interior or split_path or unmerged" -p no:cacheprovider 2>&1 | tail -2
el "README under JAX_EXPLAIN_CACHE_MISSES=1, traceback"
JAX_EXPLAIN_CACHE_MISSES=1 timeout 100 python benchmarks/results/logs10/readme_traceback.py --compile-cache /tmp/tb 2>&1 \
  | grep -v "TRACING CACHE MISS\|^  \|^    " | tail -30
el "startup with phases (cold and warm)"
timeout 200 python benchmarks/startup.py --phases --budget 180 --no-job --cases 8b+draft --out $OUT/startup_phases_s10.json 2>&1 | grep -v "^{'case'"
el "README command: cold, then warm x3"
for i in cold w1 w2 w3; do s=$(date +%s.%N); timeout 100 python -m jspec.generate "def fibonacci(n):" --compile-cache /tmp/rc \
  > $OUT/readme_$i.txt 2>&1; echo "$i rc=$? wall=$(python -c "print(round($(date +%s.%N) - $s, 2))") $(tail -1 $OUT/readme_$i.txt | grep -o 'compile [0-9.]*s')"; done
el done
