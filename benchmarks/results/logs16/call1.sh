# Session 16, device call 1 (prepared in session 15 as logs15/next_call.sh). Issue 16: the lean
# bodies' value fragments unpacked after the scores (int2_attention_mosaic(late_values=True), opt-in): does ptxas
# then fit the lean8 decode body in 128 registers (4 CTAs per SM instead of 3; kernel_details' regs), and is the
# kernel faster? If regs drop to <= 128, decode_splits' DECODE_CTAS_PER_SM must become 4 with it (the wave).
# Its GPU tests first (correctness of the reordered body), then the kernel alone (trace; regs in the JSON).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "Mosaic kernel GPU tests (late_values among them; prepare_imma row vectors)"
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_int2_mosaic.py 2>&1 | tail -2
el "kernel alone: late_values, and at 4 CTAs per SM's wave (528) too"
timeout 130 python benchmarks/kernel_diag.py --trace --budget-s 115 --out $OUT/kd_late \
  --variants base,late_values=True,late_values=True+num_splits=w528 \
  --points 1:131072:1,8:32768:1,8:131072:1,1:1048576:1,64:32768:1 2>&1 | grep "B="
python -c "
import json
for r in json.load(open('$OUT/kd_late/kernel_diag.json'))['rows']:
    print(r['B'], r['T'], r['variant'], r.get('details', {}).get('kernel_details'))"
el done
