# Session 14, device call 4. Issue 16: decode's grid aimed at 792 (1.5 waves) or 1584 CTAs against the default
# 1056 (two waves): the kernel alone, then the 8B step at 1M (B 1 and 4) with 1056 and 792.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "kernel alone: DECODE_TARGET 1056 (base) vs 792 vs 1584"
timeout 90 python benchmarks/kernel_diag.py --trace --budget-s 75 --out $OUT/kd --variants base,num_splits=t792,num_splits=t1584 \
  --points 1:1048576:1,4:1048576:1,8:131072:1,16:32768:1 2>&1 | grep -v "^{" | tail -14
for t in 1056 792; do
  el "step, DECODE_TARGET $t"
  timeout 100 python benchmarks/step_ab.py --tag target$t --decode-target $t --cases int2:1:1048576,int2:4:1048576,int2:8:131072 \
    --profile "" --out $OUT/step_$t.json 2>&1 | grep -v "^{" | tail -5
done
el done
