# Session 25, call 1: `bash call1.sh b`, session 24's next_call.sh (its `b`: the compile phases, the decode kernel's
# splits at B 1 / 128K, two INT2 / BF16 step pairs; `a` and `c` did not run).
bash "$(dirname "$0")/../logs24/next_call.sh" "$@"
