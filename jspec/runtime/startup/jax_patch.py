"""Mosaic GPU's lowering rule wrapped so that each kernel is named by its content (jax_cache holds the other
patch of JAX internals; compile_cache.use_compile_cache installs both, when a cache is turned on).

Why a patch: JAX's Mosaic GPU lowering (jax 0.11; jax.experimental.mosaic.gpu.core._mosaic_gpu_lowering_rule,
which Pallas's plgpu.kernel calls through that module attribute) stamps each kernel module with
`mosaic_gpu.dump_basename` = "<kernel>_<n>", n counting the kernels the process has lowered so far. The module
is embedded in the program, so n is part of the program's persistent compilation cache key, and a process that
lowered other kernels first misses the cache (mosaic_keys says what that cost). JAX offers no hook to name a
kernel or to see the modules it lowers, so the rule is wrapped: mosaic_keys.note renames the module to
"<sym_name>_<digest of the module>" and notes it for mosaic_keys.prime. jax 0.10 sets no counted name (the
wrapper then only notes); a JAX without the private rule gets no patch (install does nothing).
"""

from __future__ import annotations

import functools

from jspec.runtime.startup import mosaic_keys


def install() -> None:
    """Wraps JAX's lowering of a Mosaic GPU kernel (the one Pallas calls) so that it names and notes the kernel
    first. Once per process; nothing where this JAX has no such lowering."""
    try:
        from jax.experimental.mosaic.gpu import core
    except ImportError:  # pragma: no cover
        return
    rule = getattr(core, "_mosaic_gpu_lowering_rule", None)
    if rule is None or getattr(rule, "names_kernels", False):
        return

    @functools.wraps(rule)
    def lowering_rule(ctx, *args, module, **params):
        mosaic_keys.note(tuple(ctx.avals_in), module, params)
        return rule(ctx, *args, module=module, **params)

    lowering_rule.names_kernels = True
    core._mosaic_gpu_lowering_rule = lowering_rule
