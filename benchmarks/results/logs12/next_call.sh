# Prepared in session 12 for the next device call (not run: the session's device time ran out; about 8 minutes).
# Issue 14: how long lookahead auto's first measurement takes in the cold README command (the stats line now
# shows "costs timed in X s") and whether loops over 1-2 target layers would time it in less (measure_layers.py:
# compile wall and phases, and the full costs against the ones the cut loops predict). Issue 16: its goal rows
# not re-measured since session 8 (the fused commit and R_K layout landed since): 1M-token context at batch 1
# and 4, and the kernel alone's share of the copy bandwidth (decode and verifying 5 positions at B 64 / 32K,
# B 1 / 1M).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "cold README, per program (its stats line: the costs' measure_s)"
timeout 80 python benchmarks/results/logs12/cold_census.py --out $OUT/census.json 2>&1 | head -8
el "lookahead's first measurement: the full target, then its first 2 and 1 layers"
timeout 100 python benchmarks/results/logs12/measure_layers.py --phases --out $OUT/measure_layers.json 2>&1 | tail -30
el "8B + draft, cold then warm (cache hit, goal 1 s): default, then XLA's command buffers off (their load-time conversion: 0.63 s of the hit's thread time)"
timeout 80 python benchmarks/startup.py --phases --no-readme --cases 8b+draft --budget 70 --out $OUT/startup.json 2>&1 | tail -3
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 80 python benchmarks/startup.py --phases --no-readme --cases 8b+draft \
  --budget 70 --out $OUT/startup_nocmdbuf.json 2>&1 | tail -3
el "decode.py 1M"
timeout 75 python benchmarks/decode.py --contexts 1048576 --batches 1,4 --time-budget 60 --out $OUT/decode_1m.json 2>&1 | tail -6
el "kernel alone"
timeout 60 python benchmarks/kernel_diag.py --trace --variants base --points 64:32768:1,64:32768:5,1:1048576:1 \
  --budget-s 45 --out $OUT 2>&1 | tail -8
el done
