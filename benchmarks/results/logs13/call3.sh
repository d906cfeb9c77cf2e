# Session 13, call 3. Issue 14: the cold README command with XLA's autotuning results shipped, the seeding
# now copying XLA's per-GPU subfolder (call 2's copied nothing: the results sit one folder down). Every GPU
# test on the final tree (window_merge, the seeding, sessions 12-13's changes).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks:benchmarks/results/logs12
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "autotune seed"
timeout 200 python benchmarks/results/logs13/autotune_seed.py --out $OUT 2>&1 | tail -24
el "GPU tests"
timeout 330 python -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -4
el done
