# Session 15, device call 4. Issue 16: the ring's depth now that 3 CTAs fit per SM (registers, not shared memory,
# bound them: 54 of ~76 KB per CTA used), the verification body's occupancy and grid, decode.py's 1M and 32K
# rows (floors at torch's copy bandwidth), then every GPU test on the final kernels (decode's grid in whole
# waves, the commit split into key and value programs of one warp; add_norm dropped).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "kernel alone: ring stages"
timeout 100 python benchmarks/kernel_diag.py --trace --budget-s 85 --out $OUT/kd_stages \
  --variants base,stages=4,stages=5,stages=2 \
  --points 1:131072:1,8:32768:1,8:131072:1,1:1048576:1,64:32768:1 2>&1 | grep "B="
el "kernel alone: verification grid"
timeout 45 python benchmarks/kernel_diag.py --trace --budget-s 35 --out $OUT/kd_verify \
  --variants base,num_splits=6,num_splits=12 --points 8:32768:5 2>&1 | grep "B="
python -c "import json; print(json.load(open('$OUT/kd_verify/kernel_diag.json'))['rows'][0].get('details'))"
el "decode.py 1M"
timeout 80 python benchmarks/decode.py --contexts 1048576 --batches 1,4 --time-budget 60 --out $OUT/decode_1m.json 2>&1 | tail -5
el "decode.py 32K: batch 1 and each mode's largest"
timeout 110 python benchmarks/decode.py --contexts 32768 --batches 1 --time-budget 90 --out $OUT/decode_32k.json 2>&1 | tail -7
el "-m gpu"
timeout 240 python -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -3
el done
