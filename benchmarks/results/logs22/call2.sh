# Session 22, call 2 (H200): why the stacked step is slower (call 1: 7.20 vs 5.86 ms at int2 B1/128K): head_probe.py
# (the lm_head's bf16 -> f32 convert under SCAN_OPTIONS), the failing stacked GPU test with its traceback, profiles
# of the stacked bf16 B1/128K and int2 B8/32K steps, then every GPU test (int2_commit's stacked indexing is new).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "head_probe"; timeout 120 python benchmarks/results/logs22/head_probe.py 2>&1 | grep "^{" | tee $OUT/head_probe.jsonl
el "stacked gpu test"; timeout 120 python -m pytest -q -x --tb=short -m gpu tests/test_stacked.py -p no:cacheprovider 2>&1 | grep -v "^  warnings\|Warning" | tail -40
el "step stacked profiles"; timeout 100 python benchmarks/step_ab.py --tag stacked --jspec-root . --cases bf16:1:131072,int2:8:32768 \
  --scan-layers --profile bf16:1:131072,int2:8:32768 --out $OUT/step_stacked.json 2>&1 | grep -E "ms/step|profile"
el "GPU tests"; timeout 330 python -m pytest -q -rf --tb=line -m gpu -p no:cacheprovider tests 2>&1 | tail -12
el done
