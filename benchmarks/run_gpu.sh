#!/usr/bin/env bash
# Every GPU figure the README and docs/results.md report, re-measured on one GPU (an H100 or H200): the GPU tests,
# then each maintained benchmark writing its JSON, ~25 minutes in all. OUT: where the JSONs and logs go (default
# benchmarks/results). PARTS: which of them to run (default all), e.g. PARTS="tests kernel" for the first 10 min.
#
#   bash benchmarks/run_gpu.sh                         # everything
#   PARTS="tests kernel decode" OUT=$OUT bash benchmarks/run_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.:benchmarks
OUT=${OUT:-benchmarks/results}
PARTS=${PARTS:-tests kernel decode speculative long_context jobs startup}
mkdir -p "$OUT"
python -c "import jax; print(jax.__version__, jax.devices())" | tee "$OUT/device.txt"
git rev-parse --short HEAD >> "$OUT/device.txt" 2>/dev/null || true
has() { [[ " $PARTS " == *" $1 "* ]]; }
run() { local name=$1; shift; echo "== $name: $*"; timeout "${LIMIT:-900}" "$@" > "$OUT/$name.log" 2>&1; echo "   exit $?"; }
has tests && run gpu_tests python -m pytest -q -m gpu tests
has kernel && run kernel_mosaic python benchmarks/kernel_mosaic.py --out "$OUT"
has kernel && run attention python benchmarks/attention.py --v3 --reps 10 --budget-s 150 --out "$OUT"
has decode && run decode python benchmarks/decode.py --out "$OUT/decode.json"
has speculative && run speculative python benchmarks/speculative.py --out "$OUT/speculative.json"
has long_context && [[ -f benchmarks/long_context.py ]] && run long_context python benchmarks/long_context.py --out "$OUT/long_context.json"
has jobs && [[ -f benchmarks/jobs.py ]] && run jobs python benchmarks/jobs.py --out "$OUT/jobs.json"
has startup && run startup python benchmarks/startup.py --out "$OUT/startup.json"
tail -n 3 "$OUT"/*.log
