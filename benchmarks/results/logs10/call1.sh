# Session 10, call 1. Issue 14: do scanned, stacked layers read their weights in place (scan_probe.py)?
# Then the EAGLE-3 head retrained on the round-3 target with the whole GPU (session 9's shared-call head
# measured 1.38x at batch 1; the round-2 head 2.92x on its pair).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
mkdir -p /tmp/hlo
el "probe, default flags"
timeout 110 python benchmarks/results/logs10/scan_probe.py --layers 8 --tokens 1,5,256 --hlo /tmp/hlo/p 2>&1 \
  | grep -v '^{"device' | tee $OUT/probe_default.log | grep -v Warning
el "probe, --xla_gpu_enable_dynamic_slice_fusion=true"
XLA_FLAGS=--xla_gpu_enable_dynamic_slice_fusion=true timeout 45 python benchmarks/results/logs10/scan_probe.py \
  --layers 8 --tokens 1 2>&1 | grep -v '^{"device' | tee $OUT/probe_dsf.log | grep -v Warning
tar czf $OUT/probe_hlo.tgz -C /tmp hlo
el "head"
timeout 345 python -m jspec.train_head --target checkpoints/code-target --out /tmp/head --time-budget 300 \
  --draft-vocab 4096 --intermediate-size 1152 2>&1 | tail -25
tar cf $OUT/head.tar -C /tmp head
el done
