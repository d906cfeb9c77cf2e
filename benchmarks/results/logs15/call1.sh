# Session 15, call 1 (prepared in session 14 as logs14/next_call.sh).
# Issue 16 item 3: each residual add and the RMSNorm after it as one Pallas kernel (pallas/add_norm.py,
# model.FUSED_ADD_NORM, opt-in) against XLA's three kernels, per 8B step; its GPU tests first. Prediction
# (NOTES.md session 14): -4 kernels per layer (811 -> ~683 per step), about -0.15 ms per step at B 1 (BF16 as
# well); if it pays, turn it on by default (then re-measure the README command cold: the shipped autotuning
# results are keyed by each fusion's HLO, and these kernels replace fusions around the GEMMs).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "add_norm GPU tests"
timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_add_norm.py 2>&1 | tail -3
el "step: XLA's add and norm"
timeout 110 python benchmarks/step_ab.py --tag xla --cases int2:1:131072,bf16:1:131072,int2:8:32768,int2:1:1048576 \
  --profile "" --out $OUT/step_xla.json 2>&1 | grep -v "^{" | tail -6
el "step: fused add and norm (profiled)"
timeout 130 python benchmarks/step_ab.py --tag fused --fused-add-norm \
  --cases int2:1:131072,bf16:1:131072,int2:8:32768,int2:1:1048576 --profile int2:1:131072 \
  --out $OUT/step_fused.json 2>&1 | grep -v "^{" | tail -24
rm -rf $OUT/step_fused_profile
el done
