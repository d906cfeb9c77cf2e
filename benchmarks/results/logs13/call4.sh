# Session 13, call 4: the README command cold then warm from the final commit, whose autotuning results
# are now one JSON pack (jspec/autotune/jaxlib-0.11.2.json) of call 3's files; window_merge's GPU tests on it.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks:benchmarks/results/logs12
timeout 100 python benchmarks/results/logs12/cold_census.py --out $OUT/census.json 2>&1 | head -16
timeout 60 python -m pytest -q -m gpu -p no:cacheprovider tests/test_window_merge.py 2>&1 | tail -2
