# Session 9, call 5: the round-3 pair (checkpoints/ as committed after call 4). Issue 14: the README command cold,
# then warm with Python's default bytecode cache (the device image sets PYTHONDONTWRITEBYTECODE=1, so every
# process there compiles ~360 sources: 0.37 s in call 2's profile) and as the image has it. Issue 19 rows on the
# new pair: the head at auto vs plain, batch 1 over 8 prompts, INT2, held-out then edit-style.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( 315 - ($(date +%s) - t0) )); }
export JSPEC_CACHE_DIR=/tmp/c/jspec
readme() {  # readme NAME [env...]: one README command, its wall time and stats line
  local name=$1; shift; local s=$(date +%s.%N)
  env "$@" timeout 100 python -m jspec.generate "def fibonacci(n):" --compile-cache /tmp/c/xla > /tmp/readme_$name.txt 2> /tmp/readme_$name.err
  echo "$name wall $(python -c "print(f'{$(date +%s.%N) - $s:.3f}')") s | $(tail -1 /tmp/readme_$name.txt)"
}
readme cold
grep -v "^\[" /tmp/readme_cold.err | cut -c1-200 | tail -5
for i in 1 2 3 4 5; do readme bytecode$i -u PYTHONDONTWRITEBYTECODE; done
for i in 1 2 3; do readme nobytecode$i PYTHONDONTWRITEBYTECODE=1; done
for f in /tmp/readme_*.txt; do head -n -1 $f | md5sum; done | sort | uniq -c
head -n -1 /tmp/readme_cold.txt > $OUT/readme_text.txt
el "head vs plain, batch 1, INT2, held-out"
timeout 170 python benchmarks/speculative.py --modes head --kvs int2 --batches 1 --parts auto --workloads held_out \
  --budget-s 110 --out $OUT/spec_head_b1_int2_heldout_s9.json 2>&1 | grep -v "^{" | tail -3
el "head vs plain, batch 1, INT2, edit-style"
timeout $(left) python benchmarks/speculative.py --modes head --kvs int2 --batches 1 --parts auto --workloads edit \
  --budget-s 60 --out $OUT/spec_head_b1_int2_edit_s9.json 2>&1 | grep -v "^{" | tail -3
el done
