#!/bin/bash
# Session 6, call 6 (nvidia-h200-x2): the final code: every GPU test; the 8B decode step at 128K / 1M (BF16 vs
# INT2), the kernel alone with the default settings against the wgmma body, the step's kernel profile.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
(
  export CUDA_VISIBLE_DEVICES=0
  t "GPU tests"
  timeout 330 python3 -m pytest -m gpu -q tests -p no:cacheprovider 2>&1 | tail -4
  t "A done"
) > $OUT/A.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  t "kernel: default vs wgmma body"
  timeout 120 python3 benchmarks/kernel_diag.py --out $OUT --budget-s 100 --trace --variants base,body=wgmma --points 64:32768:1,8:131072:1,1:131072:1,8:32768:1,1:1048576:1 2>&1 | grep -v Warn | tail -11
  t "decode 128K / 1M, batch 1"
  timeout 200 python3 benchmarks/decode.py --out $OUT/decode_s6.json --contexts 131072,1048576 --batches 1 --time-budget 150 2>&1 | grep -v Warn | tail -6
  t "profile int2 128K B1"
  timeout 100 python3 benchmarks/profile_step.py --out /tmp/prof --cases int2:1:131072 2>&1 | grep -v Warn | tail -8
  cp /tmp/prof/profile.json $OUT/profile_s6.json
  t "B done"
) > $OUT/B.log 2>&1 &
wait
echo "=== A"; cat $OUT/A.log; echo "=== B"; cat $OUT/B.log
