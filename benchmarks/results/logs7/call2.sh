# Call 2, session 7: issue 19 (head rows over 8 prompts at batch 1, batch 8) and issue 14 (README cold, before/after
# the side-by-side compile of lookahead's costs; a cProfile of the warm README command).
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
echo "=== b: head sweep + auto, batch 1 over 8 prompts, int2 and bf16"
timeout 290 python benchmarks/speculative.py --modes head --kvs int2,bf16 --batches 1 --parts auto,sweep --budget-s 240 \
  --out $OUT/spec_head_b1_s7.json 2>&1 | grep -v "^{" | tail -8
echo "=== c: head and model, batch 8, int2"
timeout 150 python benchmarks/speculative.py --modes head,model --kvs int2 --batches 8 --parts auto,fixed --budget-s 100 \
  --out $OUT/spec_b8_s7.json 2>&1 | grep -v "^{" | tail -6
echo "=== a: README cold: before (7cf4efd) then after, fresh caches each; then warm (after) and its cProfile"
ln -s $PWD/checkpoints .before/prev/checkpoints
for who in before after; do
  dir=$PWD; [ $who = before ] && dir=$PWD/.before/prev
  c=$(mktemp -d)
  TIMEFORMAT="$who cold wall %R s"
  time (cd $dir && JSPEC_CACHE_DIR=$c/jspec PYTHONPATH=$dir python -m jspec.generate "def fibonacci(n):" --compile-cache $c/xla 2>&1 | tail -1)
done
for i in 1 2; do
  TIMEFORMAT="after warm wall %R s"
  time (JSPEC_CACHE_DIR=$c/jspec python -m jspec.generate "def fibonacci(n):" --compile-cache $c/xla 2>&1 | tail -1)
done
JSPEC_CACHE_DIR=$c/jspec python -P .before/prof_readme.py "def fibonacci(n):" --compile-cache $c/xla > /dev/null 2> $OUT/prof_warm.txt; head -2 $OUT/prof_warm.txt
