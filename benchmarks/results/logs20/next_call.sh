# Session 21 took qkv_rows out of the library: apply results/logs21/qkv_rows.patch to run this.
# Prepared in session 20 for session 21 (not run): pallas/qkv_rows.py alone and in the 8B step. Call 4 measured its
# "prepared" form at 11.6 us per layer (4 warps, 8 programs at B 1), slower than the ~9 us of XLA kernels it
# replaces. Which part costs what: rows_probe.py times the kernel without the quantised queries ("rows"), with
# 1-8 warps, split over 2-8 column blocks, and "prepared", against XLA's kernels for the same work, at B 1 and 8.
# Then the step at B 1 / 128K: the default (XLA) against --fused-rows rows and prepared, alternating twice.
# Then issue 14: does a second process's load scale with the program's layers (load_scaling.py, 4-32 layers)?
# About 9 minutes. Pick --rows-split / --rows-warps for the step from the probe's fastest "rows" variant.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "gpu tests"; timeout 150 python -m pytest -q -rf -m gpu tests/test_qkv_rows.py -p no:cacheprovider 2>&1 | tail -4
el "rows_probe"; timeout 200 python benchmarks/results/logs20/rows_probe.py --batch 1,8 --out $OUT/rows_probe.json 2>&1 | \
  python -c "import sys, json; [print(r['B'], r['variant'], r.get('us_per_layer'), r.get('kernels_per_layer'), r.get('error', '')[:100]) for r in map(json.loads, filter(lambda l: l.startswith('{'), sys.stdin))]"
ab() { timeout 100 python benchmarks/step_ab.py --tag $1 --jspec-root . --cases int2:1:131072,bf16:1:131072 --profile "" \
  $2 --out $OUT/step_$1.json 2>&1 | grep "ms/step"; }
for i in 1 2; do el "A/B $i"; ab xla$i ""; ab rows$i "--fused-rows rows"; ab prepared$i "--fused-rows prepared"; done
for L in 4 8 16 32; do el "load_scaling $L"; S=benchmarks/results/logs20/load_scaling.py
  timeout 150 python $S --cache /tmp/ls --layers $L write 2>&1 | tail -1
  for r in 1 2; do timeout 60 python $S --cache /tmp/ls --layers $L read 2>&1 | tail -1; done; done
el done
