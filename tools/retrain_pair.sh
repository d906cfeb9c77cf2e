#!/usr/bin/env bash
# Issue 18 in one unattended call on an nvidia-h200-x2 (2 GPUs, 32 cores), ending by END_S seconds:
#   corpus + tokenizer on the CPU cores -> target on GPU 0 || draft pre-training, then distillation
#   from the new target, on GPU 1 -> OSCAR rotations, KV quality and the issue's metrics (old pair
#   vs new pair) -> $OUT.
# Every stage runs under `timeout` with a budget taken from fixed milestones (seconds from the start),
# so the call cannot overrun; whatever finished is packed into $OUT even when a later stage fails.
#
#   bash tools/retrain_pair.sh                       # on the device ($OUT given by the device tool)
#   SMOKE=1 OUT=/tmp/o bash tools/retrain_pair.sh    # CPU check: tiny corpus, tiny shapes, 4 steps
#
# $OUT: log.txt (stage timeline), metrics.json (summary of every report), results.tgz.part-NN (a tar
# of checkpoints/code-target, checkpoints/code-draft and issue18/ reports + logs, split at 15 MiB).
# Unpack outside the repository (issue18/ must not travel with the working tree), then replace the pair:
#   mkdir -p /tmp/r18 && cat $FILES_AT/results.tgz.part-* | tar -xz -C /tmp/r18
#   rm -rf checkpoints/code-target checkpoints/code-draft && cp -r /tmp/r18/checkpoints/code-* checkpoints/
#   cp /tmp/r18/issue18/kv_quality.json benchmarks/results/kv_quality.json
set -u
source "$(dirname "$0")/stages.sh"

# Milestones in seconds from START: the corpus, both trainings, the distillation, everything.
if [ "$SMOKE" = 1 ]; then
  DATA_END=600 TRAIN_END=1200 DISTIL_END=1500 END_S=3000 MARGIN=0
  DATA_ARGS="--max-files 3 --max-package-bytes 100000 --tokenizer-bytes 2000000"
  TARGET_PRESET=smoke DRAFT_PRESET=smoke DISTIL_PRESET=smoke
  CAL_ARGS="--tokens 2048 --seq-len 512"; KVQ_ARGS="--windows 1 --only none oscar"
  PQ_ARGS="--prompts 2 --new-tokens 16 --max-val-bytes 20000"
else
  DATA_END=100 TRAIN_END=345 DISTIL_END=465 END_S=555 MARGIN=40
  DATA_ARGS=""
  TARGET_PRESET=target DRAFT_PRESET=draft DISTIL_PRESET=draft-distil
  CAL_ARGS="--tokens 131072 --seq-len 2048"; KVQ_ARGS="--windows 4"
  PQ_ARGS="--prompts 32 --new-tokens 128"
fi

