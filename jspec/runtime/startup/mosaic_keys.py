"""Mosaic GPU kernels with the same compilation-cache key in every process.

JAX's Mosaic GPU lowering (jax 0.11) stamps each kernel module with `mosaic_gpu.dump_basename` =
"<kernel>_<n>", n counting the kernels this process has lowered so far. The kernel module is embedded
in the program, so n is part of the program's persistent compilation cache key: the key depends on
what the process lowered before. The README command's first run lowers kernels for `--lookahead
auto`'s timing programs before its generate program, its second run reads those timings from disk and
lowers none, so the second run looked for another key and compiled everything again (issue 14: 5.9 to
9.8 s of a 10.8 s warm run on the H200). The name only names debug dumps; here it becomes the kernel's
name and a digest of its module, the same in every process.

The lowering also notes each kernel so that `prime` can compile it ahead of the programs that hold it.
jaxlib compiles a Mosaic GPU kernel while XLA builds the program around it, under LLVM's command-line
options lock with options of its own, so it waits until no XLA compile in the process holds that lock:
with the generate program's parts compiled side by side, the kernel in one part waited for the others (one
build of 16.2 s against 0.5 s; compiled beside the parts it still waited, 14.3 s). A kernel compiled before
the programs is found in jaxlib's in-process cache: the 8B + draft cold compile took 30-33 s against 48-52 s
on one H200 host (docs/kernels.md).

The lowering is reached through jax_patch (it says why), which compile_cache.use_compile_cache installs: kernels
are named and noted only while a compilation cache is on.
"""

from __future__ import annotations

import hashlib
import io
import warnings

from jspec.config import default_platform

DUMP_NAME = "mosaic_gpu.dump_basename"
_lowered: dict = {}  # digest -> (input avals, module, params) of each kernel lowered and not yet primed
_primed: set = set()


def note(avals, module, params) -> None:
    """Names a kernel module being lowered (name_kernel) and notes it, with its input avals and lowering params,
    for prime unless it was primed before. Called by jax_patch's wrapper of JAX's lowering rule."""
    digest = name_kernel(module)
    if digest not in _primed:
        _lowered[digest] = (avals, module, params)


def name_kernel(module) -> str:
    """Replaces the kernel module's counted dump name by "<sym_name>_<digest of the module>"; the digest."""
    from jax._src.lib.mlir import ir

    attrs = module.operation.attributes
    named = DUMP_NAME in attrs  # jax 0.10: no counted name
    if named:
        del attrs[DUMP_NAME]
    code = io.BytesIO()
    module.operation.write_bytecode(code)  # a tenth of the time of printing it
    digest = hashlib.sha256(code.getvalue()).hexdigest()[:16]
    if named:
        name = ir.StringAttr(attrs["sym_name"]).value if "sym_name" in attrs else "kernel"
        attrs[DUMP_NAME] = ir.StringAttr.get(f"{name}_{digest}", module.context)
    return digest


def prime() -> None:
    """Compiles each Mosaic GPU kernel lowered since the last call, each in a program of its own (on a GPU;
    elsewhere they are dropped), so that jaxlib holds it compiled before the programs that call it are
    (programs.compile_all calls it before theirs). A kernel that fails here is left to its program's
    compile, as before, with a warning."""
    while _lowered:
        digest, noted = _lowered.popitem()
        _primed.add(digest)
        if default_platform() == "gpu":
            try:
                kernel_program(*noted).compile()
            except Exception as e:  # noqa: BLE001
                warnings.warn(f"Mosaic GPU kernel {digest} not compiled ahead of its program ({str(e)[:200]}): its "
                              "program's compile builds it, and may wait for other compiles in the process",
                              stacklevel=2)


def kernel_program(avals, module, params, platforms: tuple = ()):
    """One noted Mosaic GPU kernel (its input avals, module and lowering params) alone in a program, lowered
    (for `platforms`, where given): the kernel's custom call as in the program it was noted in, the same
    module and so the same hash."""
    import jax
    from jax.experimental.mosaic.gpu import core

    fn = lambda *a: core.mosaic_gpu_p.bind(*a, module=module, out_types=params["out_types"],
                                           inout_types=params["inout_types"])
    traced = jax.jit(fn).trace(*(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals))
    return traced.lower(lowering_platforms=platforms) if platforms else traced.lower()
