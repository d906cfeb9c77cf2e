# Session 18, call 3: the final tree (the all-layers commit the only fused form): every GPU test, then the
# step at B 1 / 128K against BF16 in one process, and the 1M-token row.
export PYTHONUNBUFFERED=1
PYTHONPATH=.:benchmarks timeout 150 python benchmarks/step_ab.py --tag final --jspec-root . \
  --cases int2:1:131072,bf16:1:131072,int2:1:1048576 --profile "" --out $OUT/step_final.json 2>&1 | grep "^\[" | tail -5
PYTHONPATH=. timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | grep -v Warn | tail -8
