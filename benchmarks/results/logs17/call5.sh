# Session 17, device call 5: the per-layer commit restored (call 4: the all-layers commit kernel parts from the
# jnp commit on the GPU at two layers; right in interpret mode). The decode-step GPU tests at full matmul
# precision, the commit and window_merge GPU tests, the step at B 1 / 128K against BF16.
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout 100 python -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_int2_mosaic.py::test_decode_steps_with_the_kernels_match_the_reference_forward tests/test_int2_commit.py tests/test_window_merge.py 2>&1 | grep -v Warn | tail -4
PYTHONPATH=.:benchmarks timeout 100 python benchmarks/step_ab.py --tag after --jspec-root . \
  --cases int2:1:131072,bf16:1:131072,int2:1:1048576 --profile "" --out $OUT/step_after.json 2>&1 | grep -v "^{" | tail -5
