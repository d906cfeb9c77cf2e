# Session 25, call 5 (issue 14): call 4's prime compiled nothing (its bind passed the lowering's extra params to
# the primitive, an error it swallowed) and ran beside the parts; now prime binds the primitive's own params and
# runs before the parts compile (programs.compile_all).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "gpu tests"; timeout 200 python -m pytest -q --tb=short -p no:cacheprovider tests/test_int2_mosaic.py \
  -k "prime or lowered_kernel" 2>&1 | grep -v "Warning\|^  " | tail -8
el "phases"; timeout 150 python benchmarks/startup.py --phases --cases 8b+draft --no-readme --no-job \
  --out $OUT/startup_phases.json 2>&1 | grep "^| 8b+draft"
python -c "
import json; d = json.load(open('$OUT/startup_phases.json'))
for r in d['cases'][0]['phases'][:14]: print(r)"
el "engine"; timeout 130 python benchmarks/startup.py --engine --rerun --cases 8b+draft --no-readme --no-job \
  --out $OUT/startup_engine.json 2>&1 | grep "^| 8b+draft"
el "README command"; timeout 150 python benchmarks/startup.py --engine --cases shipped --no-job \
  --out $OUT/startup_readme.json 2>&1 | grep "^| "
el done
