#!/usr/bin/env bash
# Issue 18, round 2, in one unattended call on an nvidia-h200-x2 (2 GPUs, 32 cores), ending by END_S:
#   corpus (round-1 tokenizer, train split quality-filtered) on the CPU cores -> the round-1 target
#   continued data-parallel on both GPUs -> GPU 0: OSCAR rotations, KV quality, the new target's and
#   the round-1 pair's metrics || GPU 1: the round-1 draft distilled from the new target, the new
#   pair's metrics -> $OUT. "old" in the reports is the round-1 pair (checkpoints/ as carried).
# Every stage runs under `timeout` with a budget taken from fixed milestones (seconds from the start),
# so the call cannot overrun; whatever finished is packed into $OUT even when a later stage fails.
#
#   bash tools/retrain_pair2.sh                       # on the device ($OUT given by the device tool)
#   SMOKE=1 OUT=/tmp/o bash tools/retrain_pair2.sh    # CPU check: tiny corpus, tiny shapes, 2 fake devices
#   UNLIKELIHOOD=0 bash tools/retrain_pair2.sh        # the target without the unlikelihood term
#
# $OUT: log.txt (stage timeline), metrics.json (summary of every report), results.tgz.part-NN (a tar
# of checkpoints/code-target, checkpoints/code-draft and issue18/ reports + logs, split at 15 MiB).
# Unpack outside the repository (issue18/ must not travel with the working tree), then replace the pair:
#   mkdir -p /tmp/r18 && cat $FILES_AT/results.tgz.part-* | tar -xz -C /tmp/r18
#   rm -rf checkpoints/code-target checkpoints/code-draft && cp -r /tmp/r18/checkpoints/code-* checkpoints/
#   cp /tmp/r18/issue18/kv_quality.json benchmarks/results/kv_quality.json
set -u
source "$(dirname "$0")/stages.sh"
# Weight of the token-level unlikelihood term in the target's loss (jspec.train.train.unlikelihood_losses,
# the last 32 positions): the training-time remedy for greedy repetition; 0 turns it off.
UNLIKELIHOOD=${UNLIKELIHOOD:-0.5}

# Milestones in seconds from START: the corpus, the target, the distillation, everything.
if [ "$SMOKE" = 1 ]; then
  DATA_END=600 TRAIN_END=1200 DISTIL_END=1500 END_S=3000 MARGIN=0
  DATA_ARGS="--max-files 3 --max-package-bytes 100000"
  TARGET_PRESET=smoke DISTIL_PRESET=smoke
  BOTH="env JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=2" GPU0="env" GPU1="env"
  CAL_ARGS="--tokens 2048 --seq-len 512"; KVQ_ARGS="--windows 1 --only none oscar"
  PQ_ARGS="--prompts 2 --new-tokens 16 --max-val-bytes 20000"
else
  DATA_END=100 TRAIN_END=345 DISTIL_END=465 END_S=555 MARGIN=40
  DATA_ARGS=""
  TARGET_PRESET=target-continue DISTIL_PRESET=draft-distil
  BOTH="env CUDA_VISIBLE_DEVICES=0,1" GPU0="env CUDA_VISIBLE_DEVICES=0" GPU1="env CUDA_VISIBLE_DEVICES=1"
  CAL_ARGS="--tokens 131072 --seq-len 2048"; KVQ_ARGS="--windows 4"
  PQ_ARGS="--prompts 32 --new-tokens 128"
fi

# SMOKE only: a tiny stand-in for the round-1 pair, in the smoke shapes, so --init has matching shapes.
smoke_round1() {
  for m in code-target code-draft; do
    rm -rf "${OLD:?}/$m"
    "$PY" -m jspec.train.train --preset smoke --steps 2 --data "$W/data" --out "$W/runs/round1-$m" --export "$OLD/$m" \
      > "$W/logs/round1-$m.log" 2>&1 || return
  done
}

