"""Session 9: the README command under cProfile (one process), for the warm-start breakdown of issue 14.
    python benchmarks/results/logs9/prof_warm.py OUT.txt -- "def fibonacci(n):" [CLI args]"""
import cProfile
import io
import pstats
import sys
import time

t0 = time.perf_counter()
out, args = sys.argv[1], sys.argv[3:]
pr = cProfile.Profile()
pr.enable()
from jspec import generate  # noqa: E402

rc = generate.main(args)
pr.disable()
s = io.StringIO()
s.write(f"main returned {rc} after {time.perf_counter() - t0:.3f} s (interpreter start not included)\n")
st = pstats.Stats(pr, stream=s)
st.sort_stats("cumulative").print_stats(70)
st.sort_stats("tottime").print_stats(30)
open(out, "w").write(s.getvalue())
