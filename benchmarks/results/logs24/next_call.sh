# Prepared in session 24 for the next (not run; about 6 minutes). Issue 14: the default (unrolled) 8B + draft
# program's cold compile with the merged autotuning pack (session 24 committed it: 22 of the program's fusions had
# changed since their results were made), in two fresh processes, and the stacked one for the host's pace (compile
# times differ ~2x between hosts: compare only within the call). Issue 16: two more INT2 / BF16 pairs at B 1 / 128K.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for s in "" "" --scan-layers; do
  el "startup $s"; timeout 120 python benchmarks/startup.py --engine --cases 8b+draft --no-readme --no-job $s \
    --out $OUT/startup_$(date +%s)${s:+_scan}.json 2>&1 | grep "^| 8b+draft"
done
for i in 1 2; do
  el "step $i"; timeout 60 python benchmarks/step_ab.py --tag default$i --jspec-root . \
    --cases int2:1:131072,bf16:1:131072 --profile "" --out $OUT/step$i.json 2>&1 | grep "ms/step"
done
el done
