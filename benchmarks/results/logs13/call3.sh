# Session 13, call 3. Issue 14: the cold README command with XLA's autotuning results shipped, the seeding
# now copying XLA's per-GPU subfolder (call 2's copied nothing: the results sit one folder down). Issue 16:
# the 8B step without split-K GEMMs (96 of the step's small reductions follow them), against the default in
# the same call. Every GPU test on the final tree (window_merge, the seeding, sessions 12-13's changes).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks:benchmarks/results/logs12
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "autotune seed"
timeout 200 python benchmarks/results/logs13/autotune_seed.py --out $OUT 2>&1 | tail -24
el "step: default, then split-K autotuning off"
timeout 60 python benchmarks/step_ab.py --tag default --cases int2:1:131072,bf16:1:131072,int2:8:32768 \
  --profile "" --out $OUT/step_default.json 2>&1 | grep -v "^{" | tail -4
XLA_FLAGS=--xla_gpu_enable_split_k_autotuning=false timeout 60 python benchmarks/step_ab.py --tag no-split-k \
  --cases int2:1:131072,bf16:1:131072,int2:8:32768 --profile "" --out $OUT/step_no_split_k.json 2>&1 | grep -v "^{" | tail -4
el "GPU tests"
timeout 330 python -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -4
el done
