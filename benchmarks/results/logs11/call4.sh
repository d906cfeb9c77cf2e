# Session 11, call 4: a draft step's cost with two rows against one (same process); speculation on the shipped
# pair in prev/ (this tree with the one-row draft steps; call 3's prev run imported this tree, not prev/);
# every GPU test.
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "draft step, one row against two"
PYTHONPATH=. timeout 90 python benchmarks/results/logs11/draft_rows.py 2>&1 | grep -v '"device"' | tail -8
el "speculation in prev/, batch 1, plain and auto"
ln -sfn $PWD/checkpoints prev/checkpoints
(cd prev && PYTHONPATH=. timeout 110 python benchmarks/speculative.py --modes model --kvs int2 --batches 1 \
  --workloads held_out --parts auto --budget-s 80 --head none --out $OUT/spec_prev.json 2>&1 | grep -v '^{' | grep -i "imported\|int2" | head -4)
el "all GPU tests"
PYTHONPATH=. timeout 230 python -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -4
el done
