# Session 22, call 5 (H200): the 8B + draft program's start-up with stacked layers after the head and window changes
# (cold compile, second-process load, the run), the unrolled default beside it, then every GPU test on this tree.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for s in --scan-layers ""; do el "startup $s"; timeout 110 python benchmarks/startup.py --engine --cases 8b+draft \
  --no-readme --no-job $s --out $OUT/startup${s:+_scan}.json 2>&1 | grep "^| 8b+draft"; done
el "GPU tests"; timeout 290 python -m pytest -q -rf --tb=line -m gpu -p no:cacheprovider tests 2>&1 | tail -6
el done
