# Issue 14: the program store (GPU only) - its GPU test, then the README command cold and warm x2, before (no store)
# and after, fresh caches each; the printed texts must be identical; then one cold run with autotuning off (diagnostic).
ln -sfn $PWD/checkpoints .before/prev/checkpoints
timeout 90 python -m pytest -q -m gpu tests/test_startup.py -p no:cacheprovider -k warm_start 2>&1 | tail -2
for who in before after; do
  dir=$PWD; [ $who = before ] && dir=$PWD/.before/prev
  c=$(mktemp -d)
  for run in cold warm1 warm2; do
    TIMEFORMAT="$who $run wall %R s"
    time (cd $dir && JSPEC_CACHE_DIR=$c/jspec PYTHONPATH=$dir timeout 100 python -m jspec.generate "def fibonacci(n):" \
      --compile-cache $c/xla > /tmp/readme_${who}_$run.txt 2>&1; tail -1 /tmp/readme_${who}_$run.txt)
  done
done
for f in /tmp/readme_*.txt; do head -n -1 $f | md5sum; done | sort | uniq -c
c=$(mktemp -d); TIMEFORMAT="after cold, autotune level 0: wall %R s"
time (XLA_FLAGS=--xla_gpu_autotune_level=0 JSPEC_CACHE_DIR=$c/jspec timeout 100 python -m jspec.generate "def fibonacci(n):" \
  --compile-cache $c/xla 2>&1 | tail -1)
