# Session 14, device call 2. Issue 16: the kernel alone (trace) at B 1 / 1M and B 4 / 1M with other split counts
# (the default 66 per KV head at B 1 is one wave of 528 CTAs: 4 per SM), at B 1 / 128K and 8 / 128K, and verifying
# 5 positions with more splits. Issue 14: the 8B + draft program cold with its autotuning results shipped.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "kernel alone, 1M"
timeout 130 python benchmarks/kernel_diag.py --trace --budget-s 110 --out $OUT/k1m \
  --variants base,num_splits=33,num_splits=99,num_splits=132,num_splits=198,num_splits=264 \
  --points 1:1048576:1,4:1048576:1 2>&1 | grep -v "^{" | tail -14
el "kernel alone, 128K and verify"
timeout 100 python benchmarks/kernel_diag.py --trace --budget-s 80 --out $OUT/k128 \
  --variants base,num_splits=22,num_splits=33,num_splits=44,num_splits=4,num_splits=17,num_splits=2 \
  --points 1:131072:1,8:131072:1,64:32768:5 2>&1 | grep -v "^{" | tail -24
el "8B + draft, autotuning results shipped"
timeout 300 python benchmarks/results/logs14/autotune_8b.py --out $OUT 2>&1 | tail -12
el done
