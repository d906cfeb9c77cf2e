# Session 20, call 4 (H200): qkv_rows with its dots on the tensor cores in bf16 (call 3's f32 dots in full precision
# took 21 us per layer): its GPU tests, then the 8B step at B 1 / 128K with it and without, then with again.
# Run as it was: qkv_rows was on by default then and --xla-rows turned it off; since 0bb8b49 it is off by
# default and step_ab.py --fused-rows turns it on.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "gpu tests"; timeout 150 python -m pytest -q -rf -m gpu tests/test_qkv_rows.py -p no:cacheprovider 2>&1 | tail -4
ab() { timeout 100 python benchmarks/step_ab.py --tag $1 --jspec-root . --cases int2:1:131072,bf16:1:131072 --profile "$3" \
  $2 --out $OUT/step_$1.json 2>&1 | grep -vE "^ +0\.00[0-9] ms|jspec from|done in"; }
el "A/B"; ab rows1 "" int2:1:131072; ab xla1 --xla-rows ""; ab rows2 "" ""
el done
