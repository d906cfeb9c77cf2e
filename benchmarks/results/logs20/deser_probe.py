"""Issue 14: does a program's load depend on the compile options given to deserialize_executable? JAX's cache passes
the options JAX compiled with (compiler.get_compile_options: among them debug_options.xla_gpu_cuda_data_dir, the CUDA
directory where ptxas and libdevice are found; the default is './cuda_sdk_lib'); jax.experimental.serialize_executable,
which jspec's program store uses, passes none. One fresh process per variant, both parts of the 8B + draft program
one after the other, each part's deserialize_executable timed.

    python deser_probe.py --cache DIR store-none|store-opts|jax-none|jax-opts   # after store_probe.py ... write
"""
import argparse, io, json, pickle, sys, time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("variant", choices=["store-none", "store-opts", "jax-none", "jax-opts"])
ap.add_argument("--cache", required=True)
a = ap.parse_args()
t0 = time.perf_counter()
import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax._src import compilation_cache, compiler  # noqa: E402
from jax.experimental import serialize_executable as se  # noqa: E402

import jspec.pallas.int2_mosaic  # noqa: E402,F401  registers the Mosaic GPU custom call's host symbols

backend = jax.devices()[0].client
devices = backend.devices()[:1]
source, opts = a.variant.split("-")
out = dict(variant=a.variant, cuda_path=str(compiler.lib.cuda_path))
options = None
if opts == "opts":
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1, device_assignment=np.array([[devices[0]]]),
                                           backend=backend)
    out["cuda_data_dir"] = options.executable_build_options.debug_options.xla_gpu_cuda_data_dir
blobs = {}
if source == "store":
    for p in sorted((Path(a.cache) / "jspec-programs").glob("*.program")):
        serialized = pickle.loads(p.read_bytes())[0]
        found = []

        class Grab(se._JaxPjrtUnpickler):  # stops at the executable's bytes, before deserializing them
            def persistent_load(self, pid):
                if pid[0] == "exec":
                    found.append(pid[1])
                    raise EOFError
                return super().persistent_load(pid)

        try:
            Grab(io.BytesIO(serialized), backend).load()
        except EOFError:
            pass
        blobs[p.name[:8]] = found[0]
else:
    for p in sorted(Path(a.cache).glob("jit__*-cache")):
        if p.name.startswith(("jit__start", "jit__rounds")):
            blobs[p.name.split("-")[0]] = compilation_cache.extract_executable_and_time(
                compilation_cache.decompress_executable(p.read_bytes()))[0]
out["setup_s"] = round(time.perf_counter() - t0, 2)
dl = jax._src.lib.xla_client.DeviceList(tuple(devices))
for name, blob in blobs.items():
    t = time.perf_counter()
    exe = backend.deserialize_executable(blob, dl, options) if options is not None else \
        backend.deserialize_executable(blob, dl)
    out[f"{name}_MB"], out[f"{name}_s"] = round(len(blob) / 1e6, 2), round(time.perf_counter() - t, 3)
print(json.dumps(out), flush=True)
