"""The residual add and RMS norm in one Pallas kernel (pallas/add_norm.py): equal to model.add_rms_norm's XLA path
(interpret mode on the CPU, compiled on a GPU), the stacked weights read at the layer asked for; a model whose norms
take the kernel gives the XLA path's logits, its layer loop unrolled and rolled."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.cache import kvcache
from jspec.config import KVConfig, ModelConfig, Options
from jspec.kernels.add_norm import add_norm, supported
from jspec.model import decoder as model

CFG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3,
                  num_heads=4, num_kv_heads=2, head_dim=16, max_position=64)


def _inputs(shape, dtype, layers=4):
    kx, ky, kw = jax.random.split(jax.random.key(0), 3)
    x, y = (jax.random.normal(k, shape, jnp.float32).astype(dtype) for k in (kx, ky))
    w = (1 + 0.3 * jax.random.normal(kw, (layers, shape[-1]))).astype(dtype)
    return x, y, w


def _check(shape, dtype, interpret):
    x, y, w = _inputs(shape, dtype)
    for layer in (None, 2):
        s, h = add_norm(x, y, w[1] if layer is None else w, None if layer is None else jnp.int32(layer), eps=1e-5,
                        interpret=interpret)
        want_s, want_h = model.add_rms_norm(x, y, w[1 if layer is None else layer], 1e-5)
        assert s.dtype == h.dtype == dtype and s.shape == h.shape == x.shape
        np.testing.assert_array_equal(np.asarray(s, np.float32), np.asarray(want_s, np.float32))
        # the sum of squares in another order: f32 within rounding, bf16 within one unit in the last place
        tol = dict(rtol=1e-6, atol=1e-6) if dtype == jnp.float32 else dict(rtol=2**-7, atol=0)
        np.testing.assert_allclose(np.asarray(h, np.float32), np.asarray(want_h, np.float32), **tol)
    other = model.add_rms_norm(x, y, w[3], 1e-5)[1]  # another layer's weights give other numbers
    assert not np.allclose(np.asarray(other, np.float32), np.asarray(h, np.float32))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 32), (2, 5, 64)])
def test_add_norm_interpret_matches_xla(shape, dtype):
    _check(shape, dtype, interpret=True)


def test_supported_shapes():
    assert supported(1, 4096) and supported(512, 1024)
    assert not supported(1, 384)  # not a power of two: XLA's path
    assert not supported(513, 4096)  # a prefill's rows


@pytest.mark.parametrize("unroll", [True, 1])
def test_model_with_fused_norms_matches_xla(unroll, monkeypatch):
    """A prefill and a decode step through forward_taps (taps included), the norms in the kernel (interpret mode)
    against XLA's, float32."""
    params = model.init_params(CFG, jax.random.key(0), std=0.3)
    keys = iter(jax.random.split(jax.random.key(1), 2 * CFG.num_layers))
    norm = lambda: 1 + 0.3 * jax.random.normal(next(keys), (CFG.hidden_size,))  # each layer's own: a wrong index shows
    norms = [(norm(), norm()) for _ in range(CFG.num_layers)]
    params = params.replace(layers=params.layers.replace(attn_norm=jnp.stack([a for a, _ in norms]),
                                                         mlp_norm=jnp.stack([m for _, m in norms])))
    kv = KVConfig("int2", sink=2, recent=4)

    def run(options):
        jax.clear_caches()
        cache = kvcache.init_cache(CFG, kv, 2, 32, jnp.float32)
        tokens = jnp.asarray(np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 7)), jnp.int32)
        out = []
        for _ in range(2):
            logits, (k, v), feats = model.forward_taps(params, CFG, tokens, cache, (0, 3), options=options)
            cache = kvcache.commit(cache, k, v, jnp.full((2,), tokens.shape[1], jnp.int32))
            out += [logits, feats]
            tokens = jnp.argmax(logits[:, -1:], -1).astype(jnp.int32)
        return out

    want = run(Options(fused_norms=False, layer_unroll=unroll))
    calls = []
    fused = jax.jit(add_norm, static_argnames=("eps", "interpret"))
    monkeypatch.setattr(model, "add_norm", lambda *a, **k: calls.append(1) or fused(*a, **k))  # a spy: counts calls
    got = run(Options(fused_norms=True, layer_unroll=unroll))
    assert len(calls) == 2 * 3  # each forward traces its layers' body once (a nested jit or the scan's): 2, the final 1
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 4096), (8, 5, 1024), (64, 1, 32)])
def test_add_norm_compiled_matches_xla(shape, dtype):
    _check(shape, dtype, interpret=False)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
def test_fused_norms_on_gpu():
    """On a GPU forwards of 8B width take the kernel, but not under a mesh, nor the shipped pair's widths."""
    assert model.fused_norms(4096) and not model.fused_norms(384)
    assert not model.fused_norms(4096, Options(fused_norms=False))
    with jax.set_mesh(jax.make_mesh((1, 1), ("dp", "tp"))):
        assert not model.fused_norms(4096)


def test_add_norm_lowers_for_cuda():
    x, y, w = _inputs((8, 1, 4096), jnp.bfloat16)
    fn = lambda x, y, w, layer: add_norm(x, y, w, layer, eps=1e-5)
    text = jax.jit(fn).trace(x, y, w, jnp.int32(1)).lower(lowering_platforms=("cuda",)).as_text()
    assert "add_norm" in text and "__gpu$xla.gpu.triton" in text


@pytest.mark.parametrize("layer", [None, 2])
def test_fused_norm_differentiates_as_xla(layer):
    """Training through a forward that takes the kernel (a Pallas call has no derivative of its own): its gradients
    are XLA's path's (interpret mode, float32)."""
    x, y, w = _inputs((2, 3, 64), jnp.float32)
    w = w if layer is not None else w[1]
    index = None if layer is None else jnp.int32(layer)

    def loss(fused):
        def f(x, y, w):
            s, h = model.add_rms_norm(x, y, w, 1e-5, fused, index, interpret=True)
            return (s * jnp.cos(h)).sum() + (h * h).sum()
        return jax.grad(f, argnums=(0, 1, 2))(x, y, w)

    for got, want in zip(loss(True), loss(False)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
