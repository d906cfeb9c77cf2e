"""Smoke test of benchmarks/profile_round.py's readers: the GPU event summary on made-up events (no GPU needed)
and the rounds loop found in a small compiled program."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

_BENCH = str(Path(__file__).resolve().parent.parent / "benchmarks")
sys.path.insert(0, _BENCH)  # profile_round imports head_round and profile_step as the scripts do
try:
    import profile_round as pr
finally:
    sys.path.remove(_BENCH)


def _events(rounds: int):
    """Each round: two kernels (10 + 5 us), a 20 us gap, the predicate's MemcpyD2H (1 us), a 4 us gap."""
    ev, t = [], 0
    for _ in range(rounds):
        for name, dur, gap in (("loop_add_fusion_3", 10_000, 0), ("gemm_7", 5_000, 20_000),
                               ("MemcpyD2H", 1_000, 4_000)):  # ns
            ev.append((name, t, dur, {}))
            t += dur + gap
    return ev


def test_gpu_summary_per_round():
    s = pr.gpu_summary(_events(4), wall=4 * 45e-6, rounds=4, top=5)
    assert s["kernels_per_round"] == 2 and s["copies_per_round"] == {"MemcpyD2H": 1.0}
    assert s["kernel_ms_per_round"] == pytest.approx(0.015)
    assert s["idle_ms_per_round"] == pytest.approx(0.030)
    assert [k["kind"] for k in s["kinds"]] == ["loop_add_fusion", "gemm", "MemcpyD2H"]
    g = s["gaps"]
    assert g["us_per_round"] == pytest.approx((24 * 4 - 4) / 4)  # the last round's trailing gap is after the call
    assert g["largest"][0] == dict(us=20.0, before="gemm_7", after="MemcpyD2H", at_ms=0.015)
    assert g["by_pair"][0]["before"] == "gemm" and g["by_pair"][0]["per_round"] == 1
    assert s["loop_trips"]["d2h_copies"] == 4 and s["loop_trips"]["median_us"] == pytest.approx(40.0)
    assert s["loop_trips"]["median_kernel_us"] == pytest.approx(15.0)


def test_round_hlo_finds_the_rounds_loop():
    def prog(x, n):
        def body(c):
            i, y = c
            y = jax.lax.fori_loop(0, n, lambda _, z: jnp.sin(z) * 2, y)  # a loop inside the round
            return i + 1, y
        return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x))

    hlo = jax.jit(prog).lower(jnp.ones(4), 2).compile().as_text()
    r = pr.round_hlo(hlo)
    assert r["body_counts"]["loops"] == 1 and r["notable_ops"]["while"] == 1
    assert r["whiles_in_program"] == 2
