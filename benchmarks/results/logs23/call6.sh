# Session 23, call 6 (H200, the last 92 s of the budget): test_stacked.py's GPU tests on the fused norms (call 5's
# full run was cut before the last of them).
timeout 95 python -m pytest -q --tb=short -m gpu tests/test_stacked.py -p no:cacheprovider 2>&1 | grep -v "^  warnings\|Warning\|^  " | tail -6
