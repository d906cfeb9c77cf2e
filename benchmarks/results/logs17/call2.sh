# Session 17, device call 2. Issue 16 item 3 after call 1: the per-warp kernel writes its partials [N, D] in head
# dimension order (window_parts reads them without a gather: call 1's gathered form took window_parts from 0.137
# to 0.220 ms per step), and q, k, v read in place from model.qkv_rows by window_parts (3 slice kernels fewer per
# layer). Every GPU test, the README command, then the 8B step of this tree and of session 16's (.before/prev)
# in separate processes, BF16 at B 1 / 128K for the ratio, and this tree's profile at B 1 / 128K.
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "all GPU tests"
PYTHONPATH=. timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | grep -v "^\s*$" | grep -v Warning | tail -8
el "README command"
PYTHONPATH=. timeout 60 python -m jspec.generate "def fibonacci(n):" --max-new-tokens 48 2>&1 | tail -8
CASES=int2:1:131072,int2:8:32768,int2:1:1048576
el "step, this tree"
PYTHONPATH=.:benchmarks timeout 150 python benchmarks/step_ab.py --tag after --jspec-root . --cases $CASES,bf16:1:131072 \
  --profile int2:1:131072 --out $OUT/step_after.json 2>&1 | grep -v "^{" | tail -24
gzip -c $OUT/step_after_profile/int2_B1_131072.hlo.txt > $OUT/int2_B1_131072.hlo.txt.gz; rm -rf $OUT/step_after_profile
el "step, session 16's tree"
PYTHONPATH=.before/prev:benchmarks timeout 120 python benchmarks/step_ab.py --tag before --jspec-root .before/prev \
  --cases $CASES,bf16:1:131072 --profile "" --out $OUT/step_before.json 2>&1 | grep -v "^{" | tail -6
el done
