# Session 14, device call 3. Issue 16: decode's kernel grid (int2_mosaic.decode_splits, about two waves of long
# splits) against the one wave before (num_splits=ceil / step_ab.py --one-wave-splits): the kernel alone, the
# 8B step at B 1 / 128K, 8 / 32K and 1 / 1M; decode.py's 1M rows (floors now at torch's copy bandwidth); every
# -m gpu test.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "kernel alone: decode_splits (base) vs one wave (ceil)"
timeout 120 python benchmarks/kernel_diag.py --trace --budget-s 100 --out $OUT/kd --variants base,num_splits=ceil \
  --points 1:32768:1,1:131072:1,1:1048576:1,4:1048576:1,8:32768:1,8:131072:1,16:32768:1,32:32768:1,64:32768:1 \
  2>&1 | grep -v "^{" | tail -20
el "step: decode_splits"
timeout 120 python benchmarks/step_ab.py --tag two-waves --cases int2:1:131072,bf16:1:131072,int2:8:32768,int2:1:1048576 \
  --profile "" --out $OUT/step_new.json 2>&1 | grep -v "^{" | tail -6
el "step: one wave"
timeout 100 python benchmarks/step_ab.py --tag one-wave --one-wave-splits --cases int2:1:131072,int2:8:32768,int2:1:1048576 \
  --profile "" --out $OUT/step_old.json 2>&1 | grep -v "^{" | tail -5
el "decode.py 1M"
timeout 80 python benchmarks/decode.py --contexts 1048576 --batches 1 --time-budget 60 --out $OUT/decode_1m.json 2>&1 | tail -4
el "-m gpu tests"
timeout 330 python -m pytest -q -m gpu -p no:cacheprovider -x 2>&1 | tail -6
el done
