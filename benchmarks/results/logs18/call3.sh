# Session 18, call 3: the final tree (the all-layers commit the only fused form): the step at B 1 / 128K
# against BF16 in one process and the 1M-token row, then the GPU tests the change touches (the commit's, the
# decode-step test, the start-up test; the Mosaic kernel, Triton kernel and window_merge GPU tests passed on
# call 1's tree, whose kernels this tree has unchanged).
export PYTHONUNBUFFERED=1
PYTHONPATH=.:benchmarks timeout 150 python benchmarks/step_ab.py --tag final --jspec-root . \
  --cases int2:1:131072,bf16:1:131072,int2:1:1048576 --profile "" --out $OUT/step_final.json 2>&1 | grep "^\[" | tail -5
PYTHONPATH=. timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_int2_commit.py tests/test_startup.py \
  tests/test_int2_mosaic.py -k "commit or decode_steps or startup or readme or start" 2>&1 | grep -v Warn | tail -8
