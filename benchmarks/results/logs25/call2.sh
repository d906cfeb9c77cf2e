# Session 25, call 2 (issue 14): does XLA's parallel LLVM compilation shorten the 8B + draft cold compile?
# Call 1's --phases: of the two parts' 33 s of compile thread time, CompileModuleToLlvmIr 22.3 s, inside it 172
# CompileSingleModule (11.1 s) and PTX->CUBIN (5.9 s): XLA's Triton GEMM kernels built one after the other.
# xla_gpu_enable_llvm_module_compilation_parallelism (default false) lets XLA compile them on a thread pool.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
P=--xla_gpu_enable_llvm_module_compilation_parallelism=true
for f in "" "$P" "$P --xla_gpu_force_compilation_parallelism=16" ""; do
  el "startup XLA_FLAGS='$f'"; XLA_FLAGS="$f" timeout 130 python benchmarks/startup.py --engine --rerun --cases 8b+draft \
    --no-readme --no-job --out $OUT/startup_$(date +%s).json 2>&1 | grep "^| 8b+draft"
done
el "phases with $P"; XLA_FLAGS="$P" timeout 120 python benchmarks/startup.py --phases --cases 8b+draft --no-readme \
  --no-job --out $OUT/startup_phases_parallel.json 2>&1 | grep "^| 8b+draft"
for f in "$P" ""; do
  el "step XLA_FLAGS='$f'"; XLA_FLAGS="$f" timeout 60 python benchmarks/step_ab.py --tag "p${f:+1}" --jspec-root . \
    --cases int2:1:131072,bf16:1:131072 --profile "" --out $OUT/step_p${f:+1}.json 2>&1 | grep "ms/step"
done
el "README command with $P"; XLA_FLAGS="$P" timeout 120 python benchmarks/startup.py --engine --cases shipped --no-job \
  --out $OUT/startup_readme_parallel.json 2>&1 | grep "^| \|README\|cold\|warm" | head -12
el done
