# Session 12, device call 1: where the cold README command's time goes (issue 14's 15 s goal): per-program
# census cold and warm, and cold with XLA's autotuning off / with a fixed K (no lookahead measurement); the
# shipped program's compile phases; the INT2 step A/B (R_K transposed in f32, plain vs variadic sums);
# every GPU test (covers session 11's changes after its last call).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "README command cold then warm, per program"
timeout 150 python benchmarks/results/logs12/cold_census.py --out $OUT/census.json 2>&1 | tail -20
el "cold, autotune level 0"
timeout 80 python benchmarks/results/logs12/cold_census.py --cold-only --env XLA_FLAGS=--xla_gpu_autotune_level=0 \
  --out $OUT/census_noautotune.json 2>&1 | tail -10
el "cold, --lookahead 2"
timeout 80 python benchmarks/results/logs12/cold_census.py --cold-only --lookahead 2 \
  --out $OUT/census_k2.json 2>&1 | tail -10
el "step: default, profiled; then --plain-sums"
timeout 100 python benchmarks/step_ab.py --tag default --cases int2:1:131072,int2:8:32768,bf16:1:131072 \
  --profile int2:1:131072 --out $OUT/step_default.json 2>&1 | grep -v "^{" | tail -5
timeout 80 python benchmarks/step_ab.py --tag plain-sums --plain-sums --cases int2:1:131072,int2:8:32768 \
  --profile int2:1:131072 --out $OUT/step_plain_sums.json 2>&1 | grep -v "^{" | tail -4
el "GPU tests"
timeout 240 python -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -3
el done
