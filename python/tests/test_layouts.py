"""SSM1's layouts through linseq.ops: channel_first and strided inputs (mamba-ssm's [b, d, l]
tensors, halves of an xz tensor, transposed views, constant and grouped B/C) give the same
bits as the dense token-major call on the same values, forward and backward; float32 views
reach the library as the caller's own memory (the pointer in the problem struct is the
caller's), from NumPy and PyTorch; and decode over a pool of state rows advances exactly the
named rows, as a one-token forward from each would."""

import numpy as np
import pytest

from linseq import ops
from conftest import require


def _dense(B=2, T=70, D=80, N=5, G=0, seed=0):
    """Token-major inputs: x, dt, z [B,T,D]; B, C [B,T,N] or [B,T,G,N]; A, D, dt_bias, h0."""
    rng = np.random.default_rng(seed)
    f = np.float32
    bc = (B, T, G, N) if G else (B, T, N)
    return dict(x=rng.standard_normal((B, T, D)).astype(f),
                dt=rng.standard_normal((B, T, D)).astype(f),
                z=rng.standard_normal((B, T, D)).astype(f),
                B=rng.standard_normal(bc).astype(f), C=rng.standard_normal(bc).astype(f),
                A=-rng.uniform(0.1, 4, (D, N)).astype(f), D=rng.standard_normal(D).astype(f),
                bias=rng.uniform(-6, -2, D).astype(f),
                h0=(0.5 * rng.standard_normal((B, D, N))).astype(f),
                d_y=rng.standard_normal((B, T, D)).astype(f),
                d_hT=rng.standard_normal((B, D, N)).astype(f))


def _run(a, x, dt, z, Bp, Cp, d_y, channel_first=False):
    inputs = ops.Ssm1Inputs(x, dt, a["A"], Bp, Cp, a["D"], gate=z, h0=a["h0"], dt_softplus=True,
                            dt_bias=a["bias"], channel_first=channel_first)
    y, hT = ops.ssm1_forward(inputs)
    grads = ops.ssm1_backward(inputs, d_y, a["d_hT"])
    return inputs, y, hT, grads


def _cf(t):
    """Token-major [B,T,...] -> channel-first [B,...,T] view (no copy)."""
    return np.moveaxis(t, 1, -1)


def _assert_same(got, want, what):
    assert got.shape == want.shape, what
    assert np.array_equal(got, want), f"{what}: max diff {np.max(np.abs(got - want))}"


def _check_against_dense(a, inputs, y, hT, grads, channel_first, dense):
    _, y0, hT0, g0 = dense
    _assert_same(np.moveaxis(y, -1, 1) if channel_first else y, y0, "y")
    _assert_same(hT, hT0, "hT")
    for key in ("dx", "ddt", "dgate"):
        _assert_same(np.moveaxis(grads[key], -1, 1) if channel_first else grads[key], g0[key],
                     key)
    for key in ("dA", "dD", "ddt_bias", "dh0"):
        _assert_same(grads[key], g0[key], key)


@pytest.mark.parametrize("G", [0, 2])
def test_mamba_layout_matches_dense(G):
    """x, z = xz.chunk(2, dim=1) of a [B,2D,T] tensor, dt a transposed view, B/C [B,(G,)N,T]."""
    a = _dense(G=G)
    dense = _run(a, a["x"], a["dt"], a["z"], a["B"], a["C"], a["d_y"])
    xz = np.ascontiguousarray(np.concatenate([_cf(a["x"]), _cf(a["z"])], axis=1))
    D = a["x"].shape[2]
    x, z = xz[:, :D], xz[:, D:]
    dt = _cf(a["dt"])  # a view of the token-major array: strides (T*D, 1, D)
    Bp = np.ascontiguousarray(_cf(a["B"]))
    Cp = _cf(a["C"])  # a strided view
    inputs, y, hT, grads = _run(a, x, dt, z, Bp, Cp, np.ascontiguousarray(_cf(a["d_y"])),
                                channel_first=True)
    _check_against_dense(a, inputs, y, hT, grads, True, dense)
    _assert_same(np.moveaxis(grads["dB"], -1, 1), dense[3]["dB"], "dB")
    _assert_same(np.moveaxis(grads["dC"], -1, 1), dense[3]["dC"], "dC")
    # nothing was copied: the problem points at the caller's memory
    assert inputs.problem.x == x.ctypes.data and inputs.problem.gate == z.ctypes.data
    assert inputs.problem.dt == dt.ctypes.data and inputs.problem.C_proj == Cp.ctypes.data
    assert y.flags.c_contiguous and y.shape == x.shape


