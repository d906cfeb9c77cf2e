# Session 11, call 3: the draft model's steps as one traced forward of two rows (decode.draft_model, the first
# step resyncs), against the resync forward + one-row steps (prev/: this tree with the old draft_model and
# lookahead draft loop): the 8B + draft compile, and speculation on the shipped pair in both trees.
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
ln -sfn $PWD/checkpoints prev/checkpoints
el "start-up, 8B + draft, two-row draft steps"
PYTHONPATH=. timeout 130 python benchmarks/startup.py --phases --budget 120 --no-readme --cases 8b+draft \
  --out $OUT/startup_w2.json 2>&1 | tail -4
for tree in . prev; do
  el "speculation, shipped pair, tree $tree"
  PYTHONPATH=$tree python -c "import jspec; print(jspec.__file__)"
  PYTHONPATH=$tree timeout 150 python benchmarks/speculative.py --modes model --kvs int2 --batches 1,8 \
    --workloads held_out --parts auto,sweep,fixed --sweep-ks 2,4 --budget-s 120 --head none \
    --out $OUT/spec_$( [ $tree = . ] && echo w2 || echo prev ).json 2>&1 | tail -2 | cut -c1-400
done
el done
