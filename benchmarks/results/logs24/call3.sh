# Session 24, call 3: the stacked GEMMs in a Pallas kernel (jspec/pallas/stacked_matmul.py) against XLA's, per weight
# (a tiling sweep at 1 and 8 rows) and in session 23's 32-layer probe at 1, 8 and 40 rows (matmul_probe.py).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
timeout 420 python benchmarks/results/logs24/matmul_probe.py --out $OUT 2>&1 | grep -v "Warning"
