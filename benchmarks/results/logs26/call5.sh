# Session 26, call 5 (issue 14): programs kept with XLA's thunks (programs.STORE_OPTIONS) against the legacy form
# (--legacy-aot), whose reading process emits the thunks again: the GPU tests of the store; the 8B + draft program
# Engine.compile cold then in a second process (warm: read from the store), alternated; the README command.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "store tests"; timeout 60 python -m pytest -q --tb=short -m gpu -p no:cacheprovider tests/test_startup.py \
  -k "warm_start_loads or program_keys" 2>&1 | tail -1
for s in "" --legacy-aot; do
  el "engine ${s:-thunks}"; timeout 80 python benchmarks/startup.py --engine --rerun --cases 8b+draft --no-readme \
    --no-job $s --out $OUT/engine_aot${s:+_legacy}.json 2>&1 | grep "^| 8b+draft"
done
el "README command"; timeout 60 python benchmarks/startup.py --engine --cases shipped --no-job \
  --out $OUT/startup_readme_aot.json 2>&1 | grep "^| README"
left=$(( 290 - $(date +%s) + t0 ))
el "engine thunks again (${left}s left)"; [ $left -gt 50 ] && timeout $left python benchmarks/startup.py --engine \
  --rerun --cases 8b+draft --no-readme --no-job --out $OUT/engine_aot2.json 2>&1 | grep "^| 8b+draft"
el done
