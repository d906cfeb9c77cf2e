"""The README command in-process, with the traceback of an error the CLI would print as one line (call 5:
does JAX_EXPLAIN_CACHE_MISSES=1 make it fail on the H200?)."""
import sys
import traceback

from jspec import generate

run = generate._run


def traced(*a, **k):
    try:
        return run(*a, **k)
    except Exception:
        traceback.print_exc()
        raise


generate._run = traced
sys.exit(generate.main(["def fibonacci(n):", *sys.argv[1:]]))
