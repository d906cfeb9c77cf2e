# Session 18, call 2: the all-layers commit (int2_commit.commit_int2_layers, kvcache.ALL_LAYERS_COMMIT) compiled
# in the cases the model gives it, its step time against the per-layer kernel's and BF16 in one call, the GPU tests
# of the commit and the (now teacher-forced) decode-step test, and the bisection's figures for its bound.
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout 150 python benchmarks/results/logs18/commit_probe.py 2>&1 | grep -v Warn | tail -62
PYTHONPATH=.:benchmarks timeout 100 python benchmarks/step_ab.py --tag per-layer --jspec-root . \
  --cases int2:1:131072,bf16:1:131072 --profile "" --out $OUT/step_per_layer.json 2>&1 | grep "^\[" | tail -4
PYTHONPATH=.:benchmarks timeout 120 python benchmarks/step_ab.py --tag all-layers --jspec-root . --all-layers-commit \
  --cases int2:1:131072 --profile int2:1:131072 --out $OUT/step_all_layers.json 2>&1 | grep -v "^{" | tail -22
PYTHONPATH=. timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_int2_commit.py \
  tests/test_int2_mosaic.py -k "commit or decode_steps" 2>&1 | grep -v Warn | tail -8
# Verification (n = 5 positions of 4 query heads: 20 rows): auto (the wgmma body), the rows in 3 groups of 8 for
# the decode body (row_groups=3, new), the lean8 body at 24 rows (registers, spills); n = 2 is decode's 8 rows.
PYTHONPATH=. timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/test_int2_mosaic.py -k "row_groups" \
  2>&1 | tail -3
PYTHONPATH=.:benchmarks timeout 110 python benchmarks/kernel_diag.py --trace --budget-s 90 --out $OUT \
  --variants "base,row_groups=3,body=lean8+release=True+late_values=True" --points 64:32768:5,8:32768:5,64:32768:2 \
  2>&1 | grep "^{" | cut -c1-900
PYTHONPATH=. timeout 120 python benchmarks/results/logs18/bisect.py 2>&1 | grep -v Warn | tail -16
