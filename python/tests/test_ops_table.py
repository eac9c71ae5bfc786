"""linseq.ops.run / decode: any op of the library's table on NumPy arrays from the table
alone (the template EMA op has no other Python front end), checked against an independent
float64 definition and against the ops' own front ends."""
import numpy as np
import pytest

import linseq
from linseq import LinseqError


def ema_reference(x, a, h0=None):
    """docs/semantics.md's EMA in float64: s = a s + (1 - a) x_t, y_t = s."""
    x, a = x.astype(np.float64), a.astype(np.float64)
    s = np.zeros(x.shape[::2]) if h0 is None else h0.astype(np.float64).copy()
    y = np.empty(x.shape)
    for t in range(x.shape[1]):
        s = a * s + (1.0 - a) * x[:, t]
        y[:, t] = s
    return y, s


def ema_inputs(rng, B=3, T=17, D=70):
    return (rng.standard_normal((B, T, D)).astype(np.float32),
            rng.uniform(0, 1, D).astype(np.float32),
            rng.standard_normal((B, D)).astype(np.float32))


def test_ema_forward_matches_float64():
    x, a, h0 = ema_inputs(np.random.default_rng(0))
    y, hT = linseq.ops.run("ema", {"x": x, "a": a, "h0": h0})
    ry, rh = ema_reference(x, a, h0)
    np.testing.assert_allclose(y, ry, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hT, rh, rtol=1e-5, atol=1e-6)
    y0, _ = linseq.ops.run("ema", {"x": x, "a": a})
    np.testing.assert_allclose(y0, ema_reference(x, a)[0], rtol=1e-5, atol=1e-6)


def test_ema_decode_is_the_forward_token_by_token():
    x, a, h0 = ema_inputs(np.random.default_rng(1), B=2, T=6, D=9)
    y, hT = linseq.ops.run("ema", {"x": x, "a": a, "h0": h0})
    pool = np.zeros((4, 9), np.float32)
    rows = np.array([3, 1])
    pool[rows] = h0
    steps = [linseq.ops.decode("ema", {"x": x[:, t:t + 1], "a": a}, pool, state_rows=rows)[0]
             for t in range(6)]
    np.testing.assert_array_equal(np.concatenate(steps, axis=1), y)
    np.testing.assert_array_equal(pool[rows], hT)
    assert not pool[[0, 2]].any()  # rows no request names are untouched


def test_table_path_equals_the_ops_own_front_end():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 11, 16)).astype(np.float32)
    w = rng.standard_normal((16, 4)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    y, state = linseq.ops.run("causal_conv1d", {"x": x, "weight": w, "bias": b},
                              activation="silu")
    own = linseq.ops.conv1d_forward(linseq.ops.Conv1dInputs(x, w, b, activation="silu"))
    np.testing.assert_array_equal(y, own[0])
    np.testing.assert_array_equal(state, own[1])


def test_refusals_name_what_is_wrong():
    x, a, _ = ema_inputs(np.random.default_rng(3), B=1, T=2, D=4)
    with pytest.raises(LinseqError, match=r"a\[2\] = nan"):
        bad = a.copy()
        bad[2] = np.nan
        linseq.ops.run("ema", {"x": x, "a": bad})
    with pytest.raises(ValueError, match="frob"):
        linseq.ops.run("ema", {"x": x, "a": a, "frob": a})
    with pytest.raises(ValueError, match=r"a: expected shape \[D\] = \[4\]"):
        linseq.ops.run("ema", {"x": x, "a": a[:3]})
    with pytest.raises(ValueError, match="no decode step"):
        linseq.ops.decode("kda_gate", {"g_raw": x}, np.zeros((1, 4, 3), np.float32))
    with pytest.raises(ValueError, match="not an op"):
        linseq.ops.run("frob", {})


def test_table_backward_equals_the_ops_own_front_end():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 9, 8)).astype(np.float32)
    w = rng.standard_normal((8, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    d_y = rng.standard_normal((2, 9, 8)).astype(np.float32)
    grads = linseq.ops.backward("causal_conv1d", {"x": x, "weight": w, "bias": b}, {"d_y": d_y},
                                activation="silu")
    own = linseq.ops.conv1d_backward(linseq.ops.Conv1dInputs(x, w, b, activation="silu"), d_y)
    for name in ("dx", "dweight", "dbias"):
        np.testing.assert_array_equal(grads[name], own[name])
    with pytest.raises(ValueError, match="no backward"):
        linseq.ops.backward("ema", {"x": x, "a": np.full(8, 0.5, np.float32)}, {"d_y": d_y})


def test_packed_sequences_equal_the_sequences_alone():
    """cu_seqlens through the table path: the conv over two packed sequences equals each
    sequence on its own (states start at zero per sequence), forward and backward; an op the
    table gives no varlen refuses them."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 13, 6)).astype(np.float32)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    d_y = rng.standard_normal((1, 13, 6)).astype(np.float32)
    cu = np.array([0, 5, 13])
    y, state = linseq.ops.run("causal_conv1d", {"x": x, "weight": w}, cu_seqlens=cu)
    grads = linseq.ops.backward("causal_conv1d", {"x": x, "weight": w}, {"d_y": d_y},
                                cu_seqlens=cu)
    dweight = 0
    for n, (lo, hi) in enumerate(zip(cu[:-1], cu[1:])):
        ys, ss = linseq.ops.run("causal_conv1d", {"x": x[:, lo:hi], "weight": w})
        np.testing.assert_array_equal(y[:, lo:hi], ys)
        np.testing.assert_array_equal(state[n], ss[0])
        gs = linseq.ops.backward("causal_conv1d", {"x": x[:, lo:hi], "weight": w},
                                 {"d_y": d_y[:, lo:hi]})
        np.testing.assert_array_equal(grads["dx"][:, lo:hi], gs["dx"])
        dweight = dweight + gs["dweight"]
    np.testing.assert_allclose(grads["dweight"], dweight, rtol=1e-5, atol=1e-6)
    xe, a, _ = ema_inputs(rng, B=1, T=4, D=3)
    with pytest.raises(ValueError, match="cu_seqlens: ema takes no packed sequences"):
        linseq.ops.run("ema", {"x": xe, "a": a}, cu_seqlens=np.array([0, 4]))
