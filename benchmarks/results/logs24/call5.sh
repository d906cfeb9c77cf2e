# Session 24, call 5: do static slices of stacked weights read in place in an unrolled program? (slice_probe.py)
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
timeout 170 python benchmarks/results/logs24/slice_probe.py --out $OUT 2>&1 | grep -v "Warning"
