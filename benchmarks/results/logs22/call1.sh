# Session 22, call 1 (H200): prepared in session 21 as logs21/next_call.sh (this file replaces it): the stacked
# layers (model.stack_layers, --scan-layers) on the H200. Probes (BF16 cache / Mosaic kernel inputs in a scan: in
# place?), the stacked GPU test, the 8B step default vs stacked, the 8B + draft cold compile and second-process load
# with and without.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "scan_attention_probe"; timeout 150 python benchmarks/results/logs21/scan_attention_probe.py 2>&1 | grep "^{" | tee $OUT/scan_attention.jsonl
el "mosaic_scan_probe"; timeout 120 python benchmarks/results/logs21/mosaic_scan_probe.py 2>&1 | grep "^{" | tee $OUT/mosaic_scan.jsonl
el "gpu test"; timeout 120 python -m pytest -q -rf -m gpu tests/test_stacked.py -p no:cacheprovider 2>&1 | tail -4
C=int2:1:131072,bf16:1:131072,int2:8:32768
el "step default"; timeout 100 python benchmarks/step_ab.py --tag unrolled --jspec-root . --cases $C --profile "" \
  --out $OUT/step_unrolled.json 2>&1 | grep "ms/step"
el "step stacked"; timeout 130 python benchmarks/step_ab.py --tag stacked --jspec-root . --cases $C \
  --scan-layers --profile int2:1:131072 --out $OUT/step_stacked.json 2>&1 | grep -E "ms/step|profile"
for s in "" --scan-layers; do el "startup $s"; timeout 200 python benchmarks/startup.py --engine --cases 8b+draft \
  --no-readme --no-job $s --out $OUT/startup${s:+_scan}.json 2>&1 | grep "8b+draft"; done
el done
