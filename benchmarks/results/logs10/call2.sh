# Session 10, call 2. Issue 14: XLA flags that might let a scanned layer's GEMMs read the stacked weights in
# place (call 1: every weight slice copied, 416 MiB per layer, decode 2.5x slower). The retrained head
# (call 1: 16,384 continuations, 17,265 steps) against plain decoding, batch 1, INT2 and BF16.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
so=$(python -c "import jax_plugins.xla_cuda12 as m, os; print(os.path.dirname(m.__file__))" 2>/dev/null)
strings $so/*.so 2>/dev/null | grep -E "^xla_gpu_[a-z0-9_]*$" | grep -E "slice|split_k|gemm_fusion|nest|generic" | sort -u | tr '\n' ' '; echo
for f in "" --xla_gpu_autotune_level=0 --xla_gpu_experimental_force_split_k=1 \
    --xla_gpu_experimental_enable_fusion_autotuner=false --xla_gpu_experimental_gemm_fusion_v2=true \
    "--xla_gpu_enable_triton_gemm=false --xla_gpu_enable_dynamic_slice_fusion=true"; do
  el "probe XLA_FLAGS='$f'"
  XLA_FLAGS="$f" timeout 45 python benchmarks/results/logs10/scan_probe.py --layers 8 --tokens 1,256 \
    --variants unrolled,scan_xs 2>&1 | grep -v '^{"device' | grep -v Warning | tee -a $OUT/probe_flags.log
done
el "head vs plain, batch 1, INT2, held-out"
timeout 170 python benchmarks/speculative.py --modes head --kvs int2 --batches 1 --parts auto --workloads held_out \
  --budget-s 110 --out $OUT/spec_head_b1_int2_heldout_s10.json 2>&1 | grep -v "^{" | tail -3
el "head vs plain, batch 1, INT2, edit-style"
timeout 100 python benchmarks/speculative.py --modes head --kvs int2 --batches 1 --parts auto --workloads edit \
  --budget-s 60 --out $OUT/spec_head_b1_int2_edit_s10.json 2>&1 | grep -v "^{" | tail -3
el "head vs plain, batch 8, INT2, held-out"
timeout 100 python benchmarks/speculative.py --modes head --kvs int2 --batches 8 --parts auto --workloads held_out \
  --budget-s 60 --out $OUT/spec_head_b8_int2_heldout_s10.json 2>&1 | grep -v "^{" | tail -3
el done
