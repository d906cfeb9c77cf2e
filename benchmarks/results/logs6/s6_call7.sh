#!/bin/bash
# Session 6, call 7 (nvidia-h200-x2): issue 16: tokens/s at 32K, each KV mode at its largest batch;
# issue 19: which kernels of a head round are slow (by HLO name).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
(
  export CUDA_VISIBLE_DEVICES=0
  t "decode 32K, batches 21 and 140"
  timeout 200 python3 benchmarks/decode.py --out $OUT/decode_s6_32k.json --contexts 32768 --batches 21,140 --time-budget 150 2>&1 | grep -v Warn | tail -6
  t "A done"
) > $OUT/A.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  t "issue 19: head round kernels by name"
  timeout 150 python3 benchmarks/profile_round.py --modes plain,head --out $OUT/pr/pr.json --budget-s 110 2>&1 | grep -v Warn | grep -A 12 "slowest kernels" | head -30
  t "B done"
) > $OUT/B.log 2>&1 &
wait
echo "=== A"; cat $OUT/A.log; echo "=== B"; cat $OUT/B.log
