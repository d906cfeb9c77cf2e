# Session 23, call 2 (H200). Call 1: the stacked 8B + draft run is 1.31x the unrolled one on a second run too (3.97
# vs 3.03 s), so not a first-run cost; the step at B 8 / 32K is still 1.06x. Are the stacked loops' kernels launched
# one by one? XLA's default command buffers (CUDA graphs) take fusions, cuBLAS and custom calls but not a while loop:
# the step and the 8B + draft run with WHILE added, and with xla_gpu_command_buffer_unroll_loops. Then the unrolled
# B 8 profile, to set its GEMMs against the stacked cuBLAS ones (call 1's profile).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
C=int2:1:131072,int2:8:32768
CB=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,WHILE
el "step stacked, WHILE"; timeout 80 python benchmarks/step_ab.py --tag stacked_while --jspec-root . --cases $C \
  --scan-layers --scan-option xla_gpu_enable_command_buffer=$CB --profile "" --out $OUT/step_stacked_while.json 2>&1 | grep "ms/step"
el "step stacked, WHILE, unrolled in the graph"; timeout 80 python benchmarks/step_ab.py --tag stacked_while_unroll \
  --jspec-root . --cases $C --scan-layers --scan-option xla_gpu_enable_command_buffer=$CB \
  --scan-option xla_gpu_command_buffer_unroll_loops=true --profile "" --out $OUT/step_stacked_while_unroll.json 2>&1 | grep "ms/step"
el "startup stacked, WHILE"; XLA_FLAGS="--xla_gpu_enable_command_buffer=$CB" timeout 100 python benchmarks/startup.py \
  --engine --cases 8b+draft --no-readme --no-job --rerun --scan-layers --out $OUT/startup_scan_while.json 2>&1 | grep "^| 8b+draft"
el "startup stacked, WHILE, unrolled in the graph"; XLA_FLAGS="--xla_gpu_enable_command_buffer=$CB --xla_gpu_command_buffer_unroll_loops=true" \
  timeout 100 python benchmarks/startup.py --engine --cases 8b+draft --no-readme --no-job --rerun --scan-layers \
  --out $OUT/startup_scan_while_unroll.json 2>&1 | grep "^| 8b+draft"
el "step unrolled, profile B 8"; timeout 90 python benchmarks/step_ab.py --tag unrolled --jspec-root . --cases int2:8:32768 \
  --profile int2:8:32768 --out $OUT/step_unrolled.json 2>&1 | grep -E "ms/step|profile"
el done
