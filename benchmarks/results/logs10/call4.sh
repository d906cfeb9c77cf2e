# Session 10 (retry), call 4. Call 3 found that jaxlib 0.11.2's XLA has no
# xla_gpu_enable_llvm_module_compilation_parallelism (removed upstream). This call: where a cold compile's
# time goes (jax.profiler host events of each cold compile), the start-up table of issue 14 item 5, the
# program store's GPU test, and the head retrained in call 1 against plain decoding (batch 1, INT2).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "gpu test of the program store"
timeout 60 python -m pytest -q -m gpu tests/test_startup.py -p no:cacheprovider 2>&1 | tail -3
el "startup with phases"
timeout 300 python benchmarks/startup.py --phases --budget 280 --out $OUT/startup_s10.json 2>&1 | grep -v "^{'case'"
el "head vs plain, batch 1, INT2, held-out"
timeout 150 python benchmarks/speculative.py --modes head --kvs int2 --batches 1 --parts auto --workloads held_out \
  --budget-s 100 --out $OUT/spec_head_b1_int2_heldout_s10.json 2>&1 | grep -v "^{" | tail -4
el done
