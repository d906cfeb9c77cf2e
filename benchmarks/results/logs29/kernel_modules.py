"""The Mosaic GPU kernel module of int2_attention_mosaic for several bodies, printed without source locations, and
a digest of each: a CPU check that a change leaves the kernels the GPU compiles as they were. Run it over two trees
and compare the digests (session 29: every body the same before and after the module split):

    mkdir -p .before/prev && git archive <rev> jspec | tar -x -C .before/prev
    PYTHONPATH=. python benchmarks/results/logs29/kernel_modules.py /tmp/new
    PYTHONPATH=.before/prev python benchmarks/results/logs29/kernel_modules.py /tmp/old
"""

import hashlib
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from jspec.pallas import int2_mosaic as im
from jspec.pallas import mosaic_keys

CONFIGS = [  # name, query rows per KV head, head_dim, scale dtype, block_t, options
    ("auto_decode", 4, 128, jnp.bfloat16, None, {}),
    ("auto_verify", 20, 128, jnp.bfloat16, None, {}),
    ("lean8_f32", 20, 64, jnp.float32, 64, dict(body="lean8")),
    ("lean_f32", 20, 64, jnp.float32, 64, dict(body="lean")),
    ("warp_lop3", 8, 128, jnp.bfloat16, 128, dict(body="warp", lop3=True)),
    ("wgmma_plain", 20, 128, jnp.bfloat16, 64, dict(body="wgmma")),
    ("wgmma_lazy", 20, 64, jnp.float32, 64, dict(body="wgmma", lazy_max=True)),
]


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, M, D, sdt, BT, kw in CONFIGS:
        shapes = [((1, 2, M, D), jnp.bfloat16), ((1, 2, 2, 300, D // 4), jnp.uint8), ((1, 2, 4, 300, 1), sdt),
                  ((1, M), jnp.int32), ((1, M), jnp.int32)]
        kw = dict(kw, block_t=BT) if BT else kw
        mosaic_keys._lowered.clear()
        f = jax.jit(lambda *a, kw=kw: im.int2_attention_mosaic(*a, merge=False, **kw))
        f.trace(*[jax.ShapeDtypeStruct(*s) for s in shapes]).lower(lowering_platforms=("cuda",))
        (_, module, _), = mosaic_keys._lowered.values()
        attrs = module.operation.attributes
        if mosaic_keys.DUMP_NAME in attrs:  # the name carries a digest of the module with its locations
            del attrs[mosaic_keys.DUMP_NAME]
        text = module.operation.get_asm(enable_debug_info=False)
        (out / f"{name}.mlir").write_text(text)
        print(name, hashlib.sha256(text.encode()).hexdigest()[:16])


if __name__ == "__main__":
    main()
