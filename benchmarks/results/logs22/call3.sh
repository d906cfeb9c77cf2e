# Session 22, call 3 (H200): the stacked step with the head as numerics.logits_f32 (bf16 operands, named algorithm:
# no f32 copy of the head under SCAN_OPTIONS), against the unrolled default in the same call; the stacked step with
# cuBLASLt for its GEMMs as well; the stacked GPU tests (TF32 ruled out by full-precision products).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
C=int2:1:131072,bf16:1:131072,int2:8:32768
el "stacked gpu tests"; timeout 100 python -m pytest -q --tb=short -m gpu tests/test_stacked.py -p no:cacheprovider 2>&1 | grep -v "^  warnings\|Warning\|^  " | tail -25
el "step default"; timeout 100 python benchmarks/step_ab.py --tag unrolled --jspec-root . --cases $C --profile "" \
  --out $OUT/step_unrolled.json 2>&1 | grep "ms/step"
el "step stacked"; timeout 130 python benchmarks/step_ab.py --tag stacked --jspec-root . --cases $C \
  --scan-layers --profile int2:1:131072 --out $OUT/step_stacked.json 2>&1 | grep -E "ms/step|profile|  ms  "
el "step stacked cublaslt"; timeout 100 python benchmarks/step_ab.py --tag stacked_lt --jspec-root . --cases int2:1:131072,int2:8:32768 \
  --scan-layers --scan-option xla_gpu_enable_cublaslt=true --profile "" --out $OUT/step_stacked_lt.json 2>&1 | grep -E "ms/step"
el done
