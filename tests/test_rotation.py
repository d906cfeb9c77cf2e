"""OSCAR rotations and calibration (jspec/rotation.py, jspec/calibrate.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.config import ConfigError, ModelConfig
from jspec.model import rotation
from jspec.model.decoder import forward, init_params
from jspec.model import calibrate as cal

TINY = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16)
TINY_QWEN2 = dataclasses.replace(TINY, model_type="qwen2", qkv_bias=True)


def _random_orthogonal(rng, D):
    Q, R = np.linalg.qr(rng.standard_normal((D, D)))
    return Q * np.sign(np.diag(R))


def _random_cov(rng, D):
    A = rng.standard_normal((D, D))
    return A @ A.T / D


def _assert_orthogonal(R, tol=1e-5):
    R = np.asarray(R, np.float64)
    eye = np.broadcast_to(np.eye(R.shape[-1]), R.shape)
    np.testing.assert_allclose(R @ np.swapaxes(R, -1, -2), eye, atol=tol)


def _tokens(seed, shape=(2, 12)):
    return np.random.default_rng(seed).integers(0, TINY.vocab_size, shape).astype(np.int32)


def test_hadamard():
    D = 16
    H = rotation.hadamard(D)
    i, j = np.meshgrid(np.arange(D), np.arange(D), indexing="ij")
    popcount = np.vectorize(lambda a: bin(a).count("1"))
    np.testing.assert_allclose(H, (-1.0) ** popcount(i & j) / np.sqrt(D))
    np.testing.assert_allclose(H @ H, np.eye(D), atol=1e-12)  # symmetric and its own inverse


def test_bit_reversal():
    np.testing.assert_array_equal(rotation.bit_reversal(8), [0, 4, 2, 6, 1, 5, 3, 7])
    assert list(rotation.bit_reversal(1)) == [0]


@pytest.mark.parametrize("D", [128, 16])
def test_permutation_puts_top_eigen_directions_apart(D):
    lam = np.random.default_rng(0).permutation(D).astype(np.float64)  # distinct, shuffled
    P = rotation.permutation_br(lam)
    order = np.argsort(-lam)  # eigen-directions by descending eigenvalue
    dest = [int(np.argmax(np.eye(D)[order[r]] @ P)) for r in range(5)]  # where the r-th largest lands
    assert dest == [0, D // 2, D // 4, 3 * D // 4, D // 8]
    np.testing.assert_array_equal(P.sum(0), 1)
    np.testing.assert_array_equal(P.sum(1), 1)


def test_orthogonality_all_modes():
    rng = np.random.default_rng(1)
    cq = np.stack([[_random_cov(rng, 16) for _ in range(2)] for _ in range(2)])  # [L, Hkv, D, D]
    rk, rv = rotation.rotations_from_covariances(cq, cq[::-1], per_head=True)
    for mode in ("none", "hadamard"):
        k, v = rotation.data_free_rotations(TINY, mode)
        rk, rv = rk + k, rv + v
    for R in rk + rv:
        assert R.shape == (2, 16, 16) and R.dtype == np.float32
        _assert_orthogonal(R)


def test_qk_invariance():
    rng = np.random.default_rng(2)
    R = rotation.oscar_rotation(_random_cov(rng, 32))
    q, k = rng.standard_normal((5, 32)), rng.standard_normal((7, 32))
    np.testing.assert_allclose((q @ R) @ (k @ R).T, q @ k.T, atol=1e-10)


@pytest.mark.parametrize("order", rotation.ORDERS)
def test_oscar_rotation_factors(order):
    # R = U . H . P_br: undoing P and H gives back the eigenbasis, which diagonalizes C, in `order`
    rng = np.random.default_rng(3)
    C = _random_cov(rng, 16)
    lam, _ = rotation.eigen(C)
    lam = lam[::-1] if order == "desc" else lam
    R = rotation.oscar_rotation(C, order)
    U = R @ rotation.permutation_br(lam).T @ rotation.hadamard(16)
    np.testing.assert_allclose(U.T @ C @ U, np.diag(lam), atol=1e-10)


@pytest.mark.parametrize("order", rotation.ORDERS)
def test_constant_row_takes_the_ordered_first_eigen_direction(order):
    # x R is constant over the coordinates exactly for x along R 1: U's first column (H's row 0 is
    # 1/sqrt(D), P_br leaves a constant vector constant); desc: the top eigen-direction, asc: the bottom
    rng = np.random.default_rng(12)
    C = _random_cov(rng, 16)
    lam, U = rotation.eigen(C)
    R = rotation.oscar_rotation(C, order)
    free = R @ np.ones(16) / 4.0
    want = U[:, -1] if order == "desc" else U[:, 0]
    np.testing.assert_allclose(np.abs(free @ want), 1.0, atol=1e-10)
    np.testing.assert_allclose(np.ptp(want @ R), 0.0, atol=1e-10)
    with pytest.raises(ConfigError, match="eigenvector order"):
        rotation.oscar_rotation(C, "random")


def test_desc_order_codes_the_dominant_direction_in_the_zero_point():
    # rows with one dominant direction (a large mean plus spread along it) and a small isotropic
    # rest: under desc the dominant part is a per-row offset the asymmetric INT2 code absorbs, so the
    # error is the rest's; under asc it widens every row's range (here the error triples)
    from jspec.int2 import quant

    rng = np.random.default_rng(13)
    D, N = 32, 2000
    u = _random_orthogonal(rng, D)[:, 0]
    x = (3.0 + rng.standard_normal((N, 1))) * u + 0.3 * rng.standard_normal((N, D))
    C = x.T @ x / N
    err = {}
    for order in rotation.ORDERS:
        R = rotation.oscar_rotation(C, order)
        xr = jnp.asarray(x @ R, jnp.float32)
        err[order] = float(jnp.mean((quant.fake_quantize(xr, D) - xr) ** 2))
    assert err["desc"] < err["asc"] / 2, err


def _planted(rng, D, lam):
    U = _random_orthogonal(rng, D)
    return U, U * np.sqrt(lam)  # samples z @ (U sqrt(lam))^T have covariance U diag(lam) U^T


def _assert_same_basis(U, U_planted, tol=0.98):
    M = np.abs(U.T @ U_planted)  # ~ a permutation matrix
    assert np.all(M.max(0) > tol) and np.all(M.max(1) > tol)
    np.testing.assert_array_equal(np.sort(M.argmax(0)), np.arange(len(M)))


def test_calibration_recovers_planted_eigenbases():
    rng = np.random.default_rng(4)
    D, Hkv, g, N = 16, 2, 2, 8000
    lam = 2.0 ** -np.arange(D) * 10  # well separated spectrum
    planted_q = [_planted(rng, D, lam) for _ in range(Hkv)]
    planted_v = [_planted(rng, D, lam) for _ in range(Hkv)]
    # q [B, n, Hq, D]: query heads 2h, 2h+1 share KV head h's covariance
    q = np.stack([rng.standard_normal((N, D)) @ planted_q[i // g][1].T for i in range(Hkv * g)], 1)
    v = np.stack([rng.standard_normal((N, D)) @ planted_v[h][1].T for h in range(Hkv)], 1)
    k = rng.standard_normal((N, Hkv, D))  # independent of v: the score weights leave Cov(v) in place
    split = lambda a: [a[: N // 2].reshape(2, N // 4, *a.shape[1:]), a[N // 2 :].reshape(2, N // 4, *a.shape[1:])]
    cq, cs = cal.layer_targets(split(q), split(k), split(v), Hkv)
    for h in range(Hkv):
        _assert_same_basis(rotation.eigen(cq[h])[1], planted_q[h][0])
        _assert_same_basis(rotation.eigen(cs[h])[1], planted_v[h][0])


def test_score_weighted_moment_matches_definition():
    rng = np.random.default_rng(5)
    N, Hkv, D, g = 40, 2, 8, 3
    q = rng.standard_normal((1, N, Hkv * g, D))
    k, v = rng.standard_normal((1, N, Hkv, D)), rng.standard_normal((1, N, Hkv, D))
    cq, cs = cal.layer_targets([q], [k], [v], Hkv)
    for h in range(Hkv):
        Qh = q[0, :, h * g : (h + 1) * g].reshape(-1, D)
        want_q = Qh.T @ Qh / (N * g)
        e = np.array([k[0, t, h] @ want_q @ k[0, t, h] for t in range(N)])
        want_s = sum(e[t] * np.outer(v[0, t, h], v[0, t, h]) for t in range(N)) / e.sum()
        np.testing.assert_allclose(cq[h], want_q, rtol=1e-10)
        np.testing.assert_allclose(cs[h], want_s, rtol=1e-10)


def test_non_power_of_two_head_dim_raises():
    with pytest.raises(ConfigError, match="power of two"):
        rotation.hadamard(96)
    cfg = dataclasses.replace(TINY, hidden_size=24 * 4, head_dim=24)
    with pytest.raises(ConfigError, match="power of two"):
        rotation.hadamard_rotations(cfg)
    with pytest.raises(ConfigError, match="power of two"):
        cal.calibrate(None, cfg, [], mode="oscar")


def _per_head_rotations(cfg, seed):
    rng = np.random.default_rng(seed)
    make = lambda: [np.stack([_random_orthogonal(rng, cfg.head_dim) for _ in range(cfg.num_kv_heads)])
                    for _ in range(cfg.num_layers)]
    return make(), make()


def _params(cfg, seed):
    return init_params(cfg, jax.random.PRNGKey(seed), std=0.2)


@pytest.mark.parametrize("cfg", [TINY, TINY_QWEN2], ids=["llama", "qwen2-bias"])
def test_apply_rotations_preserves_the_model(cfg):
    params = _params(cfg, 0)
    tokens = jnp.asarray(_tokens(6))
    ref, _ = forward(params, cfg, tokens)
    rot_k, rot_v = _per_head_rotations(cfg, 7)
    rotated = rotation.apply_rotations(params, cfg, rot_k, rot_v)
    assert rotated.layer(0).rot_k.shape == (cfg.num_kv_heads, cfg.head_dim, cfg.head_dim)
    assert rotated.layer(0).rot_k.dtype == jnp.float32
    g = cfg.q_per_kv
    before, after = params.layer(0).wqkv, rotated.layer(0).wqkv
    assert not np.allclose(after[:, :, g + 1], before[:, :, g + 1])  # R_V really is folded into v
    np.testing.assert_array_equal(after[:, :, : g + 1], before[:, :, : g + 1])  # and only into v
    out, (new_k, new_v) = forward(rotated, cfg, tokens)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-4)
    _, (plain_k, plain_v) = forward(params, cfg, tokens)
    # the cache sees rows in the rotated basis: k @ R_K and v @ R_V per KV head
    want_v = jnp.einsum("bnhd,hde->bnhe", plain_v[1], jnp.asarray(rot_v[1], jnp.float32))
    np.testing.assert_allclose(np.asarray(new_v[1]), np.asarray(want_v), atol=1e-5)
    with pytest.raises(ConfigError, match="already rotated"):
        rotation.apply_rotations(rotated, cfg, rot_k, rot_v)


def test_calibrate_end_to_end_and_file_round_trip(tmp_path):
    params = _params(TINY, 1)
    batches = [_tokens(8), _tokens(9)]
    rot_k, rot_v, meta = cal.calibrate(params, TINY, batches, mode="oscar")
    assert meta["calibration_tokens"] == "48" and meta["grouping"] == "per_head" and meta["mode"] == "oscar"
    assert meta["eigen_order"] == "desc"
    for R in rot_k + rot_v:
        assert R.shape == (2, 16, 16)
        _assert_orthogonal(R)
    assert not np.allclose(rot_k[0][0], rot_k[0][1])  # heads get their own rotation

    path = tmp_path / "rot.safetensors"
    rotation.save_rotations(path, rot_k, rot_v, meta)
    k2, v2, meta2 = rotation.load_rotations(path, TINY)
    assert meta2 == {k: str(v) for k, v in meta.items()}
    for a, b in zip(rot_k + rot_v, k2 + v2):
        np.testing.assert_array_equal(a, b)

    tokens = jnp.asarray(_tokens(10))
    ref, _ = forward(params, TINY, tokens)
    out, _ = forward(rotation.apply_rotations(params, TINY, k2, v2), TINY, tokens)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-4)


def test_calibrate_order_is_recorded_and_applied():
    params = _params(TINY, 3)
    batches = [_tokens(14)]
    cq, cs = cal.collect_targets(params, TINY, batches)
    for order in rotation.ORDERS:
        rot_k, rot_v, meta = cal.calibrate(params, TINY, batches, order=order)
        assert meta["eigen_order"] == order
        want_k, want_v = rotation.rotations_from_covariances(cq, cs, True, order)
        for got, want in zip(rot_k + rot_v, want_k + want_v):
            np.testing.assert_allclose(got, want, atol=1e-6)
    assert "eigen_order" not in cal.calibrate(params, TINY, [], mode="hadamard")[2]


def test_calibrate_per_layer_and_data_free_modes():
    params = _params(TINY, 2)
    rot_k, rot_v, meta = cal.calibrate(params, TINY, [_tokens(11)], per_head=False)
    assert meta["grouping"] == "per_layer"
    for R in rot_k + rot_v:
        np.testing.assert_array_equal(R[0], R[1])  # one rotation per layer, replicated over heads
        _assert_orthogonal(R)
    rk, rv, meta = cal.calibrate(params, TINY, [], mode="hadamard")
    assert meta["mode"] == "hadamard" and meta["calibration_tokens"] == "0"
    np.testing.assert_allclose(rk[1][0], rotation.hadamard(16), atol=1e-7)
    with pytest.raises(ConfigError, match="unknown rotation mode"):
        cal.calibrate(params, TINY, [], mode="quarot")


def test_load_rejects_other_models(tmp_path):
    rot_k, rot_v = rotation.hadamard_rotations(TINY)
    path = tmp_path / "rot.safetensors"
    rotation.save_rotations(path, rot_k, rot_v, rotation.make_meta(TINY, "hadamard", True, 0))
    with pytest.raises(ConfigError, match="another model config"):
        rotation.load_rotations(path, dataclasses.replace(TINY, rope_theta=5e5))
    # right hash but a wrong shape (a hand-edited or truncated file)
    rotation.save_rotations(path, rot_k[:1], rot_v[:1], rotation.make_meta(TINY, "hadamard", True, 0))
    with pytest.raises(ConfigError, match="missing or not of shape"):
        rotation.load_rotations(path, TINY)
    with pytest.raises(FileNotFoundError):
        rotation.load_rotations(tmp_path / "nope.safetensors", TINY)


class _ListTokenizer:
    def encode(self, text):
        return [ord(c) % 64 for c in text]


def test_token_windows_and_data_files(tmp_path):
    (tmp_path / "a.txt").write_text("x" * 50)
    (tmp_path / "b.txt").write_text("y" * 30)
    files = cal.data_files(tmp_path, [str(tmp_path / "*.txt")])
    assert [f.name for f in files] == ["a.txt", "b.txt"]
    batches = cal.token_windows(_ListTokenizer(), files, tokens=70, seq_len=16, batch_size=3)
    assert [b.shape for b in batches] == [(3, 16), (1, 16)]  # 70 tokens -> 4 full windows
    with pytest.raises(FileNotFoundError, match="--data"):
        cal.data_files(tmp_path / "model", None)
    with pytest.raises(FileNotFoundError, match="matches no file"):
        cal.data_files(tmp_path, [str(tmp_path / "*.jsonl")])
