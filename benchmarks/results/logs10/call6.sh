# Session 10 (retry), call 6. Issue 16: splits rounded down for the wgmma body only (verification), against
# the old rule, at more batches (call 5: 1.31x at B 8 / 32K verifying; decode mixed, kept rounded up); the
# decode point checks that its rule is unchanged. Then every GPU-marked test of the suite.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "verify splits A/B"
PYTHONPATH=.:benchmarks timeout 150 python benchmarks/kernel_diag.py --trace --budget-s 130 --out $OUT/verify \
  --variants base,num_splits=ceil --points 8:32768:5,1:131072:5,4:32768:5,8:131072:5,16:32768:5,32:32768:5,64:32768:5,8:32768:1 \
  2>&1 | grep -v '^{' | tail -17
el "all GPU tests"
timeout 330 python -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -4
el done
