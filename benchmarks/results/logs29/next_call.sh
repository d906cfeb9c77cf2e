# Prepared in session 29 (no device was lent that session; not run). `bash next_call.sh a|b`:
# `a` (~5 min), issue 16, verification at 40%. Session 29 split pallas/int2_mosaic.py into four modules (code
#   moved, not changed), so first every Mosaic kernel test in tests/test_int2_mosaic.py, among them the wgmma body's
#   lazy max (session 28) and late values (session 29: values unpacked after W's barrier, row vectors read where
#   used), on a GPU for the first time. Then kernel time, registers and occupancy per variant (auto's lop3 and
#   edge_mask in all), 5 positions, from a trace.
# `b` (~5 min), issue 14, the second process: what XLA's load of the 8B + draft program does (jaxlib 0.11.2
#   serializes the thunks: its plugin holds no legacy AOT loader, and `xla_gpu_experimental_aot_compiled_thunks` is a
#   reserved name). A cold child fills jspec's store, then a warm child runs under py-spy (native frames) and
#   benchmarks/stacks.py sums the samples inside deserialize_and_load by function. Needs carry [".whl"], the py-spy
#   wheel: `python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
#   --platform manylinux1_x86_64 -d .whl py-spy==0.4.3` (.whl/ is excluded from git). On the CPU, py-spy at 100 Hz
#   made a small warm child about 5x slower (3.4 s alone, 16.5-18.0 s), at 500 Hz about 70x.
# `c` (~5 min): the other GPU tests (`-m gpu` less tests/test_int2_mosaic.py, which `a` runs), on the split modules.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
case "$1" in
a)
  el "Mosaic kernel tests"
  timeout 230 python -m pytest -q --tb=line -m gpu -p no:cacheprovider tests/test_int2_mosaic.py 2>&1 | \
    grep -v Warning | tail -8
  el "timing"
  V=body=wgmma+lop3=True+edge_mask=True
  L=$V+lazy_max=True+late_values=True  # and at 3 CTAs per SM a grid of whole waves of 396 (decode's rule)
  timeout 130 python benchmarks/kernel_diag.py --trace --budget-s 110 --reps 4 --points 8:32768:5,64:32768:5 \
    --variants $V,$V+lazy_max=True,$V+late_values=True,$L,$L+num_splits=w396 --out $OUT 2>&1 | python -c "
import json, re, sys
for line in sys.stdin:
    if line.startswith('{'):
        r = json.loads(line)
        regs = re.search(r'regs:([0-9]+).*occ_pct:([0-9.]+)', r.get('details', {}).get('kernel_details', ''))
        print(r['B'], r['T'], r['n'], r['variant'][len('$V'):] or 'base', round(r.get('kernel_ms', 0), 4),
              round(r.get('kernel_frac_copy', 0), 3), 'regs, occupancy %', regs and regs.groups(),
              r.get('error', '')[:300])
" ;;
b)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PATH=/tmp/site/bin:$PATH
  el "cold child"
  rm -rf /tmp/c; timeout 150 python benchmarks/startup.py --child 8b+draft --cache /tmp/c --engine 2>/dev/null | \
    tail -1 | cut -c1-240
  el "warm child under py-spy"
  timeout -s INT 300 py-spy record --native --rate 100 --format raw -o $OUT/warm.raw -- \
    python benchmarks/startup.py --child 8b+draft --cache /tmp/c --engine 2>&1 | grep -v "^py-spy> You" | tail -3 | \
    cut -c1-240
  python benchmarks/stacks.py $OUT/warm.raw --within deserialize_and_load --top 45 | cut -c1-200
  gzip -9 $OUT/warm.raw ;;
c)
  el "GPU tests but the Mosaic kernel's"
  timeout 420 python -m pytest -q --tb=short -m gpu -p no:cacheprovider tests \
    --ignore=tests/test_int2_mosaic.py 2>&1 | grep -v Warning | tail -15 ;;
esac
el done
