# Prepared in session 11 for the next device call (not run; about 7 minutes): where the cold README command's
# 30-34 s go (issue 14's 15 s goal), program by program, and the shipped program's compile phases; then the
# INT2 step A/B and every GPU test.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "README command cold then warm, per-program trace / lower / compile (JAX_LOG_COMPILES)"
timeout 200 python benchmarks/results/logs11/cold_census.py --out $OUT/cold_census.json 2>&1 | tail -24
el "shipped pair's generate program: compile phases, cold and warm"
timeout 150 python benchmarks/startup.py --phases --no-readme --cases shipped --budget 140 \
  --out $OUT/startup_shipped.json 2>&1 | tail -4
# Issue 16 item 3: the step with R_K kept transposed in f32 (the default since session 11's last commits:
# its profile should show no per-layer rot_k transpose), and the split path's weighted sums as two plain
# reductions against the variadic one.
el "step: default, profiled; then --plain-sums"
timeout 120 python benchmarks/step_ab.py --tag default --cases int2:1:131072,int2:8:32768,bf16:1:131072 \
  --profile int2:1:131072 --out $OUT/step_default.json 2>&1 | grep -v "^{" | tail -5
timeout 90 python benchmarks/step_ab.py --tag plain-sums --plain-sums --cases int2:1:131072,int2:8:32768 \
  --profile int2:1:131072 --out $OUT/step_plain_sums.json 2>&1 | grep -v "^{" | tail -4
el "GPU tests"
timeout 250 python -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -3
el done
