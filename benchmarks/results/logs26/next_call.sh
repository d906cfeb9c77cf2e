# Prepared in session 26 for the next (not run). `bash next_call.sh a|b`:
# `a` (~5 min), issue 14's second process (1.8-2.4 s, goal 1 s): what the programs hold, per layer. The 8B + draft
#   parts compiled with an HLO dump, read by thunks.py (thunk instructions per named scope and layer, and by kind:
#   XLA's legacy load emits one per instruction of the entry and its loops); the dump stays on the device. Then
#   Engine.compile traced (startup.py --engine --phases) twice: its warm row is the second process's read from jspec's
#   store; each event's span against its total says whether the parts' loads overlap.
# `b` (~5 min), issue 16's 1.7x (0.05-0.08 ms short): the INT2 step at B 1 / 128K by GPU kernel kind
#   (profile_step.py; its JSON and HLO come back), then two INT2 / BF16 pairs.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
case "$1" in
a)
  el "dump"; XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_(_start|_rounds|draft_prefill)" \
    timeout 150 python benchmarks/startup.py --cases 8b+draft --no-readme --no-job --out $OUT/startup_dump.json 2>&1 | \
    grep "^| 8b+draft"
  python benchmarks/results/logs26/thunks.py /tmp/dump
  for r in 1 2; do
    el "engine phases $r"; timeout 120 python benchmarks/startup.py --engine --phases --cases 8b+draft --no-readme \
      --no-job --out $OUT/startup_phases_$r.json 2>&1 | grep "^| 8b+draft"
    python -c "
import json; d = json.load(open('$OUT/startup_phases_$r.json'))
for c in d['cases']:
    print(c['process'], c.get('compile_s'))
    for e in c.get('phases', [])[:10]: print('  ', e)"
  done ;;
b)
  el "profile"; timeout 150 python benchmarks/profile_step.py --out $OUT/profile --cases int2:1:131072 2>&1 | tail -25
  for r in 1 2; do
    el "pair $r"; timeout 80 python benchmarks/step_ab.py --tag rest$r --jspec-root . --cases int2:1:131072,bf16:1:131072 \
      --profile "" --out $OUT/step_rest$r.json 2>&1 | grep "ms/step"
  done ;;
*) echo "usage: bash next_call.sh a|b"; exit 2 ;;
esac
el done
