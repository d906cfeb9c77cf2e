# Session 21, call 4 (H200): the 8B step at B 1 / 128K under XLA's experimental fusion flags that may put an RMS
# norm's reduction and its broadcast back (today two kernels per norm, 64 norms per step) in one Triton kernel.
# Each flag in XLA_FLAGS for one process (INT2 with a profile: kernels per step; BF16), against the default.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
ab() { XLA_FLAGS="$2" timeout 75 python benchmarks/step_ab.py --tag $1 --jspec-root . --cases int2:1:131072,bf16:1:131072 \
  --profile int2:1:131072 --out $OUT/step_$1.json 2>&1 | grep -E "ms/step|profile|Error" | cut -c1-200; }
el default; ab default ""
for f in enable_triton_heroless_priority_fusion enable_fusion_block_level_rewriter all_fusions_with_triton; do
  el $f; ab $f "--xla_gpu_experimental_$f=true"; done 2>&1
el done
