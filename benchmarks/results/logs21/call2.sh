# Session 21, call 2 (H200). Issue 16: qkv_rows' GPU tests (its final form had run on the CPU only), then the 8B
# step at B 1 / 128K, INT2 and BF16, the default against --fused-rows rows with 4 programs per (token, KV head)
# (call 1's fastest variant alone: 4.03 us per layer against XLA's 7.7), alternating twice. Issue 14: can a scan
# over stacked layers read its weights in place (scan_probe.py)?
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "scan_probe"; timeout 150 python benchmarks/results/logs21/scan_probe.py 2>&1 | grep "^{" | tee $OUT/scan_probe.jsonl
el "gpu tests"; timeout 150 python -m pytest -q -rf -m gpu tests/test_qkv_rows.py -p no:cacheprovider 2>&1 | tail -4
ab() { timeout 70 python benchmarks/step_ab.py --tag $1 --jspec-root . --cases int2:1:131072,bf16:1:131072 --profile "$3" \
  $2 --out $OUT/step_$1.json 2>&1 | grep -E "ms/step|profile"; }
for i in 1 2; do el "A/B $i"; ab xla$i "" ""; ab s4_$i "--fused-rows rows --rows-split 4" "$([ $i = 1 ] && echo int2:1:131072)"; done
el done
