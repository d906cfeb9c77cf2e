# Prepared in session 22 for the next (not run): is the stacked 8B + draft run's 1.27x (call 5: 4.12 vs 3.25 s) a
# first-run cost (cuBLAS loading its kernels on first use) or per round? Each layout's program run twice in one
# process, the second on fresh arguments (startup.py --rerun), cold and warm. Then issue 16's INT2 / BF16 at B 1 /
# 128K three times over, separate processes (sessions 20-22: 1.671-1.701x around the goal of 1.7x). Last, whether the
# shipped autotuning results still match the programs (autotune_refresh.py; it updates jspec/autotune's pack in the
# device's tree and brings it back under $OUT: commit it if the merged pack compiles faster). About 7 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for s in --scan-layers ""; do el "startup $s"; timeout 140 python benchmarks/startup.py --engine --cases 8b+draft \
  --no-readme --no-job --rerun $s --out $OUT/startup${s:+_scan}.json 2>&1 | grep "^| 8b+draft"; done
for r in 1 2 3; do el "step $r"; timeout 60 python benchmarks/step_ab.py --tag r$r --jspec-root . \
  --cases int2:1:131072,bf16:1:131072 --profile "" --out $OUT/step_r$r.json 2>&1 | grep "ms/step"; done
el "autotune refresh"; timeout 240 python benchmarks/results/logs22/autotune_refresh.py --out $OUT 2>&1 | grep -v "^ *{"
el done
