# Session 27, call 6: the GPU tests' second half (the four files call 5 left out) on call 5's tree.
export PYTHONPATH=.:benchmarks; timeout 220 python -m pytest -q --tb=short -m gpu -p no:cacheprovider tests/test_window_merge.py tests/test_startup.py tests/test_add_norm.py tests/test_stacked.py 2>&1 | grep -v "Warning\|^  " | tail -6
