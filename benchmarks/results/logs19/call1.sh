# Session 19, call 1: issue 14's cache hit taken apart (load_probe.py: each variant cold, then warm in the same
# cache), then the commit kernel dividing as XLA does (exact_division.patch, applied to this copy) with its strict
# GPU tests.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
P=benchmarks/results/logs19/load_probe.py
show() { python -c "import json,sys; d=json.load(open(sys.argv[1])); ph=d.pop('phases'); fr=d.pop('first_run_phases', []); print(json.dumps(d)); print('  phases', ph[:14]); print('  first run', fr[:8])" $1.json || tail -3 $1.err; }
for v in default start-nocb all-nocb; do
  for run in cold warm; do
    el "load_probe $v $run"
    timeout 120 python $P --cache /tmp/cache-$v --variant $v > $OUT/probe_${v}_$run.json 2> $OUT/probe_${v}_$run.err
    show $OUT/probe_${v}_$run
  done
done
for part in start rounds; do
  el "load_probe default warm, $part alone"
  timeout 100 python $P --cache /tmp/cache-default --only $part > $OUT/probe_alone_$part.json 2> $OUT/probe_alone_$part.err
  show $OUT/probe_alone_$part
done
el "exact division: strict commit GPU tests"
git apply benchmarks/results/logs19/exact_division.patch && timeout 200 python -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_int2_commit.py tests/test_int2_mosaic.py -k "commit or decode_steps" 2>&1 | tail -5
el done
