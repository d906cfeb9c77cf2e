# Session 16, device call 4. Issue 16 with late values on: decode.py at 32K (batch 1 and each mode's largest
# batch, for the 3x goal) and at 1M (batch 1 and 4).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "decode.py 32K: batch 1 and each mode's largest"
timeout 110 python benchmarks/decode.py --contexts 32768 --batches 1 --time-budget 90 --out $OUT/decode_32k.json 2>&1 | tail -7
el "decode.py 1M"
timeout 80 python benchmarks/decode.py --contexts 1048576 --batches 1,4 --time-budget 60 --out $OUT/decode_1m.json 2>&1 | tail -5
el done
