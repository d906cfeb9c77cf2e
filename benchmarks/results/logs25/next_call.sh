# Prepared in session 25 for the next (not run). `bash next_call.sh a|b|c|d`:
# `a` (~6 min), issue 14: the draft's prefill as a third part (the default since d2ab588) against the two parts
#   (--two-parts), alternated on one host, Engine.compile cold with a second run (rerun_s: the run must not slow);
#   then the per-part compiles (--phases, trace-lower-compile path) and what XLA's one-thread IR emission spends.
# `d` (~6 min), issue 14: the fused commit as a kernel per 8 layers (kvcache.COMMIT_GROUP = 8: lowered and compiled
#   once, 4 launches; its lowering took 0.53-0.69 s of each part's ~0.9 s on the CPU, lower_probe.log) against the
#   one kernel: the INT2 step at B 1 / 128K and B 8 / 32K alternated (its launches cost: session 18 measured 32 of
#   them at 0.174 ms against 0.017 ms for one), then the 8B + draft cold compile with each.
# `b` (~5 min): the GPU tests on this code, the first half (every file but test_window_merge.py, test_startup.py,
#   test_add_norm.py, test_stacked.py); `c` (~4 min) the second half, then the README command.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
LATE="tests/test_window_merge.py tests/test_startup.py tests/test_add_norm.py tests/test_stacked.py"
case "$1" in
a)
  for s in --two-parts "" --two-parts ""; do
    el "engine $s"; timeout 110 python benchmarks/startup.py --engine --rerun --cases 8b+draft --no-readme --no-job $s \
      --out $OUT/startup_engine_$(date +%s)${s:+_twoparts}.json 2>&1 | grep "^| 8b+draft | cold"
  done
  el "phases"; timeout 120 python benchmarks/startup.py --phases --cases 8b+draft --no-readme --no-job \
    --out $OUT/startup_phases.json 2>&1 | grep "^| 8b+draft"
  python -c "
import json; d = json.load(open('$OUT/startup_phases.json'))
for r in d['cases'][0]['phases'][:12]: print(r)
print('inside CompileModuleToLlvmIr:')
for r in d['cases'][0]['llvm_ir']: print(r)" ;;
d)
  for g in "" 8 "" 8; do
    el "step commit group ${g:-all}"; timeout 80 python benchmarks/step_ab.py --tag "group${g:-all}" --jspec-root . \
      --cases int2:1:131072,int2:8:32768 --profile "" ${g:+--commit-group $g} --out $OUT/step_group${g:-all}_$(date +%s).json \
      2>&1 | grep "ms/step"
  done
  for g in 0 8; do
    el "engine commit group $g"; timeout 110 python benchmarks/startup.py --engine --cases 8b+draft --no-readme \
      --no-job --commit-group $g --out $OUT/startup_group$g.json 2>&1 | grep "^| 8b+draft | cold"
  done ;;
b)
  el "gpu tests, first half"; timeout 400 python -m pytest -q --tb=short -m gpu -p no:cacheprovider \
    $(for f in $LATE; do echo --ignore=$f; done) 2>&1 | grep -v "^  warnings\|Warning\|^  " | tail -12 ;;
c)
  el "gpu tests, second half"; timeout 300 python -m pytest -q --tb=short -m gpu -p no:cacheprovider $LATE 2>&1 | \
    grep -v "^  warnings\|Warning\|^  " | tail -12
  el "README command"; timeout 120 python benchmarks/startup.py --engine --cases shipped --no-job \
    --out $OUT/startup_readme.json 2>&1 | grep "^| " ;;
*) echo "usage: bash next_call.sh a|b|c|d"; exit 2 ;;
esac
el done
