# Session 13, call 1. Issue 16: the BF16 window parts and the merge as one Pallas kernel per layer
# (pallas/window_merge.py): its GPU tests, the 8B step with it and without it (--xla-window); the goal rows
# not re-measured since session 8: 1M-token context at batch 1 and 4, the kernel alone's share of copy
# bandwidth. Issue 14: does a cold README command skip XLA's GEMM autotuning when an earlier run's autotuner
# results are in place (autotune_seed.py); the 8B + draft cache hit with XLA's command buffers off;
# lookahead's first measurement cut to 1-2 target layers (session 12's measure_layers.py).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks:benchmarks/results/logs12
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
el "window_merge GPU tests"
timeout 90 python -m pytest -q -m gpu -p no:cacheprovider tests/test_window_merge.py 2>&1 | tail -15
el "step: fused window (default), profiled; then --xla-window"
timeout 90 python benchmarks/step_ab.py --tag fused --cases int2:1:131072,int2:8:32768,bf16:1:131072 \
  --profile int2:1:131072 --out $OUT/step_fused.json 2>&1 | grep -v "^{" | tail -24
timeout 60 python benchmarks/step_ab.py --tag xla-window --xla-window --cases int2:1:131072,int2:8:32768 \
  --profile "" --out $OUT/step_xla_window.json 2>&1 | grep -v "^{" | tail -4
el "autotune seed"
timeout 150 python benchmarks/results/logs13/autotune_seed.py --out $OUT 2>&1 | tail -30
el "decode.py 1M"
timeout 75 python benchmarks/decode.py --contexts 1048576 --batches 1,4 --time-budget 60 --out $OUT/decode_1m.json 2>&1 | tail -6
el "kernel alone"
timeout 60 python benchmarks/kernel_diag.py --trace --variants base --points 64:32768:1,64:32768:5,1:1048576:1 \
  --budget-s 45 --out $OUT 2>&1 | tail -8
el "8B + draft, cold then warm, command buffers off"
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 80 python benchmarks/startup.py --phases --no-readme --cases 8b+draft \
  --budget 70 --out $OUT/startup_nocmdbuf.json 2>&1 | tail -3
el done
