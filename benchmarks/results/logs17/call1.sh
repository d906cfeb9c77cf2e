# Session 17, device call 1. Issue 16 item 3: every layer's INT2 commit in one kernel (was one per layer),
# int2_mosaic.finish's work inside window_parts (merge="raw"), prepare_imma's max and sum(q) as one reduction.
# Every GPU test, then the 8B step of this tree and of session 16's (.before/prev = git archive 92a271b jspec)
# in separate processes, BF16 at B 1 / 128K for the ratio, and this tree's profile at B 1 / 128K (HLO kept).
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "all GPU tests"
PYTHONPATH=. timeout 280 python -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | grep -v "^\s*$" | tail -8
CASES=int2:1:131072,int2:8:32768,int2:1:1048576
el "step, this tree"
PYTHONPATH=.:benchmarks timeout 150 python benchmarks/step_ab.py --tag after --jspec-root . --cases $CASES,bf16:1:131072 \
  --profile int2:1:131072 --out $OUT/step_after.json 2>&1 | grep -v "^{" | tail -24
gzip -c $OUT/step_after_profile/int2_B1_131072.hlo.txt > $OUT/int2_B1_131072.hlo.txt.gz; rm -rf $OUT/step_after_profile
el "step, session 16's tree"
PYTHONPATH=.before/prev:benchmarks timeout 120 python benchmarks/step_ab.py --tag before --jspec-root .before/prev \
  --cases $CASES,bf16:1:131072 --profile "" --out $OUT/step_before.json 2>&1 | grep -v "^{" | tail -6
el done
