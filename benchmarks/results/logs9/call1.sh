# Session 9, call 1: issue 14 - where the warm README command's 5.4 s go on the GPU (cold run to fill the caches,
# two warm runs, one under cProfile, the bare import and device start); issue 16 - the step with the small
# products as reductions (today) vs as GEMMs (--gemm-products), same run.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
c=$(mktemp -d); export JSPEC_CACHE_DIR=$c/jspec
R=(python -m jspec.generate "def fibonacci(n):" --compile-cache $c/xla)
for run in cold warm1 warm2; do
  TIMEFORMAT="README $run wall %R s"; time (timeout 100 "${R[@]}" > /tmp/readme_$run.txt 2> /tmp/readme_$run.err; tail -1 /tmp/readme_$run.txt)
done
head -n -1 /tmp/readme_cold.txt | md5sum; head -n -1 /tmp/readme_warm2.txt | md5sum
TIMEFORMAT="warm, JAX_PLATFORMS=cuda: wall %R s"; time (JAX_PLATFORMS=cuda timeout 60 "${R[@]}" 2>&1 | tail -1)
TIMEFORMAT="warm, no preallocation: wall %R s"; time (XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 60 "${R[@]}" 2>&1 | tail -1)
TIMEFORMAT="python -c pass: %R s"; time python -c pass
TIMEFORMAT="import jax: %R s"; time python -c "import jax"
TIMEFORMAT="import jax + devices: %R s"; time python -c "import jax; jax.devices()"
TIMEFORMAT="import jax + devices + one add: %R s"; time python -c "import jax, jax.numpy as jnp; (jnp.ones(4) + 1).block_until_ready()"
TIMEFORMAT="import jspec.generate, jspec.engine: %R s"; time python -c "import jspec.generate, jspec.engine"
TIMEFORMAT="warm under cProfile: wall %R s"; time (timeout 60 python benchmarks/results/logs9/prof_warm.py $OUT/warm_prof.txt -- "def fibonacci(n):" --compile-cache $c/xla 2>&1 | tail -1)
python -X importtime -c "import jspec.generate, jspec.engine" 2> /tmp/imp.txt; sort -t'|' -k2 -n /tmp/imp.txt | tail -12
el "issue 16: step A/B, small products as reductions vs GEMMs"
for tag in reductions gemm; do
  flag=""; [ $tag = gemm ] && flag=--gemm-products
  timeout 120 python benchmarks/step_ab.py --tag $tag $flag --cases int2:1:131072,int2:8:32768 --profile "" \
    --out $OUT/ab_$tag.json 2>&1 | grep -vi warn | grep "ms/step"
done
el done
