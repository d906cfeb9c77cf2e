# Session 22, call 4 (H200): the stacked window read in place by window_merge (LayerKV.window_stacks: XLA copied
# each layer's window out of the stacks for the Triton call, 0.27 ms per step at B 8 in call 2). The GPU tests of
# the stacked path and window_merge, then the step: unrolled (the kernel gained a layer argument) against stacked,
# at B 1 / 128K, B 8 / 32K and B 64 / 32K, and a profile of the stacked B 8.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
C=int2:1:131072,int2:8:32768,int2:64:32768
el "gpu tests"; timeout 150 python -m pytest -q --tb=short -m gpu tests/test_stacked.py tests/test_window_merge.py -p no:cacheprovider 2>&1 | grep -v "^  warnings\|Warning\|^  " | tail -20
el "step default"; timeout 120 python benchmarks/step_ab.py --tag unrolled --jspec-root . --cases $C --profile "" \
  --out $OUT/step_unrolled.json 2>&1 | grep "ms/step"
el "step stacked"; timeout 120 python benchmarks/step_ab.py --tag stacked --jspec-root . --cases $C \
  --scan-layers --profile int2:8:32768 --out $OUT/step_stacked.json 2>&1 | grep -E "ms/step|profile|  ms  "
el done