def test_token_major_views_match_dense():
    """Token-major outputs from views: halves of a [B,T,2D] xz, dt a channel-first array's
    transpose, B padded between tokens."""
    a = _dense()
    dense = _run(a, a["x"], a["dt"], a["z"], a["B"], a["C"], a["d_y"])
    xz = np.ascontiguousarray(np.concatenate([a["x"], a["z"]], axis=2))
    D = a["x"].shape[2]
    dt = np.ascontiguousarray(_cf(a["dt"])).transpose(0, 2, 1)
    padded = np.full(a["B"].shape[:2] + (a["B"].shape[2] + 3,), np.nan, np.float32)
    padded[..., :a["B"].shape[2]] = a["B"]
    Bp = padded[..., :a["B"].shape[2]]
    inputs, y, hT, grads = _run(a, xz[..., :D], dt, xz[..., D:], Bp, a["C"], a["d_y"])
    _check_against_dense(a, inputs, y, hT, grads, False, dense)
    _assert_same(grads["dB"], dense[3]["dB"], "dB")
    assert inputs.problem.x == xz.ctypes.data and inputs.problem.B_proj == padded.ctypes.data


@pytest.mark.parametrize("channel_first", [False, True])
def test_constant_b_c(channel_first):
    """mamba's constant B, C [D,N]: the same bits as the dense [B,T,D,N] expansion (G = D);
    dB, dC come back [D,N], the sum over batch and tokens."""
    a = _dense(D=24, N=4)
    B_, T, D = a["x"].shape
    Bc, Cc = a["B"][0, 0, :].copy(), a["C"][0, 0, :].copy()
    rng = np.random.default_rng(5)
    Bc = rng.standard_normal((D, 4)).astype(np.float32)
    Cc = rng.standard_normal((D, 4)).astype(np.float32)
    Bx = np.ascontiguousarray(np.broadcast_to(Bc, (B_, T, D, 4)))
    Cx = np.ascontiguousarray(np.broadcast_to(Cc, (B_, T, D, 4)))
    dense = _run(a, a["x"], a["dt"], a["z"], Bx, Cx, a["d_y"])
    if channel_first:
        args = (_cf(a["x"]), _cf(a["dt"]), _cf(a["z"]), Bc, Cc, _cf(a["d_y"]))
    else:
        args = (a["x"], a["dt"], a["z"], Bc, Cc, a["d_y"])
    inputs, y, hT, grads = _run(a, *args, channel_first=channel_first)
    assert inputs.problem.G == D and inputs.problem.B_strides.batch == 0
    _check_against_dense(a, inputs, y, hT, grads, channel_first, dense)
    for key in ("dB", "dC"):
        assert grads[key].shape == (D, 4)
        want = dense[3][key].astype(np.float64).sum(axis=(0, 1))
        np.testing.assert_allclose(grads[key], want, rtol=1e-5,
                                   atol=1e-5 * np.abs(want).max())


