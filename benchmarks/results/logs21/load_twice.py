"""Issue 14, session 21: what in a program's load is paid once per process? jaxlib compiles each Mosaic GPU kernel
when an executable holding it is loaded (the FFI instantiate stage: GetOrCreateKernel(hash, Compile(module))), once
per process per kernel hash. This loads each stored part of the 8B + draft program (load_scaling.py ... write), then
each again in the same process: the difference is what a second load no longer pays. It also counts, per part, the
Mosaic call sites and their distinct modules (from the loaded executable's HLO).

    python load_twice.py --cache DIR [--order ab|ba]
"""
import argparse, io, json, pickle, re, time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--cache", required=True)
ap.add_argument("--order", default="ab")
ap.add_argument("--count", action="store_true", help="count the Mosaic call sites in each part's HLO")
a = ap.parse_args()
t0 = time.perf_counter()
import jax  # noqa: E402
from jax.experimental import serialize_executable as se  # noqa: E402

import jspec.pallas.int2_mosaic  # noqa: E402,F401  registers the Mosaic GPU custom call's host symbols

backend = jax.devices()[0].client
devices = backend.devices()[:1]
blobs = {}
for p in sorted((Path(a.cache) / "jspec-programs").glob("*.program")):
    found = []

    class Grab(se._JaxPjrtUnpickler):  # stops at the executable's bytes, before deserializing them
        def persistent_load(self, pid):
            if pid[0] == "exec":
                found.append(pid[1])
                raise EOFError
            return super().persistent_load(pid)

    try:
        Grab(io.BytesIO(pickle.loads(p.read_bytes())[0]), backend).load()
    except EOFError:
        pass
    blobs[p.name[:8]] = found[0]
names = sorted(blobs) if a.order == "ab" else sorted(blobs)[::-1]
out = dict(setup_s=round(time.perf_counter() - t0, 2), parts={n: round(len(blobs[n]) / 1e6, 2) for n in names})
dl = jax._src.lib.xla_client.DeviceList(tuple(devices))
for rep in (1, 2):
    for n in names:
        t = time.perf_counter()
        exe = backend.deserialize_executable(blobs[n], dl)
        out[f"{n}_{rep}_s"] = round(time.perf_counter() - t, 3)
        if rep == 1 and a.count:
            text = "\n".join(m.to_string() for m in exe.hlo_modules())
            sites = [l for l in text.splitlines() if 'custom_call_target="mosaic_gpu' in l]
            configs = {hash(l[l.find("backend_config"):]) for l in sites}
            out[f"{n}_mosaic_sites"], out[f"{n}_mosaic_configs"] = len(sites), len(configs)
            out[f"{n}_triton_sites"] = text.count('custom_call_target="__gpu$xla.gpu.triton"')
            out[f"{n}_hlo_MB"] = round(len(text) / 1e6, 2)
print(json.dumps(out), flush=True)
