# Session 15, device call 5. Issue 16: the per-warp bodies' ring at 4 stages (int2_mosaic.WARP_STAGES, was 3):
# the Mosaic kernel's GPU tests, then the 8B step at the goal points (and BF16 at B 1 / 128K for the ratio).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "Mosaic kernel GPU tests"
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_int2_mosaic.py 2>&1 | tail -2
el "step, 4 stages"
timeout 120 python benchmarks/step_ab.py --tag stages4 --cases int2:1:131072,bf16:1:131072,int2:8:32768,int2:1:1048576 \
  --profile "" --out $OUT/step_stages4.json 2>&1 | grep -v "^{" | tail -6
el "step, 3 stages (as before)"
timeout 90 python benchmarks/step_ab.py --tag stages3 --warp-stages 3 --cases int2:1:131072,int2:8:32768,int2:1:1048576 \
  --profile "" --out $OUT/step_stages3.json 2>&1 | grep -v "^{" | tail -5
el done
