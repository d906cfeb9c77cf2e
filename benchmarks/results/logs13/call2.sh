# Session 13, call 2. Issue 16: window_merge as units over all SMs (window_parts: one program per block of
# splits or slots, then window_merge joins the parts): its GPU tests, the 8B step with it and without it;
# INT2 and BF16 at 32K, batch 1 and each mode's largest batch. Issue 14: the cold README command with XLA's
# autotuning results shipped (engine.seed_autotune; autotune_seed.py makes them in run 1 and times runs 2-3);
# the 8B + draft compile with the fewer kernels per layer.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks:benchmarks/results/logs12
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "window_merge GPU tests"
timeout 90 python -m pytest -q -m gpu -p no:cacheprovider tests/test_window_merge.py 2>&1 | tail -4
el "step: window units (default), profiled; then --xla-window"
timeout 90 python benchmarks/step_ab.py --tag units --cases int2:1:131072,int2:8:32768,bf16:1:131072 \
  --profile int2:1:131072 --out $OUT/step_units.json 2>&1 | grep -v "^{" | tail -24
timeout 60 python benchmarks/step_ab.py --tag xla-window --xla-window --cases int2:1:131072,int2:8:32768 \
  --profile "" --out $OUT/step_xla_window.json 2>&1 | grep -v "^{" | tail -4
el "autotune seed"
timeout 180 python benchmarks/results/logs13/autotune_seed.py --out $OUT 2>&1 | tail -24
el "decode.py 32K: batch 1 and each mode's largest"
timeout 110 python benchmarks/decode.py --contexts 32768 --batches 1 --time-budget 90 --out $OUT/decode_32k.json 2>&1 | tail -6
el "8B + draft cold and warm"
timeout 90 python benchmarks/startup.py --phases --no-readme --no-job --cases 8b+draft --budget 80 \
  --out $OUT/startup_8b.json 2>&1 | tail -3
el done
