# Call 1, session 7: issue 14. XLA autotuning flags vs compile time (8B + draft) and step time; README under
# the flag; a cProfile of the warm README command.
export PYTHONPATH=.
V_default=""
V_al0="--xla_gpu_autotune_level=0"
V_notriton="--xla_gpu_enable_triton_gemm=false"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
for v in default al0 notriton; do
  var=V_$v
  echo "=== startup 8b+draft $v: ${!var}"
  XLA_FLAGS="${!var}" timeout 160 python benchmarks/startup.py --no-readme --cases 8b+draft --budget 140 --out $OUT/startup_8bd_$v.json 2>&1 | tail -4
done
for v in default al0; do
  var=V_$v
  echo "=== decode $v"
  XLA_FLAGS="${!var}" timeout 130 python benchmarks/decode.py --contexts 8192,131072 --batches 1,8 --time-budget 90 --out $OUT/decode_$v.json 2>&1 | grep -v "^ *$" | tail -12
done
echo "=== README/job/shipped under al0"
XLA_FLAGS="$V_al0" timeout 150 python benchmarks/startup.py --cases shipped --budget 130 --out $OUT/startup_shipped_al0.json 2>&1 | tail -8
echo "=== README cold (default cache), then the cProfile of a warm one"
(time python -m jspec.generate "def fibonacci(n):") 2>&1 | tail -5
(time python -m jspec.generate "def fibonacci(n):") 2>&1 | tail -5
python -P .before/prof_readme.py > /dev/null 2> $OUT/prof_warm.txt; head -3 $OUT/prof_warm.txt
