#!/bin/bash
# Session 6, call 2 (nvidia-h200): issue 16: SASS/ptxas of the Mosaic kernel, ncu, and the TMA ring:
# 128-byte code rows vs one token's 32 bytes, stages, block size; the kernel's own time at B = 1.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
t "dump PTX/SASS"
mkdir -p /tmp/dump
MOSAIC_GPU_DUMP_TO=/tmp/dump timeout 120 python3 -P .before/dump_kernel.py 2>&1 | grep -v Warn | tail -3
ls -la /tmp/dump | head -30
grep -h -i -E "registers|spill|stack" /tmp/dump/*ptxas* 2>/dev/null | head -10
( cd /tmp/dump && tar czf $OUT/dump.tgz --exclude='*mlir*' . ) ; ls -la $OUT/dump.tgz
t "ncu"
timeout 100 ncu --clock-control none -k regex:int2 -s 2 -c 1 --set full python3 -P .before/ncu_kernel.py > $OUT/ncu.txt 2>&1
echo "ncu rc $?"; grep -v "^==PROF==" $OUT/ncu.txt | head -3; grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Block Limit" $OUT/ncu.txt | head -30
t "ring and block settings"
V=empty+row_bytes=32,empty,empty+stages=8,empty+block_t=128,empty+block_t=128+stages=8,base,row_bytes=32,stages=8,block_t=128,block_t=128+stages=8,approx=True
timeout 400 python3 benchmarks/kernel_diag.py --out $OUT --budget-s 360 --trace --variants $V --points 64:32768:1,1:131072:1,8:32768:1,64:32768:5 2>&1 | grep -v Warn | tail -48
t "done"
