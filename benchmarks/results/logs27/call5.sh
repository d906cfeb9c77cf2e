# Session 27, call 5 (issue 16's 1.7x and 1.3x): call 4's profile still held one convert kernel per layer: the
# commit's copy of the new k and v rows read the f32 sums, so XLA rounded them for the window kernel in a kernel of
# its own. Now model.block puts qkv_slots' array behind a barrier: one bf16 array for attention and the commit.
# The step against HEAD's tree (.before/prev, carried), alternated; a profile; then the GPU tests (first half).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
CASES=int2:1:131072,bf16:1:131072,int2:8:32768
ab() { PYTHONPATH=$1:benchmarks timeout 90 python benchmarks/step_ab.py --tag $2 --jspec-root $1 --cases $CASES \
  --profile "$3" --out $OUT/step_$2.json 2>&1 | grep "ms/step\|kernels/step"; }
el "after 1"; ab . after1 int2:1:131072
el "before 1"; ab .before/prev before1 ""
el "after 2"; ab . after2 ""
el "before 2"; ab .before/prev before2 ""
gzip -9 $OUT/*/*.hlo.txt 2>/dev/null
LATE="tests/test_window_merge.py tests/test_startup.py tests/test_add_norm.py tests/test_stacked.py"
left=$(( 585 - $(date +%s) + t0 ))
el "gpu tests, first half (${left}s left)"; timeout $left python -m pytest -q --tb=short -m gpu -p no:cacheprovider \
  $(for f in $LATE; do echo --ignore=$f; done) 2>&1 | grep -v "Warning\|^  " | tail -8
el done
