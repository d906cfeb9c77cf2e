# Shared by tools/retrain_pair{,2,3}.sh (sourced first): the work folders and the
# environment, time-bounded stages and the pack into $OUT. The caller sets MARGIN (its milestones).
# OUT, WORK, PY and SMOKE may come from the environment.
START=$(date +%s)
OUT=${OUT:-$PWD/out}
W=${WORK:-$(mktemp -d /tmp/issue18.XXXXXX)}
PY=${PY:-python3}
SMOKE=${SMOKE:-0}
NEW=$W/new/checkpoints  # the new pair
REP=$W/new/issue18      # its reports
OLD=$W/old              # the pair it replaces, measured beside it
mkdir -p "$OUT" "$NEW" "$REP" "$W/logs"
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false TOKENIZERS_PARALLELISM=true TQDM_MININTERVAL=10
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

now() { echo $(( $(date +%s) - START )); }
log() { echo "[$(now)s] $*" | tee -a "$OUT/log.txt"; }
left() { local t=$(( $1 - $(now) )); [ "$t" -gt 1 ] && echo "$t" || echo 1; }

# stage NAME UNTIL CMD...: CMD under timeout until milestone UNTIL; its output in logs/NAME.log.
stage() {
  local name=$1 until=$2; shift 2
  local budget; budget=$(left "$until")
  log "$name: start, ${budget}s left"
  timeout -k 5 "$budget" "$@" > "$W/logs/$name.log" 2>&1
  local rc=$?
  log "$name: rc=$rc$([ $rc = 124 ] && echo ' (timed out)')"
  return $rc
}

# The training loop's own budget: up to the milestone, less start-up and export.
loop_budget() { local t=$(( $(left "$1") - MARGIN )); [ "$t" -gt 5 ] && echo "$t" || echo 5; }

pack() {
  log "pack"
  mkdir -p "$REP/logs"
  for f in "$W"/logs/*.log; do tail -c 200000 "$f" > "$REP/logs/$(basename "$f")"; done
  cp "$W/data/meta.json" "$REP/corpus_meta.json" 2>/dev/null
  "$PY" tools/retrain_summary.py "$W/new" > "$OUT/metrics.json" 2> "$REP/logs/summary.log"
  cp "$OUT/metrics.json" "$REP/metrics.json"
  cp "$OUT/log.txt" "$REP/log.txt"
  tar -C "$W/new" -cf - checkpoints issue18 | gzip -1 > "$W/results.tgz"
  split -b 15M -d "$W/results.tgz" "$OUT/results.tgz.part-"
  log "done: $(ls "$OUT" | tr '\n' ' ')"
}

# distil_draft [ENV...]: the carried draft ($OLD) distilled from the new target until DISTIL_END (preset
# DISTIL_PRESET; ENV, e.g. `env CUDA_VISIBLE_DEVICES=1`, prefixes the command); the carried one ships if it fails.
distil_draft() {
  stage distil "$DISTIL_END" "$@" "$PY" -m jspec.train.train --preset "$DISTIL_PRESET" --data "$W/data" \
    --init "$OLD/code-draft" --teacher "$NEW/code-target" --out "$W/runs/distil" --export "$NEW/code-draft" \
    --time-budget "$(loop_budget "$DISTIL_END")"
  cp "$W/runs/distil/metrics.json" "$REP/draft_distil.json" 2>/dev/null
  if [ ! -f "$NEW/code-draft/model.safetensors" ]; then
    log "no distilled draft: shipping the carried one"
    rm -rf "$NEW/code-draft" && cp -r "$OLD/code-draft" "$NEW/code-draft"
  fi
}
