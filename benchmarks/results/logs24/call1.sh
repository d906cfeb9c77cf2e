# Session 24, calls 1 (a) and 2 (b): session 23's prepared benchmarks/results/logs23/next_call.sh, run as is.
# Its `b` part ran step_ab.py --split-k, an option taken out after that run (SPLIT_K measured slower).
exec bash benchmarks/results/logs23/next_call.sh "$@"
