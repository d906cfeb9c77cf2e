# Prepared in session 23 for the next (not run). The 10 GPU-marked tests not run on session 23's code (test_startup's
# warm start, window_merge's compiled ones, the edited test_fused_norms_on_gpu); the 8B-shaped INT2 + 0.6B-shaped
# draft program's cold compile and run with the fused norms (pallas/add_norm.py: each shape a Triton compile) and
# without (--xla-norms), stacked and unrolled; then session 22's autotuning refresh, which re-runs the README command's
# program cold on the merged pack. About 9 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "gpu tests"; timeout 150 python -m pytest -q --tb=short -m gpu tests/test_add_norm.py tests/test_startup.py \
  tests/test_window_merge.py -p no:cacheprovider 2>&1 | grep -v "^  warnings\|Warning\|^  " | tail -12
for s in --scan-layers ""; do for n in "" --xla-norms; do el "startup $s $n"; timeout 130 python benchmarks/startup.py \
  --engine --cases 8b+draft --no-readme --no-job --rerun $s $n --out $OUT/startup${s:+_scan}${n:+_xla}.json 2>&1 \
  | grep "^| 8b+draft"; done; done
el "autotune refresh"; timeout 200 python benchmarks/results/logs22/autotune_refresh.py --out $OUT 2>&1 | grep -v "^ *{"
el done
