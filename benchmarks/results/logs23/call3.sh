# Session 23, call 3 (H200): gemm_probe.py, the scan's cuBLAS GEMMs against XLA's Triton ones at 1, 8, 40 and 64
# tokens (32 layers of an 8B layer's four GEMMs).
export PYTHONUNBUFFERED=1
timeout 400 python benchmarks/results/logs23/gemm_probe.py 2>&1 | grep "^{" | tee $OUT/gemm_probe.jsonl
