# Session 25, call 4 (issue 14): the Mosaic kernel primed before the two parts compile (mosaic_keys.prime in
# programs.compile_all). Call 3's phases: one "Compile" (jaxlib's Mosaic kernel build) of 16.2 s in the rounds
# part, waiting on LLVM's options lock while the prefill part was in its LLVM stage; 0.5 s in call 1.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "gpu tests"; timeout 200 python -m pytest -q -x -p no:xdist tests/test_int2_mosaic.py -k "prime or lowered_kernel" 2>&1 | tail -3
el "phases"; timeout 150 python benchmarks/startup.py --phases --cases 8b+draft --no-readme --no-job \
  --out $OUT/startup_phases.json 2>&1 | grep "^| 8b+draft"
python -c "
import json; d = json.load(open('$OUT/startup_phases.json'))
for r in d['cases'][0]['phases'][:16]: print(r)"
for i in 1 2; do
  el "engine $i"; timeout 130 python benchmarks/startup.py --engine --rerun --cases 8b+draft --no-readme --no-job \
    --out $OUT/startup_engine$i.json 2>&1 | grep "^| 8b+draft"
done
el "README command"; timeout 150 python benchmarks/startup.py --engine --cases shipped --no-job \
  --out $OUT/startup_readme.json 2>&1 | grep "^| "
el done
