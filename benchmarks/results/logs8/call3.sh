# Session 8, call 3: issue 16 (the ALU variants: GPU tests, decode and verify A/B), issue 14 (the program store).
export PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "=== 16: bash benchmarks/results/logs8/call3_alu.sh"
timeout 380 bash benchmarks/results/logs8/call3_alu.sh 2>&1 | tail -45
el "=== 14: the program store"
timeout $(( 575 - ($(date +%s) - t0) )) bash .before/call3_store.sh 2>&1 | tail -20
el done
