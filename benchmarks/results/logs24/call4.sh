# Session 24, call 4: the stacked step with wqkv and wo in the Pallas kernel (model.STACKED_GEMMS) against the same
# with all GEMMs cuBLAS (--xla-gemms) and the unrolled step, one process each; the kernel's GPU tests.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "gpu tests"; timeout 120 python -m pytest -q --tb=short -m gpu tests/test_stacked_matmul.py tests/test_stacked.py \
  -p no:cacheprovider 2>&1 | tail -3
C=int2:1:131072,int2:8:32768,bf16:1:131072
for k in "" --xla-gemms; do
  el "step stacked $k"; timeout 100 python benchmarks/step_ab.py --tag stacked${k:+_xla} --jspec-root . --cases $C \
    --scan-layers $k --profile "" --out $OUT/step_stacked${k:+_xla}.json 2>&1 | grep "ms/step\|Error"
done
el "step unrolled"; timeout 130 python benchmarks/step_ab.py --tag unrolled --jspec-root . --cases $C \
  --profile "" --out $OUT/step_unrolled.json 2>&1 | grep "ms/step\|Error"
el done
