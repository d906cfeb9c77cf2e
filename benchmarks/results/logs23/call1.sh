# Session 23, call 1 (H200). Issue 14: the stacked step with the residual adds kept out of cuBLAS's beta = 1
# (model.residual_add: no memcpy32_post) and k, v as one scan output (one store per layer): this tree stacked
# against session 22's (.base/jspec, HEAD 6d1f0b1, carried) and the unrolled default, one call. Then session 22's
# prepared question (its next_call.sh): is the stacked 8B + draft run's 1.27x a first-run cost? startup.py --rerun,
# both layouts. (The two cuts measured no step change and were taken out after this call: not in the commit.)
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
C=int2:1:131072,int2:8:32768
el "step unrolled"; timeout 100 python benchmarks/step_ab.py --tag unrolled --jspec-root . --cases $C,bf16:1:131072 \
  --profile "" --out $OUT/step_unrolled.json 2>&1 | grep "ms/step"
el "step stacked, session 22"; PYTHONPATH=.base:benchmarks timeout 80 python benchmarks/step_ab.py --tag stacked_s22 --jspec-root .base --cases $C \
  --scan-layers --profile "" --out $OUT/step_stacked_s22.json 2>&1 | grep "ms/step"
el "step stacked"; timeout 110 python benchmarks/step_ab.py --tag stacked --jspec-root . --cases $C \
  --scan-layers --profile int2:8:32768,int2:1:131072 --out $OUT/step_stacked.json 2>&1 | grep -E "ms/step|profile"
for s in --scan-layers ""; do el "startup $s"; timeout 130 python benchmarks/startup.py --engine --cases 8b+draft \
  --no-readme --no-job --rerun $s --out $OUT/startup${s:+_scan}.json 2>&1 | grep "^| 8b+draft"; done
el done
