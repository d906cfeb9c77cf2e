# Session 28, call 4: where verification's kernel time goes now (issue 16's 40%): the wgmma body with auto's lop3
# and edge_mask (named: an ablation alone would drop them), one stage of its block left out per variant, kernel time
# from a trace, 5 positions (20 rows per KV head); then the GPU tests on this tree (all files but the second half's
# four, as in earlier sessions).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "ablations"
timeout 200 python benchmarks/kernel_diag.py --trace --budget-s 150 --reps 6 --points 8:32768:5,64:32768:5 \
  --variants $(for v in base nomax nosoft nomask noexp noscore novalue nokunpack novunpack empty; do
    printf "%s+body=wgmma+lop3=True+edge_mask=True," $v; done | sed 's/,$//') --out $OUT 2>&1 | \
  python -c "
import json, sys
for line in sys.stdin:
    if line.startswith('{'):
        r = json.loads(line)
        print(r['B'], r['T'], r['n'], r['variant'], round(r.get('kernel_ms', 0), 4), round(r.get('kernel_frac_copy', 0), 3), r.get('error', '')[:120])
"
el "GPU tests, first half"
timeout 330 python -m pytest -q --tb=short -m gpu -p no:cacheprovider tests --ignore=tests/test_window_merge.py \
  --ignore=tests/test_startup.py --ignore=tests/test_add_norm.py --ignore=tests/test_stacked.py 2>&1 | tail -5
el done
