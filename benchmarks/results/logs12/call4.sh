# Session 12, device call 4: the shipped pair's speed and cold compile without XLA's autotuning (fixed K = 2,
# 512 new tokens, cold then warm, default flags then autotune level 0); the cold README command with XLA's
# LLVM module split for parallel compilation against the default (same call); the 8B + draft program's compile
# with that flag and without.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "shipped pair, --lookahead 2 --max-new-tokens 512: default, then autotune level 0"
timeout 60 python benchmarks/results/logs12/cold_census.py --lookahead 2 --max-new-tokens 512 \
  --out $OUT/census_k2_512.json 2>&1 | grep -E "^(cold|warm)"
timeout 60 python benchmarks/results/logs12/cold_census.py --lookahead 2 --max-new-tokens 512 \
  --env XLA_FLAGS=--xla_gpu_autotune_level=0 --out $OUT/census_k2_512_at0.json 2>&1 | grep -E "^(cold|warm)"
el "cold README: default, then LLVM module split"
timeout 60 python benchmarks/results/logs12/cold_census.py --cold-only --out $OUT/census_default.json 2>&1 | grep -E "^(cold|warm)"
timeout 60 python benchmarks/results/logs12/cold_census.py --cold-only --out $OUT/census_llvmpar.json \
  --env XLA_FLAGS=--xla_gpu_enable_llvm_module_compilation_parallelism=true 2>&1 | grep -E "^(cold|warm)"
el "8B + draft cold compile: default, then LLVM module split"
timeout 60 python benchmarks/startup.py --no-readme --cases 8b+draft --budget 50 --out $OUT/startup_default.json 2>&1 \
  | grep "8b+draft | cold"
XLA_FLAGS=--xla_gpu_enable_llvm_module_compilation_parallelism=true timeout 60 python benchmarks/startup.py --no-readme \
  --cases 8b+draft --budget 50 --out $OUT/startup_llvmpar.json 2>&1 | grep "8b+draft | cold"
el done
