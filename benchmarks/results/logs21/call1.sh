# Session 21, call 1 (H200). Issue 14: what in the second process's 2.3 s load is paid once per process (jaxlib
# compiles each Mosaic GPU kernel at load, once per kernel hash)? load_twice.py loads each stored part twice in one
# process, in both orders; load_scaling.py reads at 32 and 8 target layers. Issue 16: qkv_rows alone (rows_probe.py,
# session 20's) and the step with it (default vs --fused-rows rows / prepared).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
so=$(python -c "import jaxlib, os; print(os.path.dirname(jaxlib.__file__))")
el "jaxlib: $(python -c 'import jaxlib; print(jaxlib.__version__)')"; for f in $(find $(dirname $so) -name "*mosaic*gpu*.so" 2>/dev/null | head -3); do
  echo "$f: $(strings $f | grep -c CustomCallResources) CustomCallResources strings"; done
S=benchmarks/results/logs20/load_scaling.py; T=benchmarks/results/logs21/load_twice.py
el "write 32"; timeout 150 python $S --cache /tmp/l32 --layers 32 write 2>&1 | tail -1
el "twice ab"; timeout 60 python $T --cache /tmp/l32 --order ab --count 2>&1 | tail -1
el "twice ba"; timeout 60 python $T --cache /tmp/l32 --order ba 2>&1 | tail -1
el "engine read 32"; timeout 60 python $S --cache /tmp/l32 --layers 32 read 2>&1 | tail -1
el "write 8"; timeout 100 python $S --cache /tmp/l8 --layers 8 write 2>&1 | tail -1
el "twice 8"; timeout 60 python $T --cache /tmp/l8 --order ab --count 2>&1 | tail -1
el "rows_probe"; timeout 150 python benchmarks/results/logs20/rows_probe.py --batch 1,8 --out $OUT/rows_probe.json 2>&1 | \
  python -c "import sys, json; [print(r['B'], r['variant'], r.get('us_per_layer'), r.get('kernels_per_layer'), r.get('error', '')[:100]) for r in map(json.loads, filter(lambda l: l.startswith('{'), sys.stdin))]"
ab() { timeout 60 python benchmarks/step_ab.py --tag $1 --jspec-root . --cases int2:1:131072 --profile "" \
  $2 --out $OUT/step_$1.json 2>&1 | grep "ms/step"; }
el "A/B"; ab xla1 ""; ab rows1 "--fused-rows rows"; ab prepared1 "--fused-rows prepared"
el done
