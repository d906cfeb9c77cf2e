# Session 28, call 5 (issue 16's 40%): the wgmma body's lazy max (int2_attention_mosaic(lazy_max=True)), first run
# on a GPU: its kernel tests against the reference, then verification's kernel time with it against without
# (auto's lop3 and edge_mask in both), 5 positions, from a trace.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "kernel tests, lazy max"
timeout 75 python -m pytest -q --tb=line -m gpu -p no:cacheprovider tests/test_int2_mosaic.py -k lazy_max 2>&1 | \
  grep -v Warning | tail -4
el "timing"
V=body=wgmma+lop3=True+edge_mask=True
timeout 70 python benchmarks/kernel_diag.py --trace --budget-s 55 --reps 4 --points 8:32768:5,64:32768:5 \
  --variants $V,$V+lazy_max=True --out $OUT 2>&1 | python -c "
import json, sys
for line in sys.stdin:
    if line.startswith('{'):
        r = json.loads(line)
        print(r['B'], r['T'], r['n'], r['variant'][-14:], round(r.get('kernel_ms', 0), 4), round(r.get('kernel_frac_copy', 0), 3), r.get('error', '')[:300])
"
el done
