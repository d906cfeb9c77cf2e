# Session 28, call 1: session 27's prepared next_call.sh b (slot tables), then a (issue 14's timers).
set -x
bash benchmarks/results/logs27/next_call.sh b
bash benchmarks/results/logs27/next_call.sh a