target() {
  local run=$W/runs/target
  # shellcheck disable=SC2086
  stage target "$TRAIN_END" $BOTH "$PY" -m jspec.train.train --preset "$TARGET_PRESET" --init "$OLD/code-target" \
    --unlikelihood "$UNLIKELIHOOD" --data "$W/data" --out "$run" --export "$NEW/code-target" --time-budget "$(loop_budget "$TRAIN_END")"
  # Should the two-GPU run fail early (its collectives are the one untried part), one GPU takes the rest.
  if [ ! -f "$NEW/code-target/model.safetensors" ] && [ "$(left "$TRAIN_END")" -gt 120 ]; then
    run=$W/runs/target-1gpu
    # shellcheck disable=SC2086
    stage target_1gpu "$TRAIN_END" $GPU0 "$PY" -m jspec.train.train --preset "$TARGET_PRESET" --init "$OLD/code-target" \
      --unlikelihood "$UNLIKELIHOOD" --data "$W/data" --out "$run" --export "$NEW/code-target" --time-budget "$(loop_budget "$TRAIN_END")"
  fi
  cp "$run/metrics.json" "$REP/target_train.json" 2>/dev/null
}

gpu0() {
  # The round-1 pair's and the new target's metrics beside calibration + KV quality (small loads).
  # shellcheck disable=SC2086
  stage old_pair "$END_S" $GPU0 "$PY" benchmarks/pair_quality.py --target "$OLD/code-target" \
    --draft "$OLD/code-draft" --data "$W/data" --only bpb repetition tau $PQ_ARGS --out "$REP/old_pair.json" &
  # shellcheck disable=SC2086
  stage new_target "$END_S" $GPU0 "$PY" benchmarks/pair_quality.py --target "$NEW/code-target" \
    --data "$W/data" --only bpb repetition $PQ_ARGS --out "$REP/new_target.json" &
  # Calibration text as in round 1: every 20th train-split stdlib file (corpus order).
  local files
  files=$("$PY" -c "
from jspec.train.data import stdlib_root, corpus_files, is_validation
root = stdlib_root()
print(' '.join(str(root / f) for f in [f for f in corpus_files(root) if not is_validation(f)][::20]))")
  # shellcheck disable=SC2086
  stage calibrate "$DISTIL_END" $GPU0 "$PY" -m jspec.calibrate --model "$NEW/code-target" \
    --data $files $CAL_ARGS --out "$W/rotations.safetensors" \
    && mv "$W/rotations.safetensors" "$NEW/code-target/rotations.safetensors"
  touch "$W/calibrate.done"
  # shellcheck disable=SC2086
  [ -f "$NEW/code-target/rotations.safetensors" ] && stage kv_quality "$END_S" $GPU0 "$PY" \
    benchmarks/kv_quality.py --model "$NEW/code-target" --data "$W/data" $KVQ_ARGS --out "$REP/kv_quality.json"
  wait
}

gpu1() {
  # The round-1 draft, distilled from the new target: no pre-training needed.
  # shellcheck disable=SC2086
  distil_draft $GPU1
  # Waits for the rotations (in place or given up on by DISTIL_END): the pair is measured as it ships.
  while [ ! -f "$W/calibrate.done" ] && [ "$(now)" -lt "$DISTIL_END" ]; do sleep 2; done
  # shellcheck disable=SC2086
  stage new_pair "$END_S" $GPU1 "$PY" benchmarks/pair_quality.py --target "$NEW/code-target" \
    --draft "$NEW/code-draft" --data "$W/data" --only tau agree $PQ_ARGS --out "$REP/new_pair.json"
}


log "start: work dir $W, smoke=$SMOKE, unlikelihood=$UNLIKELIHOOD, $(nproc) cores"
{ nvidia-smi -L; "$PY" -c "import importlib.metadata as m, sys; print(sys.version); \
print({p: m.version(p) for p in ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'tokenizers', 'numpy')})"; } \
  > "$W/logs/env.log" 2>&1
cp -r checkpoints "$OLD"  # the round-1 pair: the starting point, and what the new pair is measured against
# shellcheck disable=SC2086
if stage data "$DATA_END" "$PY" -m jspec.train.data --out "$W/data" --tokenizer "$OLD/code-target" --filter $DATA_ARGS \
    && { [ "$SMOKE" != 1 ] || smoke_round1; } && target && [ -f "$NEW/code-target/model.safetensors" ]; then
  gpu0 & P0=$!
  gpu1 & P1=$!
  wait "$P0" "$P1"
else
  log "no corpus or no new target: nothing more to measure"
fi
pack
