# Session 25, call 3 (issue 14): where the 8B + draft cold compile goes. Call 1's --phases: 172 CompileSingleModule
# (11.1 s) and PTX->CUBIN (5.9 s) inside CompileModuleToLlvmIr (22.3 s): one kernel compile per Triton fusion. Are
# they built on several threads (host_events now gives each event's longest and its thread count), and how many
# distinct Triton kernels does the program hold (the optimized HLO dumped; triton_kernels.py strips names)?
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "phases"; timeout 150 python benchmarks/startup.py --phases --cases 8b+draft --no-readme --no-job \
  --out $OUT/startup_phases.json 2>&1 | grep "^| 8b+draft"
python -c "
import json; d = json.load(open('$OUT/startup_phases.json'))
for r in d['cases'][0]['phases'][:25]: print(r)"
el "dump"; D=/tmp/dump; XLA_FLAGS="--xla_dump_to=$D --xla_dump_hlo_module_re=jit__start|jit__rounds" timeout 200 \
  python benchmarks/startup.py --cases 8b+draft --no-readme --no-job --out $OUT/startup_dump.json 2>&1 | grep "^| 8b+draft"
ls $D | wc -l; du -sh $D
python benchmarks/results/logs25/triton_kernels.py $D
mkdir -p $OUT/hlo && for f in $D/*after_optimizations.txt; do gzip -c $f > $OUT/hlo/$(basename $f).gz; done
ls -la $OUT/hlo | head
el done
