# Session 19, call 3: whether jspec's program store keeps a program with a Mosaic kernel (store_diag.py), then
# every GPU test on this tree (f8c73ba's jspec and tests: 41e7062's commit code had not run on a GPU).
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "store_diag"; PYTHONPATH=. timeout 90 python benchmarks/results/logs19/store_diag.py 2>&1 | grep -v Warning | tail -25
el "GPU tests"; PYTHONPATH=. timeout $((400 - $(date +%s) + t0)) python -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -8
el done
