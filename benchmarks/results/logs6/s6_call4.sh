#!/bin/bash
# Session 6, call 4 (nvidia-h200-x2): issue 16: per-warp kernel (two score chains) timing + GPU tests, the
# 8B-shaped decode step at 128K / 1M (BF16 vs INT2) and its kernel profile; issue 19: a decode round profiled.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
(
  export CUDA_VISIBLE_DEVICES=0
  t "kernel timing"
  timeout 150 python3 benchmarks/kernel_diag.py --out $OUT --budget-s 120 --trace --variants body=wgmma,body=warp --points 64:32768:1,8:131072:1,1:131072:1,8:32768:1 2>&1 | grep -v Warn | tail -9
  t "decode 128K / 1M, batch 1"
  timeout 200 python3 benchmarks/decode.py --out $OUT/decode_s6.json --contexts 131072,1048576 --batches 1 --time-budget 150 2>&1 | grep -v Warn | tail -12
  t "profile int2 128K B1"
  timeout 120 python3 benchmarks/profile_step.py --out /tmp/prof --cases int2:1:131072 2>&1 | grep -v Warn | tail -22
  cp /tmp/prof/profile.json $OUT/profile_s6.json
  t "A done"
) > $OUT/A.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  t "issue 19: round profile, int2"
  timeout 200 python3 benchmarks/profile_round.py --out $OUT/pr/profile_round.json --budget-s 150 2>&1 | grep -v Warn | tail -40
  t "issue 19: variants plain/head, nocmdbuf"
  timeout 170 python3 benchmarks/profile_round.py --modes plain,head --variants nocmdbuf --no-trace --out $OUT/pr/variants.json --budget-s 120 2>&1 | grep -v Warn | tail -8
  t "GPU tests (int2_mosaic)"
  timeout 150 python3 -m pytest -q -x tests/test_int2_mosaic.py -p no:cacheprovider 2>&1 | tail -3
  t "B done"
) > $OUT/B.log 2>&1 &
wait
echo "=== A"; cat $OUT/A.log; echo "=== B"; cat $OUT/B.log
