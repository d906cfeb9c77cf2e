# Session 26, call 2: (issue 16) the INT2 step at B 1 / 128K and B 8 / 32K with the rounds' fused commit as one
# kernel (default) against a kernel per 8 layers (--commit-group 8), separate processes alternated; then (issue 14)
# the second half of the GPU tests on this code.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for g in "" 8 8 ""; do
  el "step commit group ${g:-all}"; timeout 80 python benchmarks/step_ab.py --tag "group${g:-all}" --jspec-root . \
    --cases int2:1:131072,int2:8:32768 --profile "" ${g:+--commit-group $g} --out $OUT/step_group${g:-all}_$(date +%s).json \
    2>&1 | grep "ms/step"
done
LATE="tests/test_window_merge.py tests/test_startup.py tests/test_add_norm.py tests/test_stacked.py"
el "gpu tests, second half"; timeout 300 python -m pytest -q --tb=short -m gpu -p no:cacheprovider $LATE 2>&1 | \
  grep -v "^  warnings\|Warning\|^  " | tail -12
el done
