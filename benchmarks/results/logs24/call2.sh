# Session 24, call 2: session 22's autotuning refresh (its Namespace mended: xla_norms), then the README command
# cold and warm (startup.py, shipped case only).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "autotune refresh"; timeout 330 python benchmarks/results/logs22/autotune_refresh.py --out $OUT 2>&1 | grep -v "^ *{"
el "startup shipped + README"; timeout 200 python benchmarks/startup.py --engine --cases shipped --no-job \
  --out $OUT/startup_shipped.json 2>&1 | grep "^|"
el done
