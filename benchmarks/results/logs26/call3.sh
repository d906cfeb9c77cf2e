# Session 26, call 3, on the tree with kvcache.COMMIT_GROUP = 8 the default: the GPU test fixed after call 2; the
# README command cold and warm; (issue 16) INT2 / BF16 at B 1 / 128K; the first half of the GPU tests (every file
# but call 2's four); then (issue 14) the 8B + draft compile's phases (startup.py --phases).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
lscpu | grep -m1 "Model name"
el "fixed test"; timeout 100 python -m pytest -q --tb=short -m gpu -p no:cacheprovider tests/test_startup.py \
  -k warm_start_loads 2>&1 | tail -1
el "README command"; timeout 100 python benchmarks/startup.py --engine --cases shipped --no-job \
  --out $OUT/startup_readme.json 2>&1 | grep "^| "
el "int2 / bf16"; timeout 80 python benchmarks/step_ab.py --tag rest --jspec-root . \
  --cases int2:1:131072,bf16:1:131072 --profile "" --out $OUT/step_rest.json 2>&1 | grep "ms/step"
LATE="tests/test_window_merge.py tests/test_startup.py tests/test_add_norm.py tests/test_stacked.py"
el "gpu tests, first half"; timeout 330 python -m pytest -q --tb=short -m gpu -p no:cacheprovider \
  $(for f in $LATE; do echo --ignore=$f; done) 2>&1 | grep -v "^  warnings\|Warning\|^  " | tail -12
left=$(( 560 - $(date +%s) + t0 ))
el "phases (${left}s left)"; [ $left -gt 40 ] && timeout $left python benchmarks/startup.py --phases --cases 8b+draft \
  --no-readme --no-job --out $OUT/startup_phases.json 2>&1 | grep "^| 8b+draft"
[ -f $OUT/startup_phases.json ] && python -c "
import json; d = json.load(open('$OUT/startup_phases.json'))
for r in d['cases'][0]['phases'][:10]: print(r)
print('inside CompileModuleToLlvmIr:')
for r in d['cases'][0].get('llvm_ir', [])[:10]: print(r)"
el done
