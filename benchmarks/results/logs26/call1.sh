# Session 26, call 1 (issue 14): Engine.compile cold of the 8B + draft program (trace and lower included, the CLI's
# compile_s), with a second run (rerun_s), on one host, alternated A B C C B A:
#   A --two-parts: the draft's prefill inside the start part (before session 25's d2ab588)
#   B the default: three parts (the draft's prefill a part of its own)
#   C three parts and the rounds' fused commit as a kernel per 8 layers (kvcache.COMMIT_GROUP = 8)
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
lscpu | grep -m1 "Model name"; nproc
for s in --two-parts "" "--commit-group 8" "--commit-group 8" "" --two-parts; do
  tag=$(echo "x$s" | tr -dc 'a-z0-9'); el "engine ${s:-default}"
  timeout 95 python benchmarks/startup.py --engine --rerun --cases 8b+draft --no-readme --no-job $s \
    --out $OUT/engine_${tag}_$(date +%s).json 2>&1 | grep "^| 8b+draft | cold"
done
el done
