# Session 13, call 4: the README command cold then warm from the committed tree, whose autotuning results
# are now one JSON pack (jspec/autotune/jaxlib-0.11.2.json) of call 3's files.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks:benchmarks/results/logs12
timeout 100 python benchmarks/results/logs12/cold_census.py --out $OUT/census.json 2>&1 | head -16
