# Session 25, call 1: `bash call1.sh b` (session 24's next_call.sh, copied; its `b` ran)
# Prepared in session 24 for the next (not run). Issue 14, the 8B + draft program (startup.py --engine --rerun, each
# run a cold process then a warm one; compile times differ ~2x between hosts: compare only within the call):
# `a` (~6 min): the default (unrolled) program with the merged autotuning pack (session 24: 22 of its fusions had
#   changed since their results were made), twice; the draft alone stacked (--scan-draft: the target unrolled, the
#   program under model.SCAN_OPTIONS, so the target's GEMMs are cuBLAS: compile and rounds against the default); all
#   stacked, for the host's pace.
# `b` (~4 min): where the default program's cold compile goes now (--phases: XLA's host events; the trace-lower-
#   compile path, not Engine.compile); issue 16: the decode kernel at B 1 / 128K (1.04 ms, 55% of copy, the step's
#   largest item above its floor) over its grid: one wave of 49 splits per KV head (the default), 16 (one CTA per
#   SM), 33 (two), 98 and 147 (two and three waves); two more INT2 / BF16 pairs at B 1 / 128K.
# `c` (~6 min): the stacked layers' GEMMs as a Mosaic GPU kernel with TMA (mosaic_gemm_probe.py: agreement with XLA,
#   32 layers per weight and tiling against cuBLAS in the loop, then the probe layer unrolled / scanned with cuBLAS /
#   scanned with the kernel; XLA's Triton GEMMs unrolled read at 3.6-4.3 TB/s in session 24's call 3: the mark).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
case "$1" in
a)
  for s in "" "" --scan-draft --scan-layers; do
    el "startup $s"; timeout 130 python benchmarks/startup.py --engine --rerun --cases 8b+draft --no-readme --no-job \
      $s --out $OUT/startup_$(date +%s)${s:+_${s#--}}.json 2>&1 | grep "^| 8b+draft"
  done ;;
b)
  el "phases"; timeout 120 python benchmarks/startup.py --phases --cases 8b+draft --no-readme --no-job \
    --out $OUT/startup_phases.json 2>&1 | grep "^| 8b+draft"
  el "kernel splits at B 1 / 128K"; timeout 90 python benchmarks/kernel_diag.py --trace --budget-s 75 \
    --points 1:131072:1 --variants base,num_splits=16,num_splits=33,num_splits=98,num_splits=147 --out $OUT 2>&1 | \
    grep "^B=\|^copy "
  for i in 1 2; do
    el "step $i"; timeout 60 python benchmarks/step_ab.py --tag default$i --jspec-root . \
      --cases int2:1:131072,bf16:1:131072 --profile "" --out $OUT/step$i.json 2>&1 | grep "ms/step"
  done ;;
c)
  el "mosaic gemm"; timeout 450 python benchmarks/results/logs24/mosaic_gemm_probe.py --out $OUT 2>&1 | \
    grep -v Warning | tail -40 ;;
*) echo "usage: bash next_call.sh a|b|c"; exit 2 ;;
esac
el done
