"""The INT2 codec (jspec/quant.py): packing layout, error bounds, clipping, degenerate rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.int2 import quant

D = 128
SCALE_DTYPES = [jnp.bfloat16, jnp.float32]


def _rows(seed, n=64, d=D):
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def test_pack_unpack_round_trip():
    codes = np.random.default_rng(0).integers(0, 4, (3, 5, D), dtype=np.uint8)
    packed = quant.pack(jnp.asarray(codes))
    assert packed.shape == (3, 5, D // 4) and packed.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(quant.unpack(packed)), codes)


def test_planar_layout():
    codes = np.random.default_rng(1).integers(0, 4, (7, D), dtype=np.uint8)
    packed = np.asarray(quant.pack(jnp.asarray(codes)))
    Q = D // 4
    for j in range(Q):
        # byte j: dims j, j+D/4, j+D/2, j+3D/4 in bit pairs 0-1, 2-3, 4-5, 6-7
        want = codes[:, j] | codes[:, j + Q] << 2 | codes[:, j + 2 * Q] << 4 | codes[:, j + 3 * Q] << 6
        np.testing.assert_array_equal(packed[:, j], want)
    for i in range(4):  # bit pair i of every byte is the contiguous quarter i
        np.testing.assert_array_equal((packed >> (2 * i)) & 3, codes[:, i * Q : (i + 1) * Q])


@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
@pytest.mark.parametrize("G", [D, D // 2, 32])
def test_error_bound_unclipped(G, scale_dtype):
    x = _rows(2) * 3.0
    packed, scale, zero = quant.quantize(jnp.asarray(x), G, 0.0, scale_dtype)
    assert packed.shape == (64, D // 4) and scale.shape == zero.shape == (64, D // G)
    assert scale.dtype == zero.dtype == scale_dtype
    deq = np.asarray(quant.dequantize(packed, scale, zero))
    s = np.repeat(np.asarray(scale.astype(jnp.float32)), G, axis=-1)  # per element
    # round to nearest against the stored (scale, zero): at most half a step, up to float rounding
    assert np.all(np.abs(x - deq) <= s / 2 * (1 + 1e-3) + 1e-6)
    assert np.all(np.asarray(quant.unpack(packed)) <= 3)


@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
def test_group_extremes_are_levels(scale_dtype):
    # min and max of every group are reproduced (up to the stored scale/zero precision)
    x = _rows(3)
    G = 32
    deq = np.asarray(quant.fake_quantize(jnp.asarray(x), G, 0.0, scale_dtype)).reshape(64, -1, G)
    xg = x.reshape(64, -1, G)
    tol = 1e-5 if scale_dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(deq.min(-1), xg.min(-1), atol=tol)
    np.testing.assert_allclose(deq.max(-1), xg.max(-1), atol=tol)


@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
@pytest.mark.parametrize("G", [D, 32])
def test_constant_and_zero_rows(G, scale_dtype):
    x = np.stack([np.zeros(D), np.full(D, 2.5), np.full(D, -0.75), np.full(D, 1e-4)]).astype(np.float32)
    packed, scale, zero = quant.quantize(jnp.asarray(x), G, 0.96, scale_dtype)
    deq = np.asarray(quant.dequantize(packed, scale, zero))
    for a in (scale, zero, deq):
        assert np.all(np.isfinite(np.asarray(a, np.float32)))
    np.testing.assert_array_equal(deq[0], 0.0)
    rtol = 1e-6 if scale_dtype == jnp.float32 else 1e-2  # zero = -mn/scale is huge: bf16 rounds it
    np.testing.assert_allclose(deq, x, rtol=rtol, atol=1e-7)


def test_clip_disabled():
    x = jnp.asarray(_rows(4))
    for ratio in (0.0, -1.0):
        np.testing.assert_array_equal(np.asarray(quant.clip_rows(x, ratio)), np.asarray(x))


@pytest.mark.parametrize("ratio", [0.96, 0.92, 0.5, 1.0])
def test_clip_bounded_by_quantile(ratio):
    x = _rows(5)
    idx = min(int(ratio * D), D - 1)
    thr = np.sort(np.abs(x), axis=-1)[:, idx : idx + 1]
    c = np.asarray(quant.clip_rows(jnp.asarray(x), ratio))
    assert np.all(np.abs(c) <= thr)
    np.testing.assert_allclose(np.abs(c).max(-1, keepdims=True), thr)
    keep = np.abs(x) <= thr
    np.testing.assert_array_equal(c[keep], x[keep])  # values inside the threshold are untouched
    np.testing.assert_array_equal(np.sign(c[~keep]), np.sign(x[~keep]))
    assert np.all((~keep).sum(-1) <= D - 1 - idx)  # at most the top D-1-idx values are clamped


def test_quantize_applies_clip():
    x = _rows(6)
    x[:, 0] = 50.0  # one outlier per row: clipping must stop it from stretching the range
    ratio = 0.96
    thr = np.sort(np.abs(x), axis=-1)[:, int(ratio * D)]
    packed, scale, zero = quant.quantize(jnp.asarray(x), D, ratio, jnp.float32)
    deq = np.asarray(quant.dequantize(packed, scale, zero))
    s = np.asarray(scale)[:, 0]
    assert np.all(np.abs(deq).max(-1) <= thr + 1e-5)
    assert np.all(s <= 2 * thr / 3 + 1e-6)
    clipped = np.clip(x, -thr[:, None], thr[:, None])
    assert np.all(np.abs(clipped - deq) <= s[:, None] / 2 + 1e-6)


def test_relative_mse_matches_reference_numbers():
    # oscar.md section 3.7: i.i.d. N(0, 1) rows, D = 128, G = D
    x = jnp.asarray(np.random.default_rng(7).standard_normal((4000, D)).astype(np.float32))
    for ratio, want in ((0.0, 0.251), (0.96, 0.156), (0.92, 0.127)):
        deq = quant.fake_quantize(x, D, ratio, jnp.float32)
        rel = float(jnp.sum((deq - x) ** 2) / jnp.sum(x**2))
        assert abs(rel - want) < 0.01, (ratio, rel)


def test_dtype_and_shapes_preserved():
    x = jnp.asarray(_rows(8).reshape(2, 4, 8, D)).astype(jnp.bfloat16)
    packed, scale, zero = quant.quantize(x, 32, 0.92)
    assert packed.shape == (2, 4, 8, D // 4) and scale.shape == (2, 4, 8, 4)
    y = quant.fake_quantize(x, 32, 0.92)
    assert y.dtype == jnp.bfloat16 and y.shape == x.shape


def test_rank_counting_order_statistic_equals_the_sort():
    # Many ties (integers): the rank path must pick exactly sort(a)[idx], as the sort path does.
    a = jnp.abs(jnp.round(jax.random.normal(jax.random.key(3), (64, 128)) * 3))
    idx = np.array([[0], [5], [100], [127]] * 16, np.int32)
    want = np.take_along_axis(np.sort(np.asarray(a), -1), idx, -1)
    np.testing.assert_array_equal(np.asarray(quant.order_statistic(a, jnp.asarray(idx))), want)
    big = jnp.tile(a, (quant.RANK_ROWS // 64 + 1, 1))  # over RANK_ROWS rows: the sort path
    np.testing.assert_array_equal(np.asarray(quant.order_statistic(big, jnp.asarray(idx[:1])))[:64],
                                  np.sort(np.asarray(a), -1)[:, :1])


def test_per_plane_clip_equals_separate_clips():
    x = jax.random.normal(jax.random.key(4), (3, 5, 2, 64))
    both = quant.clip_rows(x, (0.96, 0.9))
    for plane, ratio in enumerate((0.96, 0.9)):
        alone = quant.clip_rows(x[..., plane, :], ratio)
        np.testing.assert_array_equal(np.asarray(both[..., plane, :]), np.asarray(alone))
    np.testing.assert_array_equal(np.asarray(quant.clip_rows(x, (0.0, 0.9))[..., 0, :]), np.asarray(x[..., 0, :]))
