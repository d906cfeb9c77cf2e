# Session 15, device call 3. Issue 16: decode's grid in whole waves of 396 CTAs (int2_mosaic.decode_splits) and
# the commit with keys and values in programs of their own, one warp each (pallas/int2_commit.py): the kernel
# alone against session 14's split rule, then the 8B step of this tree against the session-14 tree (.prev =
# git archive of HEAD 74a8835's jspec, untracked, carried with the working tree).
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "commit GPU tests"
PYTHONPATH=. timeout 60 python -m pytest -q -m gpu -p no:cacheprovider tests/test_int2_commit.py 2>&1 | tail -1
el "kernel alone: whole waves against session 14's rule"
PYTHONPATH=.:benchmarks timeout 110 python benchmarks/kernel_diag.py --trace --budget-s 95 --out $OUT/kd \
  --variants base,num_splits=s14 \
  --points 1:32768:1,1:131072:1,1:1048576:1,4:1048576:1,8:32768:1,8:131072:1,16:32768:1,32:32768:1,64:32768:1 \
  2>&1 | grep "B="
CASES=int2:1:131072,int2:8:32768,int2:1:1048576,int2:64:32768
el "step, session 14 tree"
PYTHONPATH=.prev:benchmarks timeout 100 python benchmarks/step_ab.py --tag s14 --jspec-root .prev --cases $CASES \
  --profile "" --out $OUT/step_s14.json 2>&1 | grep -v "^{" | tail -6
el "step, this tree (profiled at B 1 / 128K)"
PYTHONPATH=.:benchmarks timeout 130 python benchmarks/step_ab.py --tag s15 --jspec-root . \
  --cases $CASES,bf16:1:131072 --profile int2:1:131072 --out $OUT/step_s15.json 2>&1 | grep -v "^{" | tail -22
rm -rf $OUT/step_s15_profile
el done
