# Prepared in session 12 for the next device call (not run: the session's device time ran out). Issue 16's goal rows
# not re-measured since session 8 (the fused commit and R_K layout landed since): 1M-token context at batch 1 and 4,
# copy bandwidth (decode at B 64 / 32K, verifying 5 positions at B 64 / 32K, B 1 / 1M).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "decode.py 1M"
timeout 75 python benchmarks/decode.py --contexts 1048576 --batches 1,4 --time-budget 60 --out $OUT/decode_1m.json 2>&1 | tail -6
el "kernel alone"
timeout 60 python benchmarks/kernel_diag.py --trace --variants base --points 64:32768:1,64:32768:5,1:1048576:1 \
  --budget-s 45 --out $OUT 2>&1 | tail -8
el done
