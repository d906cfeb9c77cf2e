# Prepared in session 11 for the next device call (not run): where the cold README command's 30-34 s go
# (issue 14's 15 s goal), program by program, and the shipped program's compile phases.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "README command cold then warm, per-program trace / lower / compile (JAX_LOG_COMPILES)"
timeout 200 python benchmarks/results/logs11/cold_census.py --out $OUT/cold_census.json 2>&1 | tail -24
el "shipped pair's generate program: compile phases, cold and warm"
timeout 150 python benchmarks/startup.py --phases --no-readme --cases shipped --budget 140 \
  --out $OUT/startup_shipped.json 2>&1 | tail -4
el done
