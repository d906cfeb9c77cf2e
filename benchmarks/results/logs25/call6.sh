# Session 25, call 6 (issue 14): the 8B + draft cold compile through Engine.compile (the CLI's compile_s: trace,
# lower and compile) with the Mosaic kernel primed and not (--no-prime: compiled inside the rounds part, as before),
# alternated on one host.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for s in --no-prime "" --no-prime ""; do
  el "engine $s"; timeout 110 python benchmarks/startup.py --engine --cases 8b+draft --no-readme --no-job $s \
    --out $OUT/startup_engine_$(date +%s)${s:+_noprime}.json 2>&1 | grep "^| 8b+draft | cold"
done
el done
