# Session 27, call 3 (issue 16's 1.7x and 1.3x): q, k and v as one array from one kernel (model.qkv_slots), read
# whole by the window kernel: three copies per layer fewer (two slices of the rotated q and k, v's slice of the
# GEMM's partials). The step against HEAD's tree (.before/prev, carried), alternated, in separate processes; a
# profile of the new step; then the GPU tests of the files touched.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
CASES=int2:1:131072,bf16:1:131072,int2:8:32768
ab() { PYTHONPATH=$1:benchmarks timeout 90 python benchmarks/step_ab.py --tag $2 --jspec-root $1 --cases $CASES \
  --profile "$3" --out $OUT/step_$2.json 2>&1 | grep "ms/step\|kernels/step"; }
el "before 1"; ab .before/prev before1 ""
el "after 1"; ab . after1 int2:1:131072
el "before 2"; ab .before/prev before2 ""
el "after 2"; ab . after2 ""
gzip -9 $OUT/*/*.hlo.txt 2>/dev/null
el "gpu tests"; timeout 200 python -m pytest -q --tb=short -m gpu -p no:cacheprovider tests/test_window_merge.py \
  tests/test_stacked.py tests/test_model.py 2>&1 | grep -v "Warning\|^  " | tail -6
el done
