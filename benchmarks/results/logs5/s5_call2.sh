#!/bin/bash
# Session 5, call 2 (nvidia-h200-x2), on the round-2 pair: issue 19 (the head retrained for the new target),
# issue 17 (draft modes: the fixed-K sweep at batch 1, auto at batches 1 and 8).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
rm -f /tmp/head.done; T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
(
  export CUDA_VISIBLE_DEVICES=0
  t "head training"
  timeout 200 python -m jspec.train_head --target checkpoints/code-target --out /tmp/code-head --time-budget 140 2>&1 | grep -v Warn | tail -6
  [ -f /tmp/code-head/model.safetensors ] && rm -rf checkpoints/code-head && cp -r /tmp/code-head checkpoints/.code-head.tmp \
    && mv checkpoints/.code-head.tmp checkpoints/code-head && tar -C /tmp -czf $OUT/head.tgz code-head
  touch /tmp/head.done
  t "sweep batch 1"
  timeout $(( 530 - $(date +%s) + T0 )) python benchmarks/speculative.py --batches 1 --parts sweep --budget-s $(( 490 - $(date +%s) + T0 )) --out $OUT/spec_sweep_b1.json 2>&1 | grep -v Warn | tail -12
  t "A done"
) > $OUT/A.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  t "auto batch 8"
  timeout 260 python benchmarks/speculative.py --batches 8 --parts auto --head none --budget-s 230 --out $OUT/spec_auto_b8.json 2>&1 | grep -v Warn | tail -12
  for i in $(seq 60); do [ -f /tmp/head.done ] && break; sleep 3; done
  t "auto batch 1"
  timeout $(( 530 - $(date +%s) + T0 )) python benchmarks/speculative.py --batches 1 --parts auto --budget-s $(( 490 - $(date +%s) + T0 )) --out $OUT/spec_auto_b1.json 2>&1 | grep -v Warn | tail -14
  t "B done"
) > $OUT/B.log 2>&1 &
wait
echo "=== A"; cat $OUT/A.log; echo "=== B"; cat $OUT/B.log
