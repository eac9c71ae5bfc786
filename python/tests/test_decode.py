"""Decode: one token for many requests, each against its row of a state pool, equals the
recurrence run over the same tokens; in place or not, in every framework."""

import numpy as np
import pytest

import linseq
from conftest import require


def _sequence(rng, B, T, H, HV, K, V):
    f32 = np.float32
    return dict(q=rng.standard_normal((B, T, H, K)).astype(f32),
                k=rng.standard_normal((B, T, H, K)).astype(f32),
                v=rng.standard_normal((B, T, HV, V)).astype(f32),
                g=rng.standard_normal((B, T, HV, K)).astype(f32),
                beta=rng.standard_normal((B, T, HV)).astype(f32))


OPTS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True, lower_bound=-5.0)


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("state_v_first", [False, True])
def test_decode_steps_equal_the_recurrence(framework, state_v_first):
    rng = np.random.default_rng(7)
    B, T, H, HV, K, V, R = 3, 6, 2, 4, 16, 8, 7
    seq = _sequence(rng, B, T, H, HV, K, V)
    A_log = rng.standard_normal(HV).astype(np.float32)
    dt_bias = rng.standard_normal(HV * K).astype(np.float32)
    shape = (HV, V, K) if state_v_first else (HV, K, V)
    h0 = rng.standard_normal((B,) + shape).astype(np.float32)
    want_o, want_h = linseq.fused_recurrent_kda(
        seq["q"], seq["k"], seq["v"], seq["g"], seq["beta"], initial_state=h0,
        output_final_state=True, A_log=A_log, dt_bias=dt_bias, state_v_first=state_v_first,
        **OPTS)
    rows = np.array([5, 0, 3])
    pool = np.full((R,) + shape, 1e30, dtype=np.float32)  # unnamed rows must stay untouched
    pool[rows] = h0
    if framework == "torch":
        torch = require("torch")
        conv = torch.from_numpy
    elif framework == "jax":
        jnp = require("jax.numpy")
        conv = jnp.asarray
    else:
        def conv(x):
            return x
    state = conv(pool)
    outs = []
    for t in range(T):
        step = {n: conv(np.ascontiguousarray(a[:, t])) for n, a in seq.items()}  # [B,...]
        o, state = linseq.kda_decode(step["q"], step["k"], step["v"], step["g"], step["beta"],
                                     state, conv(rows), A_log=conv(A_log),
                                     dt_bias=conv(dt_bias), state_v_first=state_v_first,
                                     inplace=framework != "jax", **OPTS)
        outs.append(np.asarray(o)[:, 0])
    np.testing.assert_allclose(np.stack(outs, 1), want_o, rtol=0, atol=2e-6)
    final = np.asarray(state)
    np.testing.assert_allclose(final[rows], want_h, rtol=0, atol=2e-6)
    untouched = np.setdiff1d(np.arange(R), rows)
    assert np.all(final[untouched] == 1e30)
    if framework == "numpy":
        assert state is pool  # the caller's array, updated in place


def test_decode_without_inplace_leaves_the_pool():
    rng = np.random.default_rng(8)
    seq = _sequence(rng, 2, 1, 1, 1, 8, 4)
    pool = rng.standard_normal((2, 1, 8, 4)).astype(np.float32)
    before = pool.copy()
    _, new_pool = linseq.kda_decode(seq["q"], seq["k"], seq["v"], -np.abs(seq["g"]),
                                    np.abs(seq["beta"]) % 1, pool)
    assert np.array_equal(pool, before) and not np.array_equal(new_pool, before)
