#!/bin/bash
# Session 5, call 4 (nvidia-h200-x2): issue 14 (the warm CLI's cache hit), issue 19 (head rounds after the
# kernel cuts; a second head with a 4096-token vocabulary and the target's MLP width), issue 17 (batch 32
# BF16 auto with paired timing; the model draft's unrolled steps at batch 1), issue 18 (KV quality, 12 windows).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
rm -f /tmp/head2.done; T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( $1 - $(date +%s) + T0 )); }
(
  export CUDA_VISIBLE_DEVICES=0
  t "issue 14: README command cold, then warm"
  D=$(mktemp -d)
  for r in cold warm; do echo "== $r"; ( export JSPEC_CACHE_DIR=$D/jspec JAX_EXPLAIN_CACHE_MISSES=1 TIMEFORMAT="wall %R s"
    { time timeout 60 python -m jspec.generate --compile-cache $D/xla "def fibonacci(n):" 2>$D/$r.err | tail -1; } 2>&1
    grep -o "CACHE MISS for .[^']*" $D/$r.err | sort | uniq -c | head -5 ); done
  t "head_round, shipped head, int2"
  timeout 60 python benchmarks/head_round.py --kv int2 --ks 4 --new 512 --out $OUT/head_round_v1_int2.json 2>&1 | grep -v Warn | tail -8
  t "auto batch 32 bf16, paired"
  timeout 90 python benchmarks/speculative.py --batches 32 --kvs bf16 --parts auto --head none --budget-s 75 --out $OUT/spec_auto_b32_bf16_paired.json 2>&1 | grep -v Warn | tail -6
  t "model draft, batch 1, int2, K 1 2 4 (unrolled steps up to K = 5)"
  timeout 60 python benchmarks/speculative.py --batches 1 --kvs int2 --modes model --parts sweep --head none --budget-s 45 --out $OUT/spec_model_b1_int2.json 2>&1 | grep -v Warn | tail -4
  for i in $(seq 40); do [ -f /tmp/head2.done ] && break; sleep 3; done
  H=checkpoints/code-head; [ -f /tmp/code-head2/model.safetensors ] && H=/tmp/code-head2
  t "head rows, batches 1 and 8 ($H)"
  timeout $(left 355) python benchmarks/speculative.py --batches 1,8 --modes head --parts auto --head $H --budget-s $(left 335) --out $OUT/spec_head_b18.json 2>&1 | grep -v Warn | tail -8
  t "A done"
) > $OUT/A.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  t "head v2 training"
  timeout 190 python -m jspec.train_head --target checkpoints/code-target --out /tmp/code-head2 --time-budget 150 \
    --draft-vocab 4096 --intermediate-size 1152 2>&1 | grep -v Warn | tail -3
  [ -f /tmp/code-head2/model.safetensors ] && tar -C /tmp -czf $OUT/head2.tgz code-head2
  touch /tmp/head2.done
  t "head_round, head v2, int2"
  timeout 50 python benchmarks/head_round.py --kv int2 --ks 4 --new 512 --head /tmp/code-head2 --out $OUT/head_round_v2_int2.json 2>&1 | grep -v Warn | tail -6
  t "corpus (validation split), kv_quality on 12 windows"
  timeout 40 python -m jspec.data --out /tmp/data --tokenizer checkpoints/code-target --filter > /tmp/data.log 2>&1 || tail -3 /tmp/data.log
  timeout $(left 355) python benchmarks/kv_quality.py --model checkpoints/code-target --data /tmp/data --windows 12 --only none hadamard oscar --out $OUT/kv_quality_w12.json 2>&1 | grep -v Warn | tail -16
  t "B done"
) > $OUT/B.log 2>&1 &
wait
echo "=== A"; cat $OUT/A.log; echo "=== B"; cat $OUT/B.log
