#!/bin/bash
# Session 5, call 3 (nvidia-h200-x2), on the round-2 pair: issue 17's auto rows at batches 32 and 64.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
(
  export CUDA_VISIBLE_DEVICES=0
  t "auto batch 32"
  timeout 270 python benchmarks/speculative.py --batches 32 --parts auto --head none --budget-s 250 --out $OUT/spec_auto_b32.json 2>&1 | grep -v Warn | tail -9
  t "README command"
  timeout 40 python -m jspec.generate "def fibonacci(n):" 2>&1 | grep -v Warn | tail -30
  t "A done"
) > $OUT/A.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  t "auto batch 64"
  timeout 300 python benchmarks/speculative.py --batches 64 --parts auto --head none --budget-s 280 --out $OUT/spec_auto_b64.json 2>&1 | grep -v Warn | tail -9
  t "B done"
) > $OUT/B.log 2>&1 &
wait
echo "=== A"; cat $OUT/A.log; echo "=== B"; cat $OUT/B.log
