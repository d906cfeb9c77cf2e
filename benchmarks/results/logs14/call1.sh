# Session 14, device call 1 (prepared in session 13 as logs13/next_call.sh; 208 s on one H200).
# Issue 14: the cold README command is 22-23 s with the shipped autotuning results; of it, lookahead's first
# cost measurement is about 10 s. ship_costs.py measures the README command's costs once and times the cold
# command with them shipped (lookahead.SHIPPED; on the CPU: 11.6 s against 22.4 s measuring them, same run):
# afterwards commit $OUT/lookahead/*.json as jspec/autotune/lookahead/ and say so in the README. measure_layers.py times the
# measurement with the target cut to 1-2 layers and whether the cut loops predict the full costs (for the
# shapes no file covers). Issue 16: the 1M-token
# row with the window kernels (72 tok/s before them); the kernel at B 1 / 128K (44% of copy; 65% at B 64) with
# other split counts; the step's profile for the next small-kernel target.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks:benchmarks/results/logs12
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "cold README with lookahead's costs shipped"
timeout 150 python benchmarks/results/logs13/ship_costs.py --out $OUT 2>&1 | tail -16
el "lookahead's first measurement: full target, first 2 and 1 layers"
timeout 120 python benchmarks/results/logs12/measure_layers.py --phases --out $OUT/measure_layers.json 2>&1 | tail -20
el "decode.py 1M, batch 1"
timeout 75 python benchmarks/decode.py --contexts 1048576 --batches 1 --time-budget 60 --out $OUT/decode_1m.json 2>&1 | tail -4
el "kernel alone at B 1 / 128K: the default 66 splits (short CTAs of ~2K tokens) against fewer, longer ones and more"
timeout 60 python benchmarks/kernel_diag.py --trace --variants base,num_splits=33,num_splits=44,num_splits=132 \
  --points 1:131072:1 --budget-s 45 --out $OUT 2>&1 | tail -6
el "step profile"
timeout 60 python benchmarks/step_ab.py --tag default --cases int2:1:131072,bf16:1:131072 --profile int2:1:131072 \
  --out $OUT/step.json 2>&1 | grep -v "^{" | tail -22
el done
