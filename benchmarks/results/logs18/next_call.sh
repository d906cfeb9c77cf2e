# For session 19's first device call (prepared in session 18, not run): session 18's final tree re-measured where
# session 18 did not (the 32K largest-batch row for the 3x goal, last run in session 16; B 8 / 32K; the B 1 / 128K
# profile of the final tree) and the kernel alone at the goal points, in one call of about 6 minutes; last, with
# logs18/exact_division.patch applied, the commit's GPU tests asking for the jnp commit's codes bit for bit.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "step_ab: B 1 / 128K and B 8 / 32K, both modes, one process; profile at B 1 / 128K"
timeout 150 python benchmarks/step_ab.py --tag s18 --jspec-root . --cases int2:1:131072,bf16:1:131072,int2:8:32768,bf16:8:32768 \
  --profile int2:1:131072 --out $OUT/step_s18.json 2>&1 | grep -v "^{" | tail -24
el "decode.py 32K: batch 1 and each mode's largest"
timeout 110 python benchmarks/decode.py --contexts 32768 --batches 1 --time-budget 90 --out $OUT/decode_32k.json 2>&1 | tail -7
el "kernel alone: decode B 64 / 32K, B 8 / 32K, B 1 / 128K; verification B 64 / 32K"
timeout 100 python benchmarks/kernel_diag.py --trace --budget-s 80 --out $OUT --variants base \
  --points 64:32768:1,8:32768:1,1:131072:1,64:32768:5 2>&1 | grep "^{" | cut -c1-400
el "the commit kernel dividing as XLA does (logs18/exact_division.patch, applied to this copy): strict GPU tests"
P=benchmarks/results/logs18/exact_division.patch
(git apply $P 2>/dev/null || patch -p1 < $P) && timeout 150 python -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_int2_commit.py tests/test_int2_mosaic.py -k "commit or decode_steps" 2>&1 | tail -5
el done
