# Session 17, device call 4: call 3's failing GPU test, bisected (this tree and session 16's), then the
# kernel-alone ratio figures are not re-run (no time).
export PYTHONUNBUFFERED=1
for n in 1 5; do
  PYTHONPATH=. timeout 100 python benchmarks/results/logs17/bisect.py $n 2>&1 | grep -v Warn | tail -6
  PYTHONPATH=.before/prev timeout 100 python benchmarks/results/logs17/bisect.py $n 2>&1 | grep -v Warn | tail -6
done
