# Session 15, device call 4: every GPU test on the final kernels (decode's grid in whole waves, the commit split
# into key and value programs of one warp; add_norm dropped), then decode.py's 1M rows and its 32K rows at
# batch 1 and each KV mode's largest batch (floors at torch's copy bandwidth).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "-m gpu"
timeout 250 python -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -3
el "decode.py 1M"
timeout 80 python benchmarks/decode.py --contexts 1048576 --batches 1,4 --time-budget 60 --out $OUT/decode_1m.json 2>&1 | tail -6
el "decode.py 32K: batch 1 and each mode's largest"
timeout 110 python benchmarks/decode.py --contexts 32768 --batches 1 --time-budget 90 --out $OUT/decode_32k.json 2>&1 | tail -8
el done
