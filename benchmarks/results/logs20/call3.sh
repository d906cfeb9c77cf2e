# Session 20, call 3 (H200): q, k, v and the quantised queries in one kernel (pallas/qkv_rows.py): its GPU tests,
# then the 8B step at B 1 / 128K with it and without (step_ab --xla-rows), separate processes, alternating twice.
# Run as it was: qkv_rows was on by default then and --xla-rows turned it off; since 0bb8b49 it is off by
# default and step_ab.py --fused-rows turns it on.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "gpu tests"; timeout 240 python -m pytest -q -rf -m gpu tests/test_qkv_rows.py tests/test_window_merge.py -p no:cacheprovider 2>&1 | tail -12
ab() { timeout 100 python benchmarks/step_ab.py --tag $1 --jspec-root . --cases int2:1:131072,bf16:1:131072 --profile "$3" \
  $2 --out $OUT/step_$1.json 2>&1 | grep -vE "^ +0\.00[0-9] ms|jspec from|done in"; }
for i in 1 2; do el "A/B $i"; ab xla$i --xla-rows ""; ab rows$i "" "$([ $i = 1 ] && echo int2:1:131072)"; done
el done
