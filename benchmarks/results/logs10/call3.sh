# Session 10 (retry), call 3. Issue 14: XLA's LLVM module compiled in parallel (jspec.programs.options)
# against XLA's default (one thread), cold and warm: the README command, the job, the shipped, 8B and
# 8B + draft programs, with the compile's longest phases traced.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader; nproc
el "gpu test of the program store"
timeout 90 python -m pytest -q -m gpu tests/test_startup.py -p no:cacheprovider 2>&1 | tail -2
el "startup, parallel LLVM (this tree's default)"
timeout 290 python benchmarks/startup.py --phases --budget 270 --out $OUT/startup_parallel.json 2>&1 | grep -v "^{'case'"
el "startup, one thread (XLA's default)"
timeout 200 python benchmarks/startup.py --phases --budget 180 --no-job --cases 8b+draft \
  --xla-flags=--xla_gpu_enable_llvm_module_compilation_parallelism=false --out $OUT/startup_serial.json 2>&1 | grep -v "^{'case'"
el done
# (--xla-flags was removed from startup.py after this call: XLA_FLAGS set around the script does the same.)
