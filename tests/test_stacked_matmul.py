"""x @ w[layer] for a stacked model's weights in one Pallas kernel (pallas/stacked_matmul.py): equal to XLA's product
up to the sums' order (interpret mode on the CPU, compiled on a GPU), at the layer asked for; the tilings model
.STACKED_GEMMS gives the 8B shape compile and agree on a GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec import model
from jspec.pallas import stacked_matmul as sm

gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")


def _check(M, K, tail, t, dtype, interpret, layers=3):
    kx, kw = jax.random.split(jax.random.key(M))
    x = jax.random.normal(kx, (M, K), jnp.float32).astype(dtype)
    w = (jax.random.normal(kw, (layers, K, *tail), jnp.float32) / np.sqrt(K)).astype(dtype)
    got = sm.matmul(x, w, jnp.int32(1), t, interpret=interpret)
    want = jnp.einsum("mk,k...->m...", x.astype(jnp.float32), w[1].astype(jnp.float32), precision="highest")
    assert got.shape == (M, *tail) and got.dtype == dtype
    # f32 within the kernel's products' rounding (TF32 on a GPU), bf16 within the output's rounding
    tol = 2**-7 if dtype == jnp.bfloat16 or not interpret else 1e-5
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=tol, atol=tol)
    other = jnp.einsum("mk,k...->m...", x.astype(jnp.float32), w[2].astype(jnp.float32))
    assert not np.allclose(np.asarray(got, np.float32), np.asarray(other), atol=0.1)


@pytest.mark.parametrize("M", [1, 5, 16, 40])
@pytest.mark.parametrize("t", [sm.Tiling(16, 32, 1), sm.Tiling(32, 16, 4)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_interpret_matches_xla(M, t, dtype):
    _check(M, 128, (2, 32), t, dtype, interpret=True)


def test_supported_shapes():
    t = sm.Tiling(64, 128, 2)
    assert sm.supported(64, 1024, 128, t) and not sm.supported(65, 1024, 128, t)  # rows past MAX_ROWS: XLA's
    assert not sm.supported(8, 1024, 96, t) and not sm.supported(8, 384, 128, t)  # N by bn, K by splits x bk
    with pytest.raises(ValueError, match="not supported"):
        sm.matmul(jnp.ones((8, 384)), jnp.ones((2, 384, 128)), jnp.int32(0), t, interpret=True)


def test_lowers_for_cuda():
    x, w = jnp.ones((8, 4096), jnp.bfloat16), jnp.ones((2, 4096, 8, 6, 128), jnp.bfloat16)
    fn = lambda x, w, layer: sm.matmul(x, w, layer, model.STACKED_GEMMS["wqkv"])
    text = jax.jit(fn).trace(x, w, jnp.int32(1)).lower(lowering_platforms=("cuda",)).as_text()
    assert "stacked_matmul" in text and "__gpu$xla.gpu.triton" in text


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("M", [1, 8, 40])
@pytest.mark.parametrize("name", ["wqkv", "wo"])
def test_8b_tilings_compiled_match_xla(name, M):
    K, tail = {"wqkv": (4096, (8, 6, 128)), "wo": (4096, (4096,))}[name]
    _check(M, K, tail, model.STACKED_GEMMS[name], jnp.bfloat16, interpret=False)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_small_compiled_matches_xla(dtype):
    _check(5, 256, (2, 64), sm.Tiling(64, 32, 2), dtype, interpret=False)
