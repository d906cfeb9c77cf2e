# Session 17, device call 3. After call 2 (5.761 ms at B 1 / 128K; q, k, v read in place, but XLA split the RoPE
# select and the bf16 rounding of the rows into kernels of their own): RoPE per slot (cos 1, sin 0 for v) so that
# it fuses into R_K's reduction again, and the rows left in f32 for window_parts to round. The failing new
# GPU test with its error, the kernel GPU tests, then the step and its profile at B 1 / 128K.
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "GPU tests: new decode-step test, window_merge, commit"
PYTHONPATH=. timeout 200 python -m pytest -q -m gpu -p no:cacheprovider -x tests/test_int2_mosaic.py -k decode_steps 2>&1 | grep -v Warning | tail -30
PYTHONPATH=. timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_window_merge.py tests/test_int2_commit.py 2>&1 | tail -2
el "step, this tree"
PYTHONPATH=.:benchmarks timeout 150 python benchmarks/step_ab.py --tag after --jspec-root . \
  --cases int2:1:131072,int2:8:32768,int2:1:1048576,bf16:1:131072 \
  --profile int2:1:131072 --out $OUT/step_after.json 2>&1 | grep -v "^{" | tail -24
gzip -c $OUT/step_after_profile/int2_B1_131072.hlo.txt > $OUT/int2_B1_131072.hlo.txt.gz; rm -rf $OUT/step_after_profile
el done
