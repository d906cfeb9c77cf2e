"""The residual add and RMSNorm as one kernel (pallas/add_norm.py) against the XLA ops it replaces, in
interpret mode on CPU and compiled on a GPU; and the model with it on (model.FUSED_ADD_NORM)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params

from jspec import model
from jspec.config import ModelConfig
from jspec.pallas import add_norm as an


def _rows(shape, dtype, seed=0):
    x, y, w = (jax.random.normal(k, s) for k, s in zip(jax.random.split(jax.random.key(seed), 3),
                                                       (shape, shape, shape[-1:])))
    return x.astype(dtype), (3 * y).astype(dtype), (1 + w).astype(dtype)


def _check(s, h, x, y, w, eps=1e-5):
    ref_s, ref_h = an.add_rms_norm_reference(x, y, w, eps)
    np.testing.assert_array_equal(np.asarray(ref_h), np.asarray(model.rms_norm(x + y, w, eps)))  # the model's
    assert s.dtype == h.dtype == x.dtype and s.shape == h.shape == x.shape
    np.testing.assert_array_equal(np.asarray(s, np.float32), np.asarray(ref_s, np.float32))
    tol = 1e-6 if x.dtype == jnp.float32 else 1e-2  # bf16: one rounding of h may differ
    np.testing.assert_allclose(np.asarray(h, np.float32), np.asarray(ref_h, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", [(1, 1, 64), (2, 5, 256), (3, 16)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_add_rms_norm_matches_xla(shape, dtype):
    x, y, w = _rows(shape, dtype)
    _check(*an.add_rms_norm(x, y, w, 1e-5, interpret=True), x, y, w)


def test_add_rms_norm_lowers_for_cuda():
    x, y, w = _rows((1, 1, 4096), jnp.bfloat16)
    text = jax.jit(lambda *a: an.add_rms_norm(*a, 1e-5)).trace(x, y, w).lower(lowering_platforms=("cuda",)).as_text()
    assert "add_rms_norm" in text and "triton" in text


def test_unsupported_rows_are_refused():
    assert an.supported(4096) and an.supported(64) and not an.supported(384) and not an.supported(8)
    x, y, w = _rows((2, 384), jnp.float32)
    with pytest.raises(ValueError, match="power of two"):
        an.add_rms_norm(x, y, w, 1e-5, interpret=True)


def _kernel_calls(jaxpr) -> int:
    """pallas_calls in a jaxpr, nested calls included (each layer's call of the shared block counts)."""
    return sum((e.primitive.name == "pallas_call") + sum(map(_kernel_calls, jaxprs_in_params(e.params)))
               for e in jaxpr.eqns)


@pytest.fixture
def fused(monkeypatch):
    """model.FUSED_ADD_NORM on for one test: the layers' nested jit keeps the traces it made, so they are
    dropped when the switch turns on and again when it turns off (no other test sees a fused trace)."""
    def on():
        monkeypatch.setattr(model, "FUSED_ADD_NORM", True)
        model._block.clear_cache()

    yield on
    monkeypatch.undo()
    model._block.clear_cache()


def test_model_with_fused_add_norm_matches(fused):
    """Logits, greedy tokens, new K/V rows and the residual taps (an EAGLE-3 head's input) of a tiny f32 model,
    kernel on (interpret mode) and off; a hidden size the kernel does not take falls back to XLA's ops."""
    cfg = ModelConfig("llama", 64, 64, 128, 3, 4, 2, 16, max_position=64)
    params = model.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, cfg.vocab_size)
    forward = lambda p, c: model.forward_taps(p, c, tokens, None, (0, 1, c.num_layers))
    ref = forward(params, cfg)
    fused()
    assert _kernel_calls(jax.make_jaxpr(lambda p: forward(p, cfg))(params).jaxpr) == 2 * cfg.num_layers  # 2 adds
    out = forward(params, cfg)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    assert (out[0].argmax(-1) == ref[0].argmax(-1)).all()
    odd = ModelConfig("llama", 64, 48, 96, 1, 4, 2, 12, max_position=64)
    odd_params = model.init_params(odd, jax.random.key(2))
    assert _kernel_calls(jax.make_jaxpr(lambda p: forward(p, odd)[0])(odd_params).jaxpr) == 0


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("shape", [(1, 1, 4096), (8, 5, 4096), (4, 2048, 1024)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_compiled_add_rms_norm_matches_xla(shape, dtype):
    x, y, w = _rows(shape, dtype, seed=3)
    _check(*an.add_rms_norm(x, y, w, 1e-5), x, y, w)
