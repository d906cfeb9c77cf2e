#!/bin/bash
# Session 6, call 1 (nvidia-h200): issue 16 diagnosis of the Mosaic INT2 kernel: ptxas report + SASS,
# ncu (if this runtime allows counters), and stage ablations at four points.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
t "dump PTX/SASS"
mkdir -p /tmp/dump
MOSAIC_GPU_DUMP_TO=/tmp/dump timeout 120 python3 .before/dump_kernel.py 2>&1 | grep -v Warn | tail -3
ls -la /tmp/dump | head -40
grep -h -i -E "registers|spill|stack|smem" /tmp/dump/*ptxas* 2>/dev/null | head -20
( cd /tmp/dump && tar czf $OUT/dump.tgz --exclude='*mlir*' . ) ; ls -la $OUT/dump.tgz
t "ncu"
timeout 150 ncu --clock-control none -k regex:int2 -s 2 -c 1 --set full python3 .before/ncu_kernel.py > $OUT/ncu.txt 2>&1
echo "ncu rc $?"; grep -v "^==PROF==" $OUT/ncu.txt | head -5; grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Block Limit" $OUT/ncu.txt | head -30
t "ablations"
timeout 330 python3 benchmarks/kernel_diag.py --out $OUT --budget-s 300 2>&1 | grep -v Warn | tail -50
t "done"
