# Session 12, device call 3: XLA's Triton GEMMs off (cuBLAS only, no candidate kernels to compile) and a capped
# autotuning search, at run time (8B decode step, in one call with the default) and at compile time (the cold
# README command; the 8B + draft program, whose run_s is a 2K prefill and 256 tokens at K = 4); XLA's kernel
# cache ("all" XLA caches) for the cold README command.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
C=int2:1:131072,bf16:1:131072,int2:8:32768,bf16:8:32768
el "8B step: default, Triton GEMMs off, max 4 solutions"
timeout 70 python benchmarks/step_ab.py --tag default --cases $C --profile "" --out $OUT/step_default.json 2>&1 | grep "ms/step"
XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 70 python benchmarks/step_ab.py --tag notriton --cases $C \
  --profile "" --out $OUT/step_notriton.json 2>&1 | grep "ms/step"
XLA_FLAGS=--xla_gpu_autotune_max_solutions=4 timeout 70 python benchmarks/step_ab.py --tag max4 --cases $C \
  --profile "" --out $OUT/step_max4.json 2>&1 | grep "ms/step"
el "8B + draft cold: Triton GEMMs off"
XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 80 python benchmarks/startup.py --no-readme --cases 8b+draft \
  --budget 70 --out $OUT/startup_notriton.json 2>&1 | tail -3
el "cold README --lookahead 2: default, Triton off; auto with Triton off + all XLA caches; default + all caches"
timeout 50 python benchmarks/results/logs12/cold_census.py --cold-only --lookahead 2 --out $OUT/census_k2.json 2>&1 | head -1
timeout 50 python benchmarks/results/logs12/cold_census.py --cold-only --lookahead 2 \
  --env XLA_FLAGS=--xla_gpu_enable_triton_gemm=false --out $OUT/census_k2_notriton.json 2>&1 | head -1
timeout 50 python benchmarks/results/logs12/cold_census.py --cold-only --env XLA_FLAGS=--xla_gpu_enable_triton_gemm=false \
  --env JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=all --out $OUT/census_notriton_all.json 2>&1 | head -6
timeout 60 python benchmarks/results/logs12/cold_census.py --cold-only --env JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=all \
  --out $OUT/census_all.json 2>&1 | head -6
el done
