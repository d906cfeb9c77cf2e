# For session 18's first device call (prepared in session 17, not run): which all-layers commit form is right
# compiled (commit_probe.py: three variants at 1-3 layers against commit_layer; about 30 s), then every GPU test
# on this tree (the full -m gpu suite has not run on session 17's final tree; the decode-step test's 0.08 bound
# has not run), then this tree's step and profile at B 1 / 128K against BF16 (the committed tree, call 5's less
# q, k and v read in place, was not measured as a whole in session 17).
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout 120 python benchmarks/results/logs17/commit_probe.py 2>&1 | grep -v Warn | tail -10
PYTHONPATH=. timeout 280 python -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | grep -v Warn | tail -6
PYTHONPATH=.:benchmarks timeout 120 python benchmarks/step_ab.py --tag now --cases int2:1:131072,bf16:1:131072 \
  --profile int2:1:131072 --out $OUT/step_now.json 2>&1 | grep -v "^{" | tail -22
