# Session 8, call 4: issue 16 - the new default kernel + the step's fewer small kernels on the GPU: GPU tests of the
# attention path, the step (after, with a profile), decode.py's goal rows (1M at batch 1 and the largest batch;
# 32K at each mode's largest batch), then the step before the step changes (both trees with the new kernel default).
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( 325 - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
el "GPU tests: the attention path"
PYTHONPATH=. timeout 70 python -m pytest -q -m gpu -p no:cacheprovider tests/test_int2_kernel.py 2>&1 | tail -2
el "step: after (with the profile of INT2 128K B1)"
PYTHONPATH=. timeout 120 python benchmarks/step_ab.py --tag after --jspec-root . --out $OUT/ab_after.json 2>&1 \
  | grep -vi warn | tail -14
el "decode: 1M batch 1 (+ largest), 32K at batch 1 and the largest batches"
PYTHONPATH=. timeout $(( $(left) - 60 )) python benchmarks/decode.py --out $OUT/decode_s8.json \
  --contexts 1048576,32768 --batches 1 --time-budget 100 2>&1 | grep -v Warn | tail -8
el "step: before"
PYTHONPATH=.before/prev timeout $(left) python benchmarks/step_ab.py --tag before --jspec-root .before/prev --profile "" \
  --out $OUT/ab_before.json 2>&1 | grep -vi warn | tail -6
el done
