# Session 11, call 2: the generate program as two parts compiled side by side (Engine.compile) and the fused
# INT2 commit on by default (kvcache.FUSED_COMMIT = None): GPU tests of both, start-up before/after, the step
# with and without the fused commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "GPU tests: program store, fused commit"
timeout 120 python -m pytest -q -m gpu tests/test_startup.py tests/test_int2_commit.py -p no:cacheprovider 2>&1 | tail -2
el "start-up, two parts (README cold/warm, the 24-prompt job, 8B + draft cold/warm)"
timeout 260 python benchmarks/startup.py --phases --budget 240 --cases 8b+draft --out $OUT/startup_parts.json 2>&1 | tail -8
el "start-up, one program (before), 8B + draft"
timeout 150 python benchmarks/startup.py --phases --one-program --budget 130 --no-readme --cases 8b+draft --out $OUT/startup_one.json 2>&1 | tail -4
el "step: fused commit (default) against the jnp commit"
timeout 100 python benchmarks/step_ab.py --tag fused --cases int2:1:131072,bf16:1:131072,int2:8:32768 --profile "" --out $OUT/step_fused.json 2>&1 | grep -v "^{" | tail -6
timeout 70 python benchmarks/step_ab.py --tag jnp --jnp-commit --cases int2:1:131072,int2:8:32768 --profile "" \
  --out $OUT/step_jnp.json 2>&1 | grep -v "^{" | tail -4
el done
