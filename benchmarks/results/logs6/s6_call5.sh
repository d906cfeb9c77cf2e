#!/bin/bash
# Session 6, call 5 (nvidia-h200-x2): issue 16: per-warp body with 128-token blocks (tests, timing);
# issue 19: the head round's compiled program (HLO) for the slow concatenate fusions.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
(
  export CUDA_VISIBLE_DEVICES=0
  t "GPU tests"
  timeout 200 python3 -m pytest -q -x tests/test_int2_mosaic.py -p no:cacheprovider 2>&1 | tail -3
  t "timing"
  V=body=warp,body=warp+block_t=128,body=warp+block_t=128+stages=2,body=warp+block_t=128+stages=3
  timeout 200 python3 benchmarks/kernel_diag.py --out $OUT --budget-s 170 --trace --variants $V --points 64:32768:1,8:131072:1,1:131072:1,8:32768:1 2>&1 | grep -v Warn | tail -17
  t "A done"
) > $OUT/A.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  t "issue 19: head and plain HLO + trace"
  timeout 200 python3 benchmarks/profile_round.py --modes plain,head --hlo --out $OUT/pr/pr.json --budget-s 150 2>&1 | grep -v Warn | tail -6
  t "B done"
) > $OUT/B.log 2>&1 &
wait
echo "=== A"; cat $OUT/A.log; echo "=== B"; cat $OUT/B.log
