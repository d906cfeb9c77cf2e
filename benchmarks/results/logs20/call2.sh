# Session 20, call 2 (H200): issue 14's load with and without compile options (deser_probe.py), after store_probe's write.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "store_probe write"; timeout 150 python benchmarks/results/logs19/store_probe.py --cache /tmp/sp write 2>&1 | tail -1
for i in 1 2; do for v in store-none store-opts jax-none jax-opts; do
  el "$v"; timeout 100 python benchmarks/results/logs20/deser_probe.py --cache /tmp/sp $v 2>&1 | tail -2; done; done
el "store_probe engine"; timeout 100 python benchmarks/results/logs19/store_probe.py --cache /tmp/sp engine 2>&1 | tail -1
el done
