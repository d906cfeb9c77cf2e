# Session 27, call 1 (issue 14's second process, 1.8-2.4 s against the goal's 1 s): session 26's prepared `a` (the
# 8B + draft parts' HLO dump read by thunks.py; Engine.compile traced cold and warm: each load's span says whether the
# three parts' loads overlap), then the same program with XLA's command buffers off (the load's
# CommandBufferConversionPass, 0.55 s in session 26's call 3), and the step's cost of that, alternated.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
lscpu | grep -m1 "Model name"
el "engine phases"; timeout 120 python benchmarks/startup.py --engine --phases --cases 8b+draft --no-readme \
  --no-job --out $OUT/startup_phases.json 2>&1 | grep "^| 8b+draft"
python -c "
import json; d = json.load(open('$OUT/startup_phases.json'))
for c in d['cases']:
    print(c['process'], c.get('compile_s'))
    for e in c.get('phases', [])[:12]: print('  ', e)"
el "no command buffers"; XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 120 python benchmarks/startup.py --engine \
  --cases 8b+draft --no-readme --no-job --out $OUT/startup_nocb.json 2>&1 | grep "^| 8b+draft"
for r in 1 2; do
  el "step default $r"; timeout 60 python benchmarks/step_ab.py --tag cb$r --jspec-root . --cases int2:1:131072,bf16:1:131072 \
    --profile "" --out $OUT/step_cb$r.json 2>&1 | grep "ms/step"
  el "step no command buffers $r"; XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 60 python benchmarks/step_ab.py \
    --tag nocb$r --jspec-root . --cases int2:1:131072,bf16:1:131072 --profile "" --out $OUT/step_nocb$r.json 2>&1 | grep "ms/step"
done
left=$(( 560 - $(date +%s) + t0 ))
el "dump (${left}s left)"; [ $left -gt 70 ] && XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_(_start|_rounds|draft_prefill)" \
  timeout $((left - 20)) python benchmarks/startup.py --cases 8b+draft --no-readme --no-job --out $OUT/startup_dump.json 2>&1 | \
  grep "^| 8b+draft"
ls /tmp/dump 2>/dev/null | grep -c after_optimizations
timeout 20 python benchmarks/results/logs26/thunks.py /tmp/dump 2>&1 | head -60
el done
