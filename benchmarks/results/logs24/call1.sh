# Session 24, calls 1 (a) and 2 (b): session 23's prepared next_call.sh, run as is.
# Prepared in session 23 for the next (not run); about 14 minutes, so two calls (10 minutes each at most).
# `bash next_call.sh a`: the 10 GPU-marked tests not run on session 23's code (test_startup's warm start,
# window_merge's compiled ones, the edited test_fused_norms_on_gpu); the 8B-shaped INT2 + 0.6B-shaped draft program's
# cold compile and run with the fused norms (pallas/add_norm.py: each shape a Triton compile) and without
# (--xla-norms), stacked and unrolled.
# `bash next_call.sh b`: the unrolled step, the stacked one, and the stacked one with its GEMMs split as XLA's Triton
# ones are unrolled (model.SPLIT_K, step_ab --split-k), each with a B 8 profile (per HLO op now: which GEMM loses);
# then session 22's autotuning refresh, which re-runs the README command's program cold on the merged pack.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
if [ "$1" != b ]; then
  el "gpu tests"; timeout 150 python -m pytest -q --tb=short -m gpu tests/test_add_norm.py tests/test_startup.py \
    tests/test_window_merge.py -p no:cacheprovider 2>&1 | grep -v "^  warnings\|Warning\|^  " | tail -12
  for s in --scan-layers ""; do for n in "" --xla-norms; do
    el "startup $s $n"; timeout 130 python benchmarks/startup.py --engine --cases 8b+draft --no-readme --no-job \
      --rerun $s $n --out $OUT/startup${s:+_scan}${n:+_xla}.json 2>&1 | grep "^| 8b+draft"
  done; done
fi
[ "$1" = a ] && exit
C=int2:1:131072,int2:8:32768,bf16:1:131072
el "step unrolled"; timeout 130 python benchmarks/step_ab.py --tag unrolled --jspec-root . --cases $C \
  --profile int2:8:32768 --out $OUT/step_unrolled.json 2>&1 | grep "ms/step"
for k in "" --split-k; do
  el "step stacked $k"; timeout 100 python benchmarks/step_ab.py --tag stacked${k:+_split} --jspec-root . --cases $C \
    --scan-layers $k --profile int2:8:32768 --out $OUT/step_stacked${k:+_split}.json 2>&1 | grep "ms/step"
done
el "autotune refresh"; timeout 200 python benchmarks/results/logs22/autotune_refresh.py --out $OUT 2>&1 | grep -v "^ *{"
el done
