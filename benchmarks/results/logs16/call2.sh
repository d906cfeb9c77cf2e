# Session 16, device call 2. Issue 16: late_values on by default for decode's lean8 body (call 1: kernel
# 1.02-1.03x at five points): every GPU test, then the 8B step of this tree against --early-values (the old
# default) in separate processes of this call, and BF16 at B 1 / 128K for the ratio.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "all GPU tests"
timeout 260 python -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -2
CASES=int2:1:131072,int2:8:32768,int2:1:1048576
el "step, late values (default)"
timeout 120 python benchmarks/step_ab.py --tag late --cases $CASES,bf16:1:131072 --profile "" \
  --out $OUT/step_late.json 2>&1 | grep -v "^{" | tail -6
el "step, early values"
timeout 100 python benchmarks/step_ab.py --tag early --early-values --cases $CASES --profile "" \
  --out $OUT/step_early.json 2>&1 | grep -v "^{" | tail -5
el done
