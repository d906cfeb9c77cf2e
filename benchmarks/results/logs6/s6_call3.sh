#!/bin/bash
# Session 6, call 3 (nvidia-h200): issue 16: the per-warp mma.sync body: ptxas report, GPU tests, timing
# against the wgmma body (kernel-only time from a trace), ncu of the per-warp body.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
t "ptxas report, per-warp body"
mkdir -p /tmp/dump
MOSAIC_GPU_DUMP_TO=/tmp/dump timeout 120 python3 -P .before/dump_kernel.py warp 2>&1 | grep -v Warn | tail -12
grep -h -E "registers|spill" /tmp/dump/*ptxas* 2>/dev/null | head -6
( cd /tmp/dump && tar czf $OUT/dump_warp.tgz --exclude='*mlir*' . )
t "GPU tests"
timeout 300 python3 -m pytest -q -x tests/test_int2_mosaic.py -p no:cacheprovider 2>&1 | tail -15
t "timing"
V=body=wgmma,body=warp,body=warp+stages=8,body=warp+stages=2
timeout 240 python3 benchmarks/kernel_diag.py --out $OUT --budget-s 200 --trace --variants $V --points 64:32768:1,8:32768:1,1:131072:1,64:32768:5,8:131072:1 2>&1 | grep -v Warn | tail -24
t "ncu, per-warp body"
timeout 100 ncu --clock-control none -k regex:int2 -s 2 -c 1 --set full python3 -P .before/ncu_kernel.py warp > $OUT/ncu_warp.txt 2>&1
grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|DRAM Throughput|Issue Slots Busy|Executed Instructions  |No Eligible|Warp Cycles Per Issued|Block Limit Reg|Block Limit Shared" $OUT/ncu_warp.txt | head -20
t "done"
