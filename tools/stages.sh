# Shared by tools/retrain_pair.sh and tools/retrain_pair2.sh (sourced): time-bounded stages and the pack
# into $OUT. The caller sets START, OUT, W (work dir with logs/), NEW (the new tree: checkpoints/, issue18/),
# REP (the reports folder in it), PY and MARGIN.

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
