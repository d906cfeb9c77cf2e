# Session 12, device call 2: what XLA's GEMM autotuning costs at compile time and buys at run time.
# Compile phases (default flags, then autotune level 0) of the shipped program and the 8B + draft program
# (whose run_s, a 2K-token prefill and 256 tokens at K = 4, is the run-time check); the decode step at both
# settings in one call; the cold README command with autotune level 1 and with XLA's Triton GEMMs off.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for flags in "" "--xla_gpu_autotune_level=0"; do
  el "startup phases, XLA_FLAGS='$flags'"
  XLA_FLAGS="$flags" timeout 130 python benchmarks/startup.py --phases --no-readme --cases shipped,8b+draft \
    --budget 120 --out $OUT/startup_at${flags: -1}.json 2>&1 | tail -6
done
el "step: default flags, then autotune level 0"
timeout 60 python benchmarks/step_ab.py --tag default --cases int2:1:131072,bf16:1:131072,int2:8:32768 --profile "" \
  --out $OUT/step_default.json 2>&1 | grep "ms/step"
XLA_FLAGS=--xla_gpu_autotune_level=0 timeout 60 python benchmarks/step_ab.py --tag autotune0 \
  --cases int2:1:131072,bf16:1:131072,int2:8:32768 --profile "" --out $OUT/step_at0.json 2>&1 | grep "ms/step"
el "cold README: autotune level 1; Triton GEMMs off"
timeout 60 python benchmarks/results/logs12/cold_census.py --cold-only --env XLA_FLAGS=--xla_gpu_autotune_level=1 \
  --out $OUT/census_at1.json 2>&1 | tail -6
timeout 60 python benchmarks/results/logs12/cold_census.py --cold-only --env XLA_FLAGS=--xla_gpu_enable_triton_gemm=false \
  --out $OUT/census_notriton.json 2>&1 | tail -6
el done
