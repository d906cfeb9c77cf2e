# Session 9, call 2: issue 14 - the warm README command before (HEAD 6f1578a: flax imported, JAX preallocating)
# and after (jspec.struct in place of flax.struct; the CLI sets XLA_PYTHON_CLIENT_PREALLOCATE=false unless set):
# one cold run each to fill fresh caches, then 5 warm runs of each, interleaved; the printed texts compared;
# then the after tree under cProfile, and a few diagnostics (bytecode cache, module loading).
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
ln -sfn $PWD/checkpoints .before/prev/checkpoints
python -c "import sys, os; print('dont_write_bytecode', sys.flags.dont_write_bytecode, 'pycache prefix', sys.pycache_prefix, 'CUDA_MODULE_LOADING', os.environ.get('CUDA_MODULE_LOADING'))"
readme() {  # readme TREE RUN: the README command in TREE with TREE's own caches; prints the wall time
  local dir=$PWD; [ $1 = before ] && dir=$PWD/.before/prev
  local s=$(date +%s.%N)
  (cd $dir && JSPEC_CACHE_DIR=/tmp/c_$1/jspec PYTHONPATH=$dir timeout 100 python -m jspec.generate "def fibonacci(n):" \
    --compile-cache /tmp/c_$1/xla > /tmp/readme_$1_$2.txt 2> /tmp/readme_$1_$2.err)
  echo "$1 $2 wall $(python -c "print(f'{$(date +%s.%N) - $s:.3f}')") s | $(tail -1 /tmp/readme_$1_$2.txt)"
}
for t in before after; do readme $t cold; done
for i in 1 2 3 4 5; do for t in before after; do readme $t warm$i; done; done
for f in /tmp/readme_*_*.txt; do head -n -1 $f | md5sum; done | sort | uniq -c
el "after, warm, under cProfile"
JSPEC_CACHE_DIR=/tmp/c_after/jspec PYTHONPATH=. timeout 60 python benchmarks/results/logs9/prof_warm.py $OUT/warm_prof_after.txt -- \
  "def fibonacci(n):" --compile-cache /tmp/c_after/xla > /dev/null 2>&1; head -1 $OUT/warm_prof_after.txt
for v in EAGER LAZY; do
  s=$(date +%s.%N); CUDA_MODULE_LOADING=$v JSPEC_CACHE_DIR=/tmp/c_after/jspec PYTHONPATH=. timeout 60 python -m jspec.generate \
    "def fibonacci(n):" --compile-cache /tmp/c_after/xla 2>&1 | tail -1
  echo "after warm, CUDA_MODULE_LOADING=$v: wall $(python -c "print(f'{$(date +%s.%N) - $s:.3f}')") s"
done
PYTHONPATH=. python -X importtime -c "import jspec.generate, jspec.engine" 2> /tmp/imp.txt; sort -t'|' -k2 -n /tmp/imp.txt | tail -5
el done
