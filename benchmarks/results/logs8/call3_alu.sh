#!/bin/bash
# Issue 16 (ALU), call 1, one H200 (~4 min on a fresh machine): the new bodies' GPU tests first (a failing
# variant must not be timed as if right), then the decode A/B (kernel time from a trace) and verification.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
t "GPU tests: lean, lean8, lop3, edge_mask (19 cases)"
timeout 120 python3 -m pytest -q -m gpu tests/test_int2_mosaic.py -p no:cacheprovider \
  -k "compiled and (lean or lop3 or interior) and not release" 2>&1 | tail -12
t "GPU tests: release (6 cases; a wrong mbarrier protocol would hang, hence alone and short)"
timeout 60 python3 -m pytest -q -m gpu tests/test_int2_mosaic.py -p no:cacheprovider -k "compiled and release" 2>&1 | tail -8
t "decode A/B"
timeout 150 python3 benchmarks/kernel_diag.py --trace --budget-s 130 --out $OUT \
  --variants body=warp,body=warp+lop3=True,body=lean,body=lean8,body=lean8+release=True \
  --points 64:32768:1,8:131072:1,8:32768:1,1:131072:1 2>&1 | grep -v Warn | tail -22
t "verify A/B (N = 24)"
timeout 60 python3 benchmarks/kernel_diag.py --trace --budget-s 45 --out $OUT/verify \
  --variants body=wgmma,body=wgmma+lop3=True,body=wgmma+lop3=True+edge_mask=True,body=lean8 --points 64:32768:5 2>&1 | grep -v Warn | tail -6
t "done"