gpu0() {
  stage target "$TRAIN_END" env CUDA_VISIBLE_DEVICES=0 "$PY" -m jspec.train.train --preset "$TARGET_PRESET" \
    --data "$W/data" --out "$W/runs/target" --export "$NEW/code-target" --time-budget "$(loop_budget "$TRAIN_END")"
  cp "$W/runs/target/metrics.json" "$REP/target_train.json" 2>/dev/null
  touch "$W/target.done"
  [ -f "$NEW/code-target/model.safetensors" ] || return
  # The new target's bits per byte and repetition need no rotations: beside calibration + KV quality.
  # shellcheck disable=SC2086
  stage new_target "$END_S" env CUDA_VISIBLE_DEVICES=0 "$PY" benchmarks/pair_quality.py --target "$NEW/code-target" \
    --data "$W/data" --only bpb repetition $PQ_ARGS --out "$REP/new_target.json" &
  # Calibration text as today: every 20th train-split stdlib file (corpus order).
  local files
  files=$("$PY" -c "
from jspec.train.data import stdlib_root, corpus_files, is_validation
root = stdlib_root()
print(' '.join(str(root / f) for f in [f for f in corpus_files(root) if not is_validation(f)][::20]))")
  # shellcheck disable=SC2086
  stage calibrate "$DISTIL_END" env CUDA_VISIBLE_DEVICES=0 "$PY" -m jspec.calibrate --model "$NEW/code-target" \
    --data $files $CAL_ARGS --out "$W/rotations.safetensors" \
    && mv "$W/rotations.safetensors" "$NEW/code-target/rotations.safetensors"
  # shellcheck disable=SC2086
  [ -f "$NEW/code-target/rotations.safetensors" ] && stage kv_quality "$END_S" env CUDA_VISIBLE_DEVICES=0 "$PY" \
    benchmarks/kv_quality.py --model "$NEW/code-target" --data "$W/data" $KVQ_ARGS --out "$REP/kv_quality.json"
  wait
}

gpu1() {
  # The old pair's metrics share GPU 1 with the draft's pre-training (a small model leaves it room).
  # shellcheck disable=SC2086
  stage old_pair "$TRAIN_END" env CUDA_VISIBLE_DEVICES=1 "$PY" benchmarks/pair_quality.py --target "$OLD/code-target" \
    --draft "$OLD/code-draft" --data "$W/data" --only bpb repetition tau $PQ_ARGS --out "$REP/old_pair.json" &
  stage draft_pretrain "$TRAIN_END" env CUDA_VISIBLE_DEVICES=1 "$PY" -m jspec.train.train --preset "$DRAFT_PRESET" \
    --data "$W/data" --out "$W/runs/draft" --export "$W/draft-pre" --time-budget "$(loop_budget "$TRAIN_END")"
  cp "$W/runs/draft/metrics.json" "$REP/draft_pretrain.json" 2>/dev/null
  wait
  while [ ! -f "$W/target.done" ] && [ "$(now)" -lt "$DISTIL_END" ]; do sleep 2; done
  if [ -f "$NEW/code-target/model.safetensors" ] && [ -f "$W/draft-pre/model.safetensors" ]; then
    stage distil "$DISTIL_END" env CUDA_VISIBLE_DEVICES=1 "$PY" -m jspec.train.train --preset "$DISTIL_PRESET" \
      --data "$W/data" --init "$W/draft-pre" --teacher "$NEW/code-target" --out "$W/runs/distil" \
      --export "$NEW/code-draft" --time-budget "$(loop_budget "$DISTIL_END")"
    cp "$W/runs/distil/metrics.json" "$REP/draft_distil.json" 2>/dev/null
  fi
  if [ ! -f "$NEW/code-draft/model.safetensors" ] && [ -f "$W/draft-pre/model.safetensors" ]; then
    log "no distilled draft: shipping the pre-trained one"
    rm -rf "$NEW/code-draft" && cp -r "$W/draft-pre" "$NEW/code-draft"
  fi
  [ -f "$NEW/code-target/model.safetensors" ] && [ -f "$NEW/code-draft/model.safetensors" ] || return
  # The rotations are in place or given up on by now: calibration ends by DISTIL_END.
  # shellcheck disable=SC2086
  stage new_pair "$END_S" env CUDA_VISIBLE_DEVICES=1 "$PY" benchmarks/pair_quality.py --target "$NEW/code-target" \
    --draft "$NEW/code-draft" --data "$W/data" --only tau agree $PQ_ARGS --out "$REP/new_pair.json"
}


log "start: work dir $W, smoke=$SMOKE, $(nproc) cores"
{ nvidia-smi -L; "$PY" -c "import importlib.metadata as m, sys; print(sys.version); \
print({p: m.version(p) for p in ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'tokenizers', 'numpy')})"; } \
  > "$W/logs/env.log" 2>&1
cp -r checkpoints "$OLD"  # the old pair, measured against the new one
# shellcheck disable=SC2086
if stage data "$DATA_END" "$PY" -m jspec.train.data --out "$W/data" $DATA_ARGS; then
  gpu0 & P0=$!
  gpu1 & P1=$!
  wait "$P0" "$P1"
else
  log "no corpus: nothing to train"
fi
pack
