# Session 23, call 4 (H200): the residual add and RMS norm in one Pallas kernel (pallas/add_norm.py, model.
# add_rms_norm), where XLA runs three kernels per norm. Its GPU tests; then the step with and without it
# (step_ab --xla-norms), unrolled (both KV modes at B 1 / 128K, INT2 at B 8 / 32K) and stacked, each pair in one call.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "gpu tests"; timeout 100 python -m pytest -q --tb=short -m gpu tests/test_add_norm.py -p no:cacheprovider 2>&1 | grep -v "^  warnings\|Warning\|^  " | tail -12
C=int2:1:131072,bf16:1:131072,int2:8:32768
el "step unrolled, XLA norms"; timeout 100 python benchmarks/step_ab.py --tag unrolled_xla --jspec-root . --cases $C \
  --xla-norms --profile "" --out $OUT/step_unrolled_xla.json 2>&1 | grep "ms/step"
el "step unrolled, fused norms"; timeout 120 python benchmarks/step_ab.py --tag unrolled_fused --jspec-root . --cases $C \
  --profile int2:1:131072 --out $OUT/step_unrolled_fused.json 2>&1 | grep -E "ms/step|profile"
el "step stacked, XLA norms"; timeout 80 python benchmarks/step_ab.py --tag stacked_xla --jspec-root . --cases $C \
  --scan-layers --xla-norms --profile "" --out $OUT/step_stacked_xla.json 2>&1 | grep "ms/step"
el "step stacked, fused norms"; timeout 80 python benchmarks/step_ab.py --tag stacked_fused --jspec-root . --cases $C \
  --scan-layers --profile "" --out $OUT/step_stacked_fused.json 2>&1 | grep "ms/step"
el done
