# Session 21, call 3 (H200): every GPU test on this tree (qkv_rows taken out: its decode-step tests failed in call 2,
# and no step gain measured), then scan_probe.py again with XLA's Triton GEMMs off (cuBLAS calls, where the
# dynamic-slice fusion applies).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "GPU tests"; timeout 400 python -m pytest -q -rf --tb=line -m gpu -p no:cacheprovider tests 2>&1 | tail -12
el "scan_probe"; timeout 150 python benchmarks/results/logs21/scan_probe.py 2>&1 | grep "^{" | tee $OUT/scan_probe.jsonl
el done