def test_shared_b_with_grouped_c():
    """B with one group and C with G groups: B is read by every group (zero group stride)
    and its gradient is the sum over the groups."""
    a = _dense(G=2, seed=3)
    Bx = a["B"]  # [B,T,2,N]
    shared = np.ascontiguousarray(Bx[:, :, 0])
    Bx2 = np.ascontiguousarray(np.broadcast_to(shared[:, :, None], Bx.shape))
    dense = _run(a, a["x"], a["dt"], a["z"], Bx2, a["C"], a["d_y"])
    inputs, y, hT, grads = _run(a, a["x"], a["dt"], a["z"], shared, a["C"], a["d_y"])
    _check_against_dense(a, inputs, y, hT, grads, False, dense)
    want = dense[3]["dB"].astype(np.float64).sum(axis=2)
    np.testing.assert_allclose(grads["dB"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_torch_views_are_not_copied():
    torch = require("torch")
    a = _dense(B=1, T=20, D=16, N=4)
    xz = torch.from_numpy(np.concatenate([_cf(a["x"]), _cf(a["z"])], axis=1).copy())
    x, z = xz.chunk(2, dim=1)
    dt = torch.from_numpy(a["dt"]).transpose(1, 2)
    inputs = ops.Ssm1Inputs(x, dt, a["A"], _cf(a["B"]), _cf(a["C"]), gate=z,
                            channel_first=True)
    assert inputs.problem.x == x.data_ptr() and inputs.problem.gate == z.data_ptr()
    assert inputs.problem.dt == dt.data_ptr()
    y, _ = ops.ssm1_forward(inputs)
    y0, _ = ops.ssm1_forward(ops.Ssm1Inputs(a["x"], a["dt"], a["A"], a["B"], a["C"],
                                            gate=a["z"]))
    _assert_same(np.moveaxis(y, -1, 1), y0, "y")


def test_other_dtypes_and_negative_strides_are_copied_once():
    a = _dense(B=1, T=10, D=8, N=4)
    x64 = a["x"].astype(np.float64)
    flipped = a["dt"][:, ::-1]
    inputs = ops.Ssm1Inputs(x64, flipped, a["A"], a["B"], a["C"])
    assert inputs.x.dtype == np.float32 and inputs.dt.flags.c_contiguous
    y, _ = ops.ssm1_forward(inputs)
    y0, _ = ops.ssm1_forward(ops.Ssm1Inputs(a["x"], np.ascontiguousarray(flipped), a["A"],
                                            a["B"], a["C"]))
    _assert_same(y, y0, "y")


def test_shape_errors_name_the_argument():
    a = _dense(B=1, T=10, D=8, N=4)
    with pytest.raises(ValueError, match="dt"):
        ops.Ssm1Inputs(_cf(a["x"]), a["dt"], a["A"], _cf(a["B"]), _cf(a["C"]),
                       channel_first=True)
    with pytest.raises(ValueError, match="B: a constant"):
        ops.Ssm1Inputs(a["x"], a["dt"], a["A"], np.zeros((7, 4), np.float32), a["C"])
    with pytest.raises(ValueError, match="groups"):
        ops.Ssm1Inputs(a["x"], a["dt"], a["A"], np.zeros((1, 10, 2, 4), np.float32),
                       np.zeros((1, 10, 4, 4), np.float32))


@pytest.mark.parametrize("channel_first", [False, True])
def test_decode_pool(channel_first):
    rng = np.random.default_rng(7)
    R, Bq, D, N = 6, 4, 40, 5
    pool = rng.standard_normal((R, D, N)).astype(np.float32)
    before = pool.copy()
    x = rng.standard_normal((Bq, 1, D)).astype(np.float32)
    dt = rng.uniform(0.01, 0.2, (Bq, 1, D)).astype(np.float32)
    A = -rng.uniform(0.1, 2, (D, N)).astype(np.float32)
    Bp = rng.standard_normal((Bq, 1, N)).astype(np.float32)
    Cp = rng.standard_normal((Bq, 1, N)).astype(np.float32)
    rows = np.array([4, -1, 0, 2])
    tok = (lambda t: _cf(t)) if channel_first else (lambda t: t)
    inputs = ops.Ssm1Inputs(tok(x), tok(dt), A, tok(Bp), tok(Cp), channel_first=channel_first)
    y = ops.ssm1_decode(inputs, pool, rows)
    assert y.shape == ((Bq, D, 1) if channel_first else (Bq, 1, D))
    y = y.reshape(Bq, D)
    for b, r in enumerate(rows):
        if r < 0:
            assert not y[b].any()
            continue
        one = ops.Ssm1Inputs(x[b:b + 1], dt[b:b + 1], A, Bp[b:b + 1], Cp[b:b + 1],
                             h0=before[r:r + 1])
        y1, h1 = ops.ssm1_forward(one)
        _assert_same(y[b], y1[0, 0], f"y of request {b}")
        _assert_same(pool[r], h1[0], f"row {r}")
    for r in set(range(R)) - set(int(v) for v in rows if v >= 0):
        _assert_same(pool[r], before[r], f"row {r}, not named")
    with pytest.raises(ValueError, match="twice"):
        ops.ssm1_decode(inputs, pool, np.array([1, 1, 0, 2]))
    with pytest.raises(TypeError, match="state"):
        ops.ssm1_decode(inputs, pool.astype(np.float64), rows)


# causal conv1d ------------------------------------------------------------------------------

def _conv_dense(B=2, T=40, D=24, W=4, seed=11):
    rng = np.random.default_rng(seed)
    f = np.float32
    return dict(x=rng.standard_normal((B, T, D)).astype(f),
                w=rng.uniform(-0.5, 0.5, (D, W)).astype(f), b=rng.uniform(-0.5, 0.5, D).astype(f),
                s=rng.standard_normal((B, D, W - 1)).astype(f),
                d_y=rng.standard_normal((B, T, D)).astype(f))


def _conv_run(a, x, d_y, channel_first=False):
    inputs = ops.Conv1dInputs(x, a["w"], a["b"], conv_state=a["s"], activation="silu",
                              channel_first=channel_first)
    y, s = ops.conv1d_forward(inputs)
    return inputs, y, s, ops.conv1d_backward(inputs, d_y)


@pytest.mark.parametrize("view", ["xBC half", "transposed"])
def test_conv_channel_first_matches_dense(view):
    a = _conv_dense()
    _, y0, s0, g0 = _conv_run(a, a["x"], a["d_y"])
    D = a["x"].shape[2]
    if view == "xBC half":  # x = xBC[:, :D] of a [B,3D,T] tensor
        xbc = np.ascontiguousarray(np.concatenate([_cf(a["x"])] * 3, axis=1))
        x, base = xbc[:, :D], xbc
    else:
        x, base = _cf(a["x"]), a["x"]
    inputs, y, s, g = _conv_run(a, x, np.ascontiguousarray(_cf(a["d_y"])), channel_first=True)
    assert inputs.problem.x == base.ctypes.data  # the caller's memory, not a copy
    _assert_same(np.moveaxis(y, -1, 1), y0, "y")
    _assert_same(s, s0, "conv_state_out")
    _assert_same(np.moveaxis(g["dx"], -1, 1), g0["dx"], "dx")
    for key in ("dweight", "dbias", "dconv_state"):
        _assert_same(g[key], g0[key], key)


def _update_reference(x, pool, w, b, rows, cache, silu=True):
    """causal_conv1d_update as linseq.h words it, in float64 on a copy of the pool:
    x [B,T,D]; returns (y [B,T,D], the new pool)."""
    pool = pool.astype(np.float64).copy()
    Bq, T, D = x.shape
    W, L = w.shape[1], pool.shape[2]
    y = np.zeros((Bq, T, D))
    for bi in range(Bq):
        r = bi if rows is None else rows[bi]
        if r < 0:
            continue
        row = pool[r]
        if cache is None:
            prev = row[:, L - (W - 1):]
        else:
            c = cache[bi] % L
            prev = row[:, [(c - (W - 1) + i) % L for i in range(W - 1)]]
        xs = np.concatenate([prev, x[bi].T.astype(np.float64)], axis=1)  # [D, W-1+T]
        for t in range(T):
            z = b + (w * xs[:, t:t + W]).sum(axis=1)
            y[bi, t] = z / (1 + np.exp(-z)) if silu else z
        if cache is None:
            pool[r] = np.concatenate([row, x[bi].T], axis=1)[:, T:]
        else:
            for t in range(T):
                row[:, (c + t) % L] = x[bi, t]
    return y, pool


@pytest.mark.parametrize("circular", [False, True])
@pytest.mark.parametrize("channel_first", [False, True])
def test_conv_decode_pool(circular, channel_first):
    rng = np.random.default_rng(13)
    R, Bq, T, D, W, L = 6, 4, 2, 20, 4, 5
    pool = rng.standard_normal((R, D, L)).astype(np.float32)
    x = rng.standard_normal((Bq, T, D)).astype(np.float32)
    w = rng.uniform(-0.5, 0.5, (D, W)).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, D).astype(np.float32)
    rows = np.array([3, -1, 0, 5])
    cache = np.array([0, 4, 7, 23]) if circular else None
    y_ref, pool_ref = _update_reference(x, pool, w, b, rows, cache)
    inputs = ops.Conv1dInputs(_cf(x) if channel_first else x, w, b, activation="silu",
                              channel_first=channel_first)
    y = ops.conv1d_decode(inputs, pool, rows, cache)
    y = np.moveaxis(y, -1, 1) if channel_first else y
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(pool, pool_ref.astype(np.float32))
    with pytest.raises(Exception, match="cache_seqlens"):
        ops.conv1d_decode(inputs, pool, rows, np.array([0, -1, 0, 0]))
