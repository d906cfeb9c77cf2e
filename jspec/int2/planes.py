"""Where each part of a token's INT2 row lives in the cache's history arrays (kvcache owns the arrays; the
kernels read them by these planes)."""

# The planes of the INT2 history, in storage order: codes [B, H, 2, T, D/4] and qparams [B, H, 4, T, D/G].
CODE_PLANES = ("k", "v")
QPARAM_PLANES = ("scale_k", "zero_k", "scale_v", "zero_v")


def code_plane(kind: str) -> int:
    """The codes plane of "k" or "v"."""
    return CODE_PLANES.index(kind)


def qparam_plane(name: str) -> int:
    """The qparams plane of "scale_k", "zero_k", "scale_v" or "zero_v"."""
    return QPARAM_PLANES.index(name)


# The (codes, scale, zero) planes of the keys, then of the values: where the fused commit writes.
INT2_PLANES = tuple((code_plane(x), qparam_plane(f"scale_{x}"), qparam_plane(f"zero_{x}")) for x in ("k", "v"))
