"""The Mosaic GPU INT2 kernel: its register maps and algebra on CPU (a numpy model of what each thread
loads and computes), and the compiled kernel against the reference on a Hopper GPU."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import layers_of
from jspec.kernels import common, reference
from jspec.kernels.hopper import attention as im, decode, prepare, verify
from jspec.runtime.startup import jax_patch, mosaic_keys
from jspec.kernels.hopper.decode import DecodeConfig
from jspec.kernels.hopper.verify import VerifyConfig


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _inputs(seed, B, H, M, D, T, scale_dtype, empty_rows=True):
    """Random codes/scales in the cache's layout and per-row ranges; some rows get an empty range."""
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, H, M, D)), jnp.bfloat16)
    codes = jnp.asarray(rng.integers(0, 256, (B, H, 2, T, D // 4)), jnp.uint8)
    scale = rng.uniform(0.05, 0.5, (B, H, 2, 1, T, 1))
    zero = rng.uniform(0.0, 3.0, (B, H, 2, 1, T, 1))
    qparams = jnp.asarray(np.concatenate([scale, zero], 3).reshape(B, H, 4, T, 1), scale_dtype)
    lo = rng.integers(0, max(1, T // 4), (B, M))
    hi = rng.integers(0, T + 1, (B, M))
    if empty_rows:
        hi[0, ::3] = lo[0, ::3]  # empty ranges (batch row 0 only, so that some rows stay live)
    return q, codes, qparams, jnp.asarray(lo, jnp.int32), jnp.asarray(hi, jnp.int32)


# --- numpy model of the kernel's threads -----------------------------------------------------------


def _bf16_lanes(v):
    """uint32 holding two bf16 -> (low, high) as float."""
    as_f = lambda h: (np.asarray(h, np.uint32) << 16).view(np.float32)
    return as_f(v & 0xFFFF), as_f(v >> 16)


def _plane(y, i):
    y = y >> 6 if i == 3 else y
    return (y & (0x00030003 << (0 if i == 3 else 2 * i))) | 0x43004300


def _model_keys(tile, D):
    """What unpack_keys leaves in C_K [BT, D]: thread column c loads bytes [c D/16, (c+1) D/16) of its rows."""
    BT = tile.shape[0]
    out = np.zeros((BT, D), np.float32)
    for c in range(4):
        words = np.ascontiguousarray(tile[:, c * (D // 16):(c + 1) * (D // 16)]).view("<u4")  # [BT, D/64]
        for u in range(D // 64):
            for q, y in enumerate((words[:, u], words[:, u] >> 8)):
                for i in range(4):
                    ct = 8 * u + 2 * i + q
                    out[:, 8 * ct + 2 * c], out[:, 8 * ct + 2 * c + 1] = _bf16_lanes(_plane(y, i))
    return out


def _model_values(tile, D):
    """What unpack_values leaves in C_V^T [D, BT], from ldmatrix.trans: thread (g, c) of warp w gets the
    16-bit column g of half h of tokens t, t + 1 (t = 8 matrix + 2 c) in one register."""
    BT = tile.shape[0]
    u16 = np.ascontiguousarray(tile).view("<u2").astype(np.uint32)  # [BT, D/8]
    out = np.zeros((D, BT), np.float32)
    for w in range(4):
        h, parity = (w // 2 if D == 128 else 0), w % 2
        for g in range(8):
            for mat in range(BT // 8):
                t = 8 * mat + 2 * np.arange(4)  # c = 0..3
                y = (u16[t, 8 * h + g] | (u16[t + 1, 8 * h + g] << 16)) >> (8 * parity)
                for mt in range(D // 64):
                    for hr in range(2):
                        if D == 128:
                            v = _plane(y, 2 * mt + hr)
                        else:
                            v = ((y >> (2 * (2 * (w // 2) + hr))) & 0x00030003) | 0x43004300
                        r = 64 * mt + 16 * w + 8 * hr + g
                        out[r, t], out[r, t + 1] = _bf16_lanes(v)
    return out


def _codes(tile, D):
    """[BT, D/4] uint8 -> [BT, D] codes in head-dimension order (planar packing)."""
    return np.concatenate([(tile >> (2 * i)) & 3 for i in range(4)], axis=1).astype(np.float32)


def _model_inputs(q, codes, qparams, lo, hi, splits, BT, body=verify):
    """What a model kernel reads (the body's Q', row vectors, schedule; codes and scales padded by a block) and
    its zeroed outputs (raw, stats)."""
    B, H, M, D = q.shape
    T = codes.shape[3]
    qp, colv, sched = (np.asarray(x, np.float32) for x in body.prepare_queries(q, lo, hi, T, splits, BT))
    N = -(-M // 8) * 8
    cod = np.pad(np.asarray(codes), ((0, 0),) * 3 + ((0, BT),) + ((0, 0),))
    par = np.pad(np.asarray(qparams, np.float32)[..., 0], ((0, 0),) * 3 + ((0, BT),))
    raw, stats = np.zeros((B, H, splits, D, N), np.float32), np.zeros((B, H, splits, 4, N), np.float32)
    return qp, colv, sched.astype(np.int64), cod, par, raw, stats


def _model(q, codes, qparams, lo, hi, splits, BT, sm_scale=None):
    """The verification body's per-CTA loop in numpy (f32, W rounded to bf16 as in the kernel), then im.finish."""
    B, H, M, D = q.shape
    qp, colv, sched, cod, par, raw, stats = _model_inputs(q, codes, qparams, lo, hi, splits, BT)
    sm_scale = D**-0.5 if sm_scale is None else sm_scale
    N = qp.shape[2]
    for b, h, s in np.ndindex(B, H, splits):
        qoff, qsum, rlo, rhi = colv[b, h]
        m, acc = np.full(N, -1e30, np.float32), np.zeros((D, N), np.float32)
        lt = wt = zt = np.zeros((BT, N), np.float32)
        for j in range(sched[b, s, 1]):
            t0 = sched[b, s, 0] + j * BT
            ks, kz, vs, vz = (par[b, h, i, t0:t0 + BT][:, None] for i in range(4))
            ck, cv = _model_keys(cod[b, h, 0, t0:t0 + BT], D), _model_values(cod[b, h, 1, t0:t0 + BT], D)
            sc = ks * sm_scale * 1.4426950408889634 * (ck @ qp[b, h].T - qoff - kz * qsum)
            tok = t0 + np.arange(BT)[:, None]
            sc = np.where((tok >= rlo) & (tok < rhi), sc, -np.inf)
            m_new = np.maximum(m, sc.max(0))
            alpha, p = np.exp2(m - m_new), np.exp2(sc - m_new)
            assert np.all(p <= 1.0)
            wv = (p * vs).astype(jnp.bfloat16).astype(np.float32)  # numpy bf16 (ml_dtypes)
            lt, wt, zt = lt * alpha + p, wt * alpha + wv, zt * alpha + wv * vz
            acc, m = acc * alpha + cv @ wv, m_new
        raw[b, h, s] = acc
        stats[b, h, s] = [m, np.sum(lt, 0), np.sum(wt, 0), np.sum(zt, 0)]
    return im.finish(jnp.asarray(raw), jnp.asarray(stats), M, decode_layout=False)


@pytest.mark.parametrize("D", [64, 128])
def test_register_slots_hold_the_advertised_codes(D):
    """key_slots/value_slots describe what the bit tricks leave in each register slot: 128 + f * code."""
    tile = np.random.default_rng(D).integers(0, 256, (64, D // 4)).astype(np.uint8)
    c = _codes(tile, D)
    kdims, kf = verify.key_slots(D)
    np.testing.assert_array_equal(_model_keys(tile, D), 128 + kf * c[:, kdims])
    vdims, vf = verify.value_slots(D)
    np.testing.assert_array_equal(_model_values(tile, D), (128 + vf[:, None] * c[:, vdims].T))
    assert sorted(kdims) == list(range(D)) and sorted(vdims) == list(range(D))


def _model_decode(q, codes, qparams, lo, hi, splits, BT=64, sm_scale=None):
    """The decode body in numpy: each warp's 16 tokens per block, lazy max (vote over the warp), the range mask
    outside [max lo, min hi) only, the 4 warps merged at the end; u8 key codes and the Q digits decoded from
    prepare_queries' bytes, the value split, value zeros as bf16 hi + lo; then im.finish."""
    B, H, M, D = q.shape
    _, _, sched, cod, par, raw, stats = _model_inputs(q, codes, qparams, lo, hi, splits, BT, decode)
    keys, values = _model_imma_keys, _model_decode_values
    qbytes, colv, _ = decode.prepare_queries(q, lo, hi, codes.shape[3], splits, BT)
    qp, colv = _imma_fixed(qbytes, D).astype(np.float32), np.asarray(colv)
    sm_scale = D**-0.5 if sm_scale is None else sm_scale
    N = qp.shape[2]
    raw = np.zeros((B, H, splits, D, N), np.float32)
    for b, h, sp in np.ndindex(B, H, splits):
        qoff, qsum, rlo, rhi = colv[b, h]
        first, nb, lo_max, hi_min = sched[b, sp]
        m, acc = np.full((4, N), -1e30, np.float32), np.zeros((4, D, N), np.float32)
        lt, wt, zt = (np.zeros((4, N), np.float32) for _ in range(3))
        for j, sb in np.ndindex(nb, BT // 64):  # each warp takes 16 of every 64 tokens of a block
            t0 = first + j * BT + 64 * sb
            inner = first + j * BT >= lo_max and first + (j + 1) * BT <= hi_min
            ck, cv = keys(cod[b, h, 0, t0:t0 + 64], D), values(cod[b, h, 1, t0:t0 + 64], D)
            for w in range(4):
                rows = slice(16 * w, 16 * w + 16)
                ks, kz, vs, vz = (par[b, h, i, t0:t0 + 64][rows, None] for i in range(4))
                # integer product, times the score scale s_n / 4 (qoff's place); z in two bf16 parts
                vz = _bf16(vz) + _bf16(vz - _bf16(vz))
                sc = ks * sm_scale * 1.4426950408889634 * ((ck[rows] @ qp[b, h].T) * qoff - kz * qsum)
                if not inner:
                    tok = t0 + np.arange(64)[rows, None]
                    sc = np.where((tok >= rlo) & (tok < rhi), sc, -np.inf)
                if np.any(sc > m[w] + decode.TAU):
                    m_new = np.maximum(m[w], sc.max(0))
                    alpha = np.exp2(m[w] - m_new)
                    lt[w], wt[w], zt[w], acc[w] = lt[w] * alpha, wt[w] * alpha, zt[w] * alpha, acc[w] * alpha
                    m[w] = m_new
                p = np.exp2(sc - m[w])
                wv = (p * vs).astype(jnp.bfloat16).astype(np.float32)
                lt[w], wt[w], zt[w] = lt[w] + p.sum(0), wt[w] + wv.sum(0), zt[w] + (wv * vz).sum(0)
                acc[w] += cv[:, rows] @ wv
        big = m.max(0)
        a = np.exp2(m - big)  # [4, N]
        raw[b, h, sp] = (acc * a[:, None]).sum(0)
        stats[b, h, sp] = [big, (lt * a).sum(0), (wt * a).sum(0), (zt * a).sum(0)]
    # warp_merge's thread d writes head dimension d: its warp_value_slots row, as the [N, D] tile finish takes
    raw = np.swapaxes(raw[..., decode.warp_value_slot(np.arange(D), D), :], -1, -2)
    return im.finish(jnp.asarray(raw), jnp.asarray(stats), M, decode_layout=True)


def _bf16(x):
    return np.asarray(x, np.float32).astype(jnp.bfloat16).astype(np.float32)


def _model_decode_values(tile, D):
    """What the decode body's ldmatrix.trans and VALUE_SPLIT unpack leave in C_V^T [D, 64] (rows as
    decode.value_slots): warp w, thread (g, c), matrix (kh, h) -> 16-bit column g + 8 h of tokens t, t + 1
    (t = 16 w + 8 kh + 2 c), split per VALUE_SPLIT."""
    u16 = np.ascontiguousarray(tile).view("<u2").astype(np.uint32)  # [64, D/8]
    out = np.zeros((D, 64), np.float32)
    for w, g, c, kh, h in np.ndindex(4, 8, 4, 2, D // 64):
        t = 16 * w + 8 * kh + 2 * c
        x = u16[t, g + 8 * h] | (u16[t + 1, g + 8 * h] << 16)
        for shift, mask, e, i, _ in decode.VALUE_SPLIT:
            mt, hr = (4 * e + i, h) if D == 128 else (i, e)
            r = 16 * mt + 8 * hr + g
            out[r, t], out[r, t + 1] = _bf16_lanes(((x >> shift) & (mask * 0x10001)) | 0x43004300)
    return out


def _model_imma_keys(tile, D):
    """What the decode body's key unpack leaves in the u8 A operand [BT, D] (decode.imma_slots): thread column
    c's words shifted and masked per plane, bytes b -> slot 32 kc + 16 hf + 4 c + b."""
    BT = tile.shape[0]
    out = np.zeros((BT, D), np.float32)
    for c in range(4):
        words = np.ascontiguousarray(tile[:, c * (D // 16):(c + 1) * (D // 16)]).view("<u4")  # [BT, D/64]
        for u, i in np.ndindex(D // 64, 4):
            kc, hf = (i, u) if D == 128 else (i // 2, i % 2)
            sh = decode.IMMA_SHIFT[i]
            masked = ((words[:, u] >> sh) & np.uint32(0x03030303 << (2 * i - sh))).view(np.uint8).reshape(BT, 4)
            out[:, 32 * kc + 16 * hf + 4 * c:32 * kc + 16 * hf + 4 * c + 4] = masked
    return out


def _imma_fixed(qbytes, D):
    """decode.prepare_queries' bytes [B, H, N, 2 D] -> the int16 fixed-point Q [B, H, N, D] in slot order."""
    x = np.asarray(qbytes).reshape(*qbytes.shape[:3], 4, D // 32, 2, 2, 4)  # n, c, kc, digit, hf, b
    fixed = 256 * x[..., 0, :, :].view(np.int8).astype(np.int64) + x[..., 1, :, :]  # n, c, kc, hf, b
    return fixed.transpose(0, 1, 2, 4, 5, 3, 6).reshape(*qbytes.shape[:3], D)


@pytest.mark.parametrize("D", [64, 128])
def test_decode_key_operands(D):
    """The decode body: the u8 key registers hold factor x code in the slots decode.imma_slots says, and its
    digits decode to q * 4 / factor / s_n within half a step (s_n = 4 x the score scale in colv[0])."""
    tile = np.random.default_rng(D + 3).integers(0, 256, (64, D // 4)).astype(np.uint8)
    dims, f = decode.imma_slots(D)
    np.testing.assert_array_equal(_model_imma_keys(tile, D), f * _codes(tile, D)[:, dims])
    assert sorted(dims) == list(range(D))
    q, _, _, lo, hi = _inputs(D, 2, 2, 5, D, 300, jnp.bfloat16)
    qbytes, colv, _ = decode.prepare_queries(q, lo, hi, 300, 2, 64)
    fixed, step = _imma_fixed(qbytes, D), 4 * np.asarray(colv)[:, :, 0, :5, None]  # s_n
    want = np.asarray(q, np.float32)[..., dims] * 4 / f / step
    assert np.abs(fixed[:, :, :5]).max() <= 32767 and np.all(fixed[:, :, 5:] == 0)  # padded rows: zero
    np.testing.assert_allclose(fixed[:, :, :5], want, atol=0.5 + 1e-3)


@pytest.mark.parametrize("D", [64, 128])
def test_decode_value_slots_hold_the_advertised_codes(D):
    """The decode body's value registers (bf16, 128 + f code) as its slot map says, and warp_value_slot its inverse."""
    tile = np.random.default_rng(D + 2).integers(0, 256, (64, D // 4)).astype(np.uint8)
    c = _codes(tile, D)
    vdims, vf = decode.value_slots(D)
    np.testing.assert_array_equal(_model_decode_values(tile, D), 128 + vf[:, None] * c[:, vdims].T)
    assert sorted(vdims) == list(range(D))
    assert max(vf) * 3 < 128  # exact: every value has an ulp of 1
    np.testing.assert_array_equal(vdims[decode.warp_value_slot(np.arange(D), D)], np.arange(D))  # its inverse


def _check_partials(partials, args):
    """A model's split partials, merged, against the reference: same live rows, out within 1%, lse close."""
    out, lse = jax.jit(common.merge_lse, static_argnames="axis")(*partials, axis=2)
    ref_out, ref_lse = jax.jit(reference.int2_attention_reference)(*args)
    live = np.isfinite(np.asarray(ref_lse))
    np.testing.assert_array_equal(np.isfinite(np.asarray(lse)), live)
    assert _rel(out, ref_out) <= 1e-2
    np.testing.assert_allclose(np.asarray(lse)[live], np.asarray(ref_lse)[live], atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("B,H,M,D,T,sdt,splits,BT", [(2, 1, 4, 128, 300, jnp.bfloat16, 2, 64),
                                                     (1, 1, 20, 64, 150, jnp.float32, 3, 128),
                                                     (1, 1, 4, 128, 700, jnp.bfloat16, 1, 128)])
def test_decode_model_matches_reference(B, H, M, D, T, sdt, splits, BT):
    """The decode body's algebra: lazy max, mask-free interior blocks, the Q digits, warp merge, the value zeros
    in bf16 parts."""
    args = _inputs(B + M + D + T + 1, B, H, M, D, T, sdt, empty_rows=B > 1)
    if T == 700:  # one row's range ends early: interior and boundary blocks in one split
        args = (*args[:3], jnp.zeros_like(args[3]), jnp.asarray([[700, 700, 300, 700]], jnp.int32))
    _check_partials(_model_decode(*args, splits, BT), args)


# (B, H, M, D, T, scale dtype, splits, tokens per block)
MODEL_CASES = [(2, 1, 4, 128, 200, jnp.bfloat16, 2, 64), (1, 1, 20, 64, 150, jnp.float32, 3, 128)]


@pytest.mark.parametrize("B,H,M,D,T,sdt,splits,BT", [*MODEL_CASES, (1, 2, 20, 128, 1500, jnp.bfloat16, 2, 64)])
def test_kernel_model_matches_reference(B, H, M, D, T, sdt, splits, BT):
    """The verification body's algebra (offset 128, plane factors, folded scale/zero, slot order, split schedule)."""
    args = _inputs(B + M + D + T, B, H, M, D, T, sdt)
    _check_partials(_model(*args, splits, BT), args)


def test_schedule_covers_the_union_of_ranges_once():
    lo = jnp.asarray([[5, 100, 7], [0, 0, 0]], jnp.int32)
    hi = jnp.asarray([[300, 120, 7], [0, 0, 0]], jnp.int32)  # row 1: all empty
    sched = np.asarray(prepare.schedule(lo, hi, 400, 3, 64))
    blocks = [set(range(f, f + 64 * n, 64)) for f, n in sched[0]]
    assert set().union(*blocks) == set(range(0, 300, 64)) and sum(map(len, blocks)) == 5
    assert sched[1, :, 1].sum() == 0


@pytest.mark.parametrize("B", [1, 4, 8, 16, 64, 128])
def test_default_splits_round_down_to_one_wave_where_heads_allow(B):
    """Rounded down, the grid stays within the target CTAs unless the heads alone pass it; rounded up, it
    reaches the target. Each split keeps at least 4 blocks."""
    H, T, BT, target = 8, 32768, 64, 528
    down, up = (verify.verify_splits(B, H, T, BT, target, round_down=r) for r in (True, False))
    assert B * H * down <= max(target, B * H) and B * H * up >= min(target, B * H * (T // (4 * BT)))
    assert down <= up and min(down, up) >= 1 and T // BT // up >= 4


@pytest.mark.parametrize("B, T", [(1, 8192), (1, 131072), (1, 1 << 20), (4, 1 << 20), (8, 32768), (64, 32768),
                                  (140, 32768), (50, 32768), (1, 1024)])
def test_decode_splits_fill_whole_waves(B, T):
    """Decode's grid: k waves of an H200's 396 CTAs filled to at least 90%, k the fewest that leave splits of
    at most DECODE_CTA_TOKENS tokens; no split under DECODE_MIN_BLOCKS blocks (that cap may leave a wave
    part-filled)."""
    H, BT, wave = 8, DecodeConfig().block_t, 396
    ns = decode.decode_splits(B, H, T, BT, wave)
    most = T // (decode.DECODE_MIN_BLOCKS * BT)
    k = -(-B * H * ns // wave)  # waves the grid takes
    assert 1 <= ns <= max(1, most)
    if ns < most:
        assert B * H * ns >= 0.9 * k * wave and T / ns <= decode.DECODE_CTA_TOKENS
        fewer = [(j, j * wave // (B * H)) for j in range(1, k)]  # no fewer waves would do
        assert all(s == 0 or T / s > decode.DECODE_CTA_TOKENS or B * H * s < 0.9 * j * wave for j, s in fewer)
    measured = {(1, 1 << 20): 99, (1, 131072): 49, (1, 32768): 32, (8, 32768): 6}  # docs/kernels.md
    assert all(decode.decode_splits(b, 8, t, BT, wave) == s for (b, t), s in measured.items())
    assert decode.decode_wave() == (396 if jax.default_backend() != "gpu" else 3 * jax.devices()[0].core_count)


@pytest.mark.skipif(im.plgpu is None, reason="needs jax's Mosaic GPU")
def test_lowered_kernel_does_not_depend_on_what_the_process_lowered_before():
    """The kernel module is embedded in the program, so in its persistent compile-cache key. jax 0.11
    names each kernel "<kernel>_<n>", n counting the kernels lowered so far in the process: the CLI's
    second run missed the cache because its first had lowered lookahead's timing programs first
    (issue 14; mosaic_keys). Lowered for CUDA here, on any host, with JAX patched as a compile cache patches it."""
    jax_patch.install()

    def lowered(T):
        shapes = [((1, 2, 8, 128), jnp.bfloat16), ((1, 2, 2, T, 32), jnp.uint8), ((1, 2, 4, T, 1), jnp.bfloat16),
                  ((1, 8), jnp.int32), ((1, 8), jnp.int32)]
        f = jax.jit(lambda *a: im.int2_attention_mosaic(*a, merge=False))
        return f.trace(*[jax.ShapeDtypeStruct(*s) for s in shapes]).lower(lowering_platforms=("cuda",)).as_text()

    first = lowered(256)
    lowered(512)  # another kernel in between
    assert lowered(256) == first


def _kernel_program(T):
    """A jitted program around the kernel, and its arguments' shapes (T tokens of history)."""
    shapes = [((1, 2, 8, 128), jnp.bfloat16), ((1, 2, 2, T, 32), jnp.uint8), ((1, 2, 4, T, 1), jnp.bfloat16),
              ((1, 8), jnp.int32), ((1, 8), jnp.int32)]
    return jax.jit(lambda *a: im.int2_attention_mosaic(*a, merge=False)), [jax.ShapeDtypeStruct(*s) for s in shapes]


@pytest.mark.skipif(im.plgpu is None, reason="needs jax's Mosaic GPU")
def test_lowering_notes_each_kernel_for_prime_once():
    """Lowering a program notes its kernel; the kernel alone in a program (what mosaic_keys.prime compiles
    ahead of the program) has the same kernel hash, so jaxlib finds it compiled. Lowered again after prime,
    the kernel is not noted again; off a GPU prime compiles nothing and drops the notes."""
    jax_patch.install()  # as compile_cache.use_compile_cache does
    f, shapes = _kernel_program(264)
    mosaic_keys._lowered.clear()
    text = f.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    [(digest, noted)] = mosaic_keys._lowered.items()
    alone = mosaic_keys.kernel_program(*noted, platforms=("cuda",)).as_text()
    kernel_hash = lambda text: re.findall(r'kernel_hash = "([^"]*)"', text)
    assert len(kernel_hash(text)) == 1 and kernel_hash(alone) == kernel_hash(text)
    mosaic_keys.prime()
    assert not mosaic_keys._lowered and digest in mosaic_keys._primed
    f.trace(*shapes).lower(lowering_platforms=("cuda",))
    assert not mosaic_keys._lowered


@pytest.mark.gpu
@pytest.mark.skipif(not im.available(), reason="needs a Hopper GPU (wgmma) and Mosaic GPU")
def test_primed_kernel_is_not_compiled_again_with_its_program(tmp_path):
    """jaxlib compiles a Mosaic GPU kernel inside its program's XLA compile (a host event "Compile"), unless
    mosaic_keys.prime compiled it before. Both seen in a profile: a program whose kernel was not primed
    (prime's notes dropped), and one whose kernel was (T drawn at random: kernels new to the process)."""
    from jax.profiler import ProfileData

    jax_patch.install()  # as compile_cache.use_compile_cache does: kernels are noted for prime only then

    def compiles(T, primed):
        f, shapes = _kernel_program(T)
        lowered = f.trace(*shapes).lower()
        if primed:
            mosaic_keys.prime()
        else:
            mosaic_keys._lowered.clear()
        with jax.profiler.trace(str(tmp_path / f"{T}")):
            lowered.compile()
        [path] = (tmp_path / f"{T}").rglob("*.xplane.pb")
        return sum(ev.name == "Compile" for plane in ProfileData.from_file(str(path)).planes
                   if plane.name.startswith("/host") for line in plane.lines for ev in line.events)

    assert compiles(4200 + np.random.randint(1000), primed=False) == 1
    assert compiles(5200 + np.random.randint(1000), primed=True) == 0


@pytest.mark.skipif(im.plgpu is None, reason="needs jax's Mosaic GPU")
@pytest.mark.parametrize("M,D,sdt,config", [(8, 128, jnp.bfloat16, DecodeConfig()),
                                            (20, 64, jnp.float32, DecodeConfig(block_t=64)),
                                            (4, 64, jnp.float32, DecodeConfig(block_t=64, stages=2)),
                                            (8, 128, jnp.bfloat16, VerifyConfig(block_t=128)),
                                            (20, 64, jnp.float32, VerifyConfig()),
                                            (20, 128, jnp.bfloat16, VerifyConfig()),
                                            (40, 64, jnp.float32, VerifyConfig(block_t=128))],
                         ids=str)
def test_bodies_lower_for_cuda(M, D, sdt, config):
    """Both bodies' inline code, the decode body's mbarrier release and the verification body's edge mask build
    (register maps, tiles of sums, both scale dtypes): lowered for CUDA on any host, which runs every
    inline_mgpu body (no PTX: that needs the GPU toolchain)."""
    shapes = [((1, 2, M, D), jnp.bfloat16), ((1, 2, 2, 300, D // 4), jnp.uint8), ((1, 2, 4, 300, 1), sdt),
              ((1, M), jnp.int32), ((1, M), jnp.int32)]
    f = jax.jit(lambda *a: im.int2_attention_mosaic(*a, merge=False, config=config))
    assert "mosaic_gpu" in f.trace(*[jax.ShapeDtypeStruct(*s) for s in shapes]).lower(
        lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("make", [lambda: DecodeConfig(block_t=32), lambda: VerifyConfig(stages=0),
                                  lambda: DecodeConfig(num_splits=0)])
def test_configs_are_checked_once_when_made(make):
    with pytest.raises(ValueError):
        make()


# --- compiled kernel (Hopper) -----------------------------------------------------------------------

GPU_CASES = [  # (B, H, M, D, T, scale dtype, config): partial blocks, empty ranges, M = 4/8/20, D = 64/128, both
    # block sizes, both bodies, each body also at the other's row counts; None: the entry's choice
    (2, 8, 4, 128, 5000, jnp.bfloat16, None), (2, 8, 8, 128, 4099, jnp.float32, DecodeConfig(num_splits=4)),
    (2, 4, 20, 128, 3001, jnp.bfloat16, VerifyConfig(num_splits=3)),
    (3, 2, 4, 64, 777, jnp.float32, DecodeConfig(num_splits=2)),
    (2, 2, 20, 64, 2048, jnp.bfloat16, VerifyConfig(block_t=128)),
    (1, 8, 8, 64, 100, jnp.bfloat16, DecodeConfig(num_splits=1)),
    (1, 2, 4, 128, 40, jnp.float32, DecodeConfig(block_t=128)),
    (2, 4, 20, 128, 1500, jnp.bfloat16, VerifyConfig(block_t=128, stages=2, num_splits=2)),
    (2, 4, 4, 128, 3001, jnp.bfloat16, DecodeConfig(block_t=64, stages=2, num_splits=3)),
    # the verification body where the entry picks the decode one
    (2, 8, 4, 128, 5000, jnp.bfloat16, VerifyConfig()), (2, 2, 20, 64, 777, jnp.float32, VerifyConfig(num_splits=2)),
    (1, 8, 4, 128, 70000, jnp.bfloat16, None),  # many blocks per split: lazy rescales, interior blocks
    # the decode body: D 64/128, M 4/8/20, bf16/f32 scales, partial blocks, both block sizes
    (3, 2, 8, 64, 777, jnp.float32, DecodeConfig(block_t=64, num_splits=2)),
    (2, 4, 20, 128, 1500, jnp.float32, DecodeConfig(num_splits=2)),
    (2, 4, 20, 64, 1500, jnp.float32, DecodeConfig(block_t=64, num_splits=2)),
    (2, 4, 8, 128, 3001, jnp.float32, DecodeConfig(stages=2, num_splits=3)),  # the ring's release at 2 stages
    (1, 8, 8, 128, 70000, jnp.bfloat16, VerifyConfig()),  # many blocks per split, D 128
]


def _case_id(case):
    """B-H-M-D-T, scale dtype, and the config."""
    B, H, M, D, T, sdt, config = case
    return "-".join([f"{B}x{H}x{M}x{D}x{T}", jnp.dtype(sdt).name, str(config)])


@pytest.mark.gpu
@pytest.mark.skipif(not im.available(), reason="needs a Hopper GPU (wgmma) and Mosaic GPU")
@pytest.mark.parametrize("B,H,M,D,T,sdt,config", GPU_CASES, ids=[_case_id(c) for c in GPU_CASES])
def test_compiled_kernel_matches_reference(B, H, M, D, T, sdt, config):
    args = _inputs(B * 7 + M + D + T, B, H, M, D, T, sdt)
    ref_out, ref_lse = (np.asarray(x) for x in reference.int2_attention_reference(*args))
    out, lse = (np.asarray(x) for x in im.int2_attention_mosaic(*args, config=config))
    empty = np.broadcast_to(np.asarray(args[4] <= args[3])[:, None], lse.shape)
    assert np.all(np.isfinite(out))
    assert np.all(lse[empty] == -np.inf) and np.all(out[empty] == 0)
    live = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isfinite(lse), live)
    assert _rel(out, ref_out) <= 1e-2
    np.testing.assert_allclose(lse[live], ref_lse[live], atol=2e-2, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not im.available(), reason="needs a Hopper GPU (wgmma) and Mosaic GPU")
@pytest.mark.parametrize("M,config", [(8, DecodeConfig(num_splits=3)), (4, DecodeConfig(num_splits=3)),
                                      (20, VerifyConfig(num_splits=3))], ids=str)
def test_compiled_interior_and_edge_blocks(M, config):
    """Every row's range covers [0, 3000) and one row's ends there: mask-free interior blocks and masked edge
    blocks (and a partial last block) in the same splits, against the reference."""
    q, codes, qparams, _, _ = _inputs(11 + M, 2, 4, M, 128, 5000, jnp.bfloat16)
    lo = jnp.zeros((2, M), jnp.int32)
    hi = jnp.full((2, M), 4999, jnp.int32).at[:, 1].set(3000)
    args = (q, codes, qparams, lo, hi)
    ref_out, ref_lse = (np.asarray(x) for x in reference.int2_attention_reference(*args))
    out, lse = (np.asarray(x) for x in im.int2_attention_mosaic(*args, config=config))
    assert _rel(out, ref_out) <= 1e-2
    np.testing.assert_allclose(lse, ref_lse, atol=2e-2, rtol=1e-3)


# (K, GQA group, history length): K = 1..8 at group 4 over every history-length class (within one block, a few
# partial blocks, many blocks per split with lazy rescales), and groups 1, 2 and 8
VERIFY_CASES = [(K, 4, T) for K in range(1, 9) for T in (40, 3001, 70000)] + [
    (4, 1, 3001), (3, 2, 20000), (7, 8, 3001), (8, 8, 70000), (2, 8, 40)]


@pytest.mark.gpu
@pytest.mark.skipif(not im.available(), reason="needs a Hopper GPU (wgmma) and Mosaic GPU")
@pytest.mark.parametrize("K,g,T", VERIFY_CASES, ids=[f"K{K}-g{g}-T{T}" for K, g, T in VERIFY_CASES])
def test_compiled_verification_matches_reference(K, g, T):
    """K + 1 positions x a GQA group of g as the split path gives them (rows i g + j; position i's history ends
    one token later than position i - 1's), through the body the entry picks, against the reference."""
    M = (K + 1) * g
    q, codes, qparams, _, _ = _inputs(K * 100 + g * 10 + T, 2, 4, M, 128, T, jnp.bfloat16)
    ends = np.repeat(T - K + np.arange(K + 1), g)  # [M]
    lo = jnp.full((2, M), min(4, T // 8), jnp.int32)
    hi = jnp.asarray(np.stack([ends, ends - T // 3]), jnp.int32)  # batch row 1: a shorter history
    args = (q, codes, qparams, lo, hi)
    ref_out, ref_lse = (np.asarray(x) for x in reference.int2_attention_reference(*args))
    out, lse = (np.asarray(x) for x in im.int2_attention_mosaic(*args))
    assert np.all(np.isfinite(out)) and _rel(out, ref_out) <= 1e-2
    np.testing.assert_allclose(lse, ref_lse, atol=2e-2, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not im.available(), reason="needs a Hopper GPU (wgmma) and Mosaic GPU")
def test_compiled_unmerged_partials_merge_to_the_merged_result():
    args = _inputs(5, 2, 2, 20, 128, 2000, jnp.float32)
    out, lse = im.int2_attention_mosaic(*args, config=VerifyConfig(num_splits=3))
    parts = im.int2_attention_mosaic(*args, config=VerifyConfig(num_splits=3), merge=False)
    assert parts[0].shape == (2, 2, 3, 20, 128) and parts[1].shape == (2, 2, 3, 20)
    merged, merged_lse = common.merge_lse(*parts, axis=2)
    np.testing.assert_allclose(np.asarray(merged), np.asarray(out), rtol=1e-6, atol=1e-6)


# --- the split attention path's kernel choice --------------------------------------------------------


def _split_case():
    """One layer with a committed INT2 history (sink 4, recent 8, 40 tokens) and a 5-row chunk."""
    from jspec.cache import kvcache
    from jspec.config import KVConfig, ModelConfig

    cfg = ModelConfig(model_type="llama", vocab_size=32, hidden_size=256, intermediate_size=64, num_layers=1,
                      num_heads=8, num_kv_heads=2, head_dim=64, max_position=256)
    kv = KVConfig(sink=4, recent=8)
    rng = np.random.default_rng(3)
    rows = lambda n, H, dt=jnp.float32: jnp.asarray(rng.standard_normal((1, n, H, 64)), dt)
    k, v = rows(40, 2, jnp.bfloat16), rows(40, 2, jnp.bfloat16)

    @jax.jit  # one compile instead of one per eager op
    def cache(k, v):
        c = kvcache.init_cache(cfg, kv, batch=1, capacity=96, lookahead=4)
        c = kvcache.commit(c, k[None], v[None], jnp.asarray([40], jnp.int32))
        return c.layer(0), c.length

    return (rows(5, 8), rows(5, 2), rows(5, 2), *cache(k, v)), kv


@pytest.mark.skipif(im.available(), reason="checks the error where the Mosaic kernel cannot run")
def test_mosaic_kernel_choice_needs_wgmma():
    from jspec.attention import split as attention_split

    args, kv = _split_case()
    with pytest.raises(ValueError, match="wgmma"):  # raised while tracing: nothing is compiled
        jax.eval_shape(lambda *a: attention_split.attend_split(*a, kv=kv, kernel="mosaic"), *args)


@pytest.mark.gpu
@pytest.mark.skipif(not im.available(), reason="needs a Hopper GPU (wgmma) and Mosaic GPU")
@pytest.mark.parametrize("noisy", [False, True])  # Layer.key_noise: the splits' lse shifted
def test_split_path_with_mosaic_kernel_matches_reference(noisy):
    from jspec.attention import rule as attention, split as attention_split

    args, kv = _split_case()
    key_noise = jnp.asarray([0.5, 2.0]) if noisy else None
    ref = attention.attend_reference(*args, kv, key_noise)
    out = jax.jit(attention_split.attend_split, static_argnames=("kv", "kernel"))(*args, kv=kv, kernel="mosaic",
                                                                                 key_noise=key_noise)
    assert _rel(out, ref) <= 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not im.available(), reason="needs a Hopper GPU (wgmma) and Mosaic GPU")
@pytest.mark.parametrize("n", [1, 5])  # decode, K = 4 verification
@pytest.mark.parametrize("noisy", [False, True])  # Layer.key_noise set: the INT2 scores' bias taken out
def test_decode_steps_with_the_kernels_match_the_reference_forward(n, noisy):
    """A tiny model's cached steps, float32, on one GPU, each from the same cache (the reference's, so errors
    do not compound): the logits with attn_impl="pallas" (the Mosaic kernel, window_merge finishing its raw
    partials) against the reference attention's, and the cache the fused commit writes (one kernel for both
    layers) against the jnp commit's from the same rows. Not compared: whole runs, where the commits' codes
    differing at rounding boundaries (0.4-0.5% of the prefill's) carry on to logits 0.10-0.17 apart (H200,
    docs/kernels.md). The logit bound is measured: on the H200 the two attentions part by up to
    4.3e-2 at a prefill and 7e-3 at the steps (docs/kernels.md: likely TF32 in
    XLA's f32 GEMMs and the kernels' dots)."""
    from jspec.cache import kvcache
    from jspec.config import KVConfig, ModelConfig, Options
    from jspec.model import decoder as model

    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=256, intermediate_size=128, num_layers=2,
                      num_heads=8, num_kv_heads=2, head_dim=64, max_position=1024)
    kv = KVConfig("int2", sink=4, recent=16)
    params = model.init_params(cfg, jax.random.key(0), std=0.1)
    if noisy:
        params = params.replace(layers=params.layers.replace(key_noise=jnp.asarray([[0.5, 2.0], [1.0, 0.2]])))
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, 300 + 4 * n)), jnp.int32)
    step = {impl: jax.jit(lambda c, t, impl=impl: model.forward(params, cfg, t, c, attn_impl=impl))
            for impl in ("reference", "pallas")}

    def commit(cache, k, v, count, fused):
        return kvcache.commit(cache, k, v, count, Options(fused_commit=fused))

    cache = kvcache.init_cache(cfg, kv, 2, 400, jnp.float32)
    chunks = [(tokens[:, :300], jnp.full((2,), 300))] + [  # row 1 commits one of its n rows, as after a rejection
        (tokens[:, 300 + n * i: 300 + n * (i + 1)], jnp.asarray([n, 1])) for i in range(4)]
    for chunk, count in chunks:
        want, (k, v) = step["reference"](cache, chunk)
        got, _ = step["pallas"](cache, chunk)
        assert _rel(got, want) <= 0.06
        fused, cache = commit(cache, k, v, count, True), commit(cache, k, v, count, False)
        for f, w in zip(layers_of(fused), layers_of(cache)):
            np.testing.assert_array_equal(np.asarray(f.k), np.asarray(w.k))
            np.testing.assert_array_equal(np.asarray(f.v), np.asarray(w.v))
            np.testing.assert_allclose(np.asarray(f.qparams, np.float32), np.asarray(w.qparams, np.float32),
                                       rtol=2.0**-7)
            assert np.mean(np.asarray(f.codes) != np.asarray(w.codes)) < 0.01


def test_groups_smaller_than_a_row_leave_raw_partials_to_the_reference():
    """qparams with several groups per row go to the reference in the wrapper: merge="raw" gives its one
    normalised partial per row (as merge=False), which window_merge takes; merge=True the merged result."""
    q, codes, qparams, lo, hi = _inputs(0, 1, 2, 4, 64, 96, jnp.float32)
    grouped = jnp.concatenate([qparams, qparams], -1)  # [B, H, 4, T, 2]: two groups of 32
    fn = jax.jit(im.int2_attention_mosaic, static_argnames="merge")
    out, lse = fn(q, codes, grouped, lo, hi, merge="raw")
    assert out.shape == (1, 2, 1, 4, 64) and lse.shape == (1, 2, 1, 4)
    merged = fn(q, codes, grouped, lo, hi, merge=True)
    np.testing.assert_array_equal(np.asarray(out[:, :, 0]), np.asarray(merged[0]))
