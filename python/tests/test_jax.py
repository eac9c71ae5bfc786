"""JAX: the functions under jax.jit, jax.grad and jax.vmap, gradients in each input's dtype,
and framework-side gate activations differentiated by JAX; on both paths, the XLA FFI custom
calls and the jax.pure_callback fallback."""

import numpy as np
import pytest

from conftest import require

jax = require("jax")
jnp = require("jax.numpy")
import linseq  # noqa: E402
import linseq.jax as lj  # noqa: E402
from linseq import _jax_backend, _jax_ffi, ops  # noqa: E402


@pytest.fixture(autouse=True, params=["ffi", "callback"])
def calls(request, monkeypatch):
    """Every test on both paths; the FFI one skipped where its handler library is missing
    (LINSEQ_JAX_CALLS=ffi, as CI sets it, makes that an import error instead)."""
    if request.param == "ffi" and not _jax_ffi.AVAILABLE:
        pytest.skip(f"no XLA FFI handlers: {_jax_ffi.WHY_NOT}")
    monkeypatch.setattr(_jax_backend, "_CALLS", request.param)
    return request.param


def _kda_arrays(seed=0, B=2, T=21, H=2, HV=4, K=12, V=8):
    rng = np.random.default_rng(seed)
    f = np.float32
    return dict(q=rng.standard_normal((B, T, H, K)).astype(f),
                k=rng.standard_normal((B, T, H, K)).astype(f),
                v=rng.standard_normal((B, T, HV, V)).astype(f),
                g=rng.standard_normal((B, T, HV, K)).astype(f),
                beta=rng.standard_normal((B, T, HV)).astype(f),
                h0=rng.standard_normal((B, HV, K, V)).astype(f),
                A_log=rng.standard_normal(HV).astype(f),
                dt_bias=rng.standard_normal(HV * K).astype(f))


OPTS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True, output_final_state=True)
ORDER = ("q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias")


def test_jit_grad_matches_the_c_backward():
    a = _kda_arrays()
    rng = np.random.default_rng(1)
    w_o = rng.standard_normal((2, 21, 4, 8)).astype(np.float32)
    w_h = rng.standard_normal((2, 4, 12, 8)).astype(np.float32)

    def loss(q, k, v, g, beta, h0, A_log, dt_bias):
        o, ht = linseq.chunk_kda(q, k, v, g, beta, initial_state=h0, A_log=A_log,
                                 dt_bias=dt_bias, **OPTS)
        return jnp.sum(o * w_o) + jnp.sum(ht * w_h)

    grads = jax.jit(jax.grad(loss, argnums=tuple(range(8))))(*(a[n] for n in ORDER))
    inputs = ops.KdaInputs(a["q"], a["k"], a["v"], a["beta"], a["g"], h0=a["h0"],
                           qk_l2norm=True, beta_is_logit=True, gate_in_kernel=True,
                           A_log=a["A_log"], dt_bias=a["dt_bias"])
    want = ops.kda_backward(inputs, w_o, w_h)
    names = dict(q="dq", k="dk", v="dv", g="dg", beta="dbeta", h0="dh0", A_log="dA_log",
                 dt_bias="ddt_bias")
    for n, got in zip(ORDER, grads):
        np.testing.assert_array_equal(np.asarray(got), want[names[n]], err_msg=n)


def test_grad_dtype_follows_the_input_and_vmap_runs_per_element():
    a = _kda_arrays(2, B=1)
    q16 = jnp.asarray(a["q"], dtype=jnp.bfloat16)

    def loss(q):
        o, _ = linseq.jax.kda(q, a["k"], a["v"][:, :, :2], a["beta"][:, :, :2],
                              -jnp.abs(a["g"][:, :, :2]))
        return jnp.sum(o)

    g = jax.grad(loss)(q16)
    assert g.dtype == jnp.bfloat16 and g.shape == q16.shape

    def one(q):  # q [T,H,K] of a single sequence
        o, _ = linseq.jax.kda(q[None], a["k"], a["v"][:, :, :2], a["beta"][:, :, :2],
                              -jnp.abs(a["g"][:, :, :2]))
        return o[0]

    qs = jnp.stack([a["q"][0], 2 * a["q"][0]])
    batched = jax.vmap(one)(qs)
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(batched[i]), np.asarray(one(qs[i])))


def test_state_space_v1_framework_gate_is_differentiated():
    rng = np.random.default_rng(3)
    B, T, D, N = 2, 40, 8, 4
    f = np.float32
    x = rng.standard_normal((B, T, D)).astype(f)
    A = (-rng.random((D, N)) - 0.1).astype(f)
    Bp = rng.standard_normal((B, T, N)).astype(f)
    Cp = rng.standard_normal((B, T, N)).astype(f)
    Dk = rng.standard_normal(D).astype(f)
    dt = (0.05 + 0.1 * rng.random((B, T, D))).astype(f)
    gate = rng.standard_normal((B, T, D)).astype(f)

    def loss(act):
        def f_(x, A, Bp, Cp, Dk, dt, gate):
            y, h, _ = linseq.state_space_v1(x, A, Bp, Cp, Dk, dt, gate=gate, act_fn=act)
            return jnp.sum(y * y) + jnp.sum(h)
        return jax.jit(jax.grad(f_, argnums=tuple(range(7))))(x, A, Bp, Cp, Dk, dt, gate)

    in_kernel = loss(jax.nn.silu)                          # mapped to the kernel's silu
    in_jax = loss(lambda z: z / (1 + jnp.exp(-z)))         # unknown callable: run by JAX
    for a_, b_ in zip(in_kernel, in_jax):
        np.testing.assert_allclose(np.asarray(a_), np.asarray(b_), rtol=2e-5, atol=2e-5)
    exact_gelu = loss(lambda z: jax.nn.gelu(z, approximate=False))
    tanh_gelu = loss(jax.nn.gelu)
    assert not np.allclose(np.asarray(exact_gelu[6]), np.asarray(tanh_gelu[6]), rtol=0,
                           atol=1e-7)  # the two gelus stay distinct


@pytest.mark.parametrize("per_head", [False, True])
def test_kda_decay_under_jit(per_head):
    rng = np.random.default_rng(4)
    shape = (2, 5, 3) if per_head else (2, 5, 3, 4)
    gate = rng.standard_normal(shape).astype(np.float32)
    A_log = rng.standard_normal(3).astype(np.float32)
    dt_bias = rng.standard_normal(3 if per_head else (3, 4)).astype(np.float32)
    g = jax.jit(linseq.kda_decay)(gate, A_log, dt_bias)
    a = np.exp(A_log.astype(np.float64))
    a = a if per_head else a[:, None]
    want = -a * np.logaddexp(0, gate + dt_bias)
    np.testing.assert_allclose(np.asarray(g), want, rtol=2e-6, atol=1e-7)
    dg = jax.grad(lambda b: jnp.sum(linseq.kda_decay(gate, A_log, b)))(dt_bias)
    assert dg.shape == dt_bias.shape
    want_db = (-a * (1 / (1 + np.exp(-(gate + dt_bias))))).sum(axis=(0, 1))
    np.testing.assert_allclose(np.asarray(dg), want_db, rtol=1e-5)


# ------------------------------------------------------------------------------------------
# Trace-time checks, vmap folded into the kernels' batch, errors from the library
# ------------------------------------------------------------------------------------------

def _plain_kda(seed=5, B=2, T=7, H=2, K=8, V=4):
    rng = np.random.default_rng(seed)
    f = np.float32
    q, k = (rng.standard_normal((B, T, H, K)).astype(f) for _ in range(2))
    return (q, k, rng.standard_normal((B, T, H, V)).astype(f),
            -rng.random((B, T, H, K)).astype(f), rng.random((B, T, H)).astype(f))


def test_a_wrong_shape_is_the_numpy_value_error_raised_while_tracing():
    q, k, v, g, beta = _plain_kda()
    bad_k = k[:, :, :, :5]
    with pytest.raises(ValueError) as numpy_error:
        linseq.chunk_kda(q, bad_k, v, g, beta)
    for run in (lambda *a: lj.chunk_kda(*a),                          # eager
                lambda *a: jax.jit(lj.chunk_kda).trace(*a),           # traced, not lowered
                lambda *a: jax.vmap(lj.chunk_kda)(*(x[None] for x in a))):
        with pytest.raises(ValueError) as jax_error:
            run(q, bad_k, v, g, beta)
        assert type(jax_error.value) is type(numpy_error.value)
        assert str(jax_error.value) == str(numpy_error.value)


def test_a_wrong_decode_pool_is_refused_while_tracing():
    q, k, v, g, beta = (x[:, :1] for x in _plain_kda())
    with pytest.raises(ValueError, match="state: expected a pool of shape"):
        jax.jit(lj.kda_decode).trace(q, k, v, g, beta, jnp.zeros((3, 2, 8, 5)))


def test_the_library_refusing_traced_values_names_them(calls):
    """Values known only when the call runs (traced cu_seqlens) are checked by the library:
    its message reaches the caller."""
    q, k, v, g, beta = (x[:1] for x in _plain_kda())
    bad = jnp.asarray([0, 5, 3, 7])  # decreasing
    run = jax.jit(lambda cu: linseq.chunk_kda(q, k, v, g, beta, cu_seqlens=cu)[0])
    with pytest.raises(Exception, match="cu_seqlens") as error:
        run(bad).block_until_ready()
    if calls == "ffi":
        assert "linseq_kda_forward" in str(error.value)


def _custom_calls(lowered):
    text = lowered.as_text()
    return text.count("stablehlo.custom_call @linseq_"), "stablehlo.while" in text


def test_vmap_folds_into_the_kernels_batch(calls):
    """vmap over sequences is one kernel call over all of them, forward and backward, with
    the per-element results; a mapped shared parameter falls back to a call per element."""
    q, k, v, g, beta = _plain_kda(B=3)
    w = np.random.default_rng(6).standard_normal(v.shape).astype(np.float32)

    def loss(q, k, v, g, beta, w):  # one sequence: [T,...]
        o, ht = lj.chunk_kda(q[None], k[None], v[None], g[None], beta[None],
                             output_final_state=True)
        return jnp.sum(o[0] * w) + jnp.sum(ht)

    value_and_grads = jax.vmap(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))
    got_value, got_grads = jax.jit(value_and_grads)(q, k, v, g, beta, w)
    for b in range(3):
        inputs = ops.KdaInputs(q[b:b + 1], k[b:b + 1], v[b:b + 1], beta[b:b + 1], g[b:b + 1])
        o, ht = ops.kda_forward(inputs)
        np.testing.assert_allclose(np.asarray(got_value[b]),
                                   np.sum(o[0] * w[b], dtype=np.float64) + ht.sum(),
                                   rtol=1e-5)
        want = ops.kda_backward(inputs, w[b:b + 1], np.ones_like(ht))
        for name, got in zip(("dq", "dk", "dv", "dg", "dbeta"), got_grads):
            np.testing.assert_array_equal(np.asarray(got[b]), want[name][0], err_msg=name)
    if calls == "ffi":
        assert _custom_calls(jax.jit(value_and_grads).lower(q, k, v, g, beta, w)) == (2, False)
        # A_log mapped: the forward cannot share one call, so it runs once per element
        def gated(q, A_log):
            return lj.chunk_kda(q[None], k[:1], v[:1], g[:1], beta[:1], A_log=A_log,
                               use_gate_in_kernel=True)[0][0]
        A_logs = np.zeros((3, 2), np.float32)
        assert _custom_calls(jax.jit(jax.vmap(gated)).lower(q, A_logs)) == (1, True)
        np.testing.assert_array_equal(np.asarray(jax.vmap(gated)(q, A_logs)[1]),
                                      np.asarray(gated(q[1], A_logs[1])))


def test_vmap_of_ssm1_and_conv_gradients_matches_numpy(calls):
    """The forward folds (A, D, weight, bias shared); the backward, whose parameter
    gradients vmap wants per element, runs per element; both match the NumPy path."""
    rng = np.random.default_rng(7)
    f = np.float32
    M, T, D, N, W = 2, 6, 4, 3, 3
    x = rng.standard_normal((M, 1, T, D)).astype(f)
    dt = (0.1 + 0.1 * rng.random((M, 1, T, D))).astype(f)
    A = (-rng.random((D, N)) - 0.1).astype(f)
    Bp = rng.standard_normal((M, 1, T, N)).astype(f)
    Cp = rng.standard_normal((M, 1, T, N)).astype(f)
    weight = rng.standard_normal((D, W)).astype(f)

    def loss(x, dt, Bp, Cp, A, weight):
        xc, _ = lj.causal_conv1d(x, weight, activation="silu")
        y, h, _ = lj.state_space_v1(xc, A, Bp, Cp, None, dt)
        return jnp.sum(y * y) + jnp.sum(h)

    grad = jax.grad(loss, argnums=(0, 4, 5))
    got = jax.jit(jax.vmap(grad, in_axes=(0, 0, 0, 0, None, None)))(x, dt, Bp, Cp, A, weight)
    for m in range(M):
        want = grad(x[m], dt[m], Bp[m], Cp[m], A, weight)
        for g_, w_ in zip(got, want):
            np.testing.assert_allclose(np.asarray(g_[m]), np.asarray(w_), rtol=1e-6, atol=1e-6)
    conv = ops.conv1d_forward(ops.Conv1dInputs(x[0], weight, activation="silu"))[0]
    np.testing.assert_array_equal(
        np.asarray(jax.vmap(lambda x: lj.causal_conv1d(x, weight, activation="silu")[0])(x)[0]),
        conv)


def test_vmap_of_decode_folds_the_pools(calls):
    """Each mapped element decodes against its own pool (rows given or not); one call over
    one pool of all their rows, the same as NumPy per element."""
    rng = np.random.default_rng(8)
    f = np.float32
    M, B, R, H, K, V = 3, 2, 4, 2, 8, 4
    q, k = (rng.standard_normal((M, B, H, K)).astype(f) for _ in range(2))
    v = rng.standard_normal((M, B, H, V)).astype(f)
    g = -rng.random((M, B, H, K)).astype(f)
    beta = rng.random((M, B, H)).astype(f)
    pools = rng.standard_normal((M, R, H, K, V)).astype(f)
    rows = np.array([[3, -1], [0, 2], [1, 3]], np.int32)

    def step(q, k, v, g, beta, pool, rows=None):
        return lj.kda_decode(q, k, v, g, beta, pool, rows, use_qk_l2norm_in_kernel=True)

    for with_rows in (False, True):
        extra = (jnp.asarray(rows),) if with_rows else ()
        o, new = jax.jit(jax.vmap(step))(q, k, v, g, beta, pools, *extra)
        for m in range(M):
            pool = pools[m].copy()
            want = linseq.kda_decode(q[m], k[m], v[m], g[m], beta[m], pool,
                                     rows[m] if with_rows else None,
                                     use_qk_l2norm_in_kernel=True, inplace=True)[0]
            np.testing.assert_array_equal(np.asarray(o[m]), want)
            np.testing.assert_array_equal(np.asarray(new[m]), pool)
        if calls == "ffi":
            lowered = jax.jit(jax.vmap(step)).lower(q, k, v, g, beta, pools, *extra)
            assert _custom_calls(lowered) == (1, False)


def test_without_the_handler_library_the_callbacks_run_unless_ffi_is_required(monkeypatch):
    monkeypatch.setenv("LINSEQ_XLA_FFI_LIBRARY", "/nonexistent/liblinseq_xla_ffi.so")
    monkeypatch.delenv("LINSEQ_JAX_CALLS", raising=False)
    handlers, why = _jax_ffi._load()
    assert handlers is None and "nonexistent" in why
    monkeypatch.setenv("LINSEQ_JAX_CALLS", "ffi")
    with pytest.raises(ImportError, match="LINSEQ_JAX_CALLS=ffi.*nonexistent"):
        _jax_ffi._load()


def test_gradients_come_back_in_the_shapes_the_inputs_were_given():
    """SSM1's constant B [D,N], shared C [B,T,N], grouped B and C [B,T,G,N], nn.Conv1d's
    weight [D,1,W], a [H,K] dt_bias:
    each gradient in its input's shape, equal to the NumPy backward's."""
    rng = np.random.default_rng(9)
    f = np.float32
    Bn, T, D, N, G, W, H, K = 2, 5, 4, 3, 2, 3, 2, 4
    x, dt = rng.standard_normal((Bn, T, D)).astype(f), (0.1 * rng.random((Bn, T, D))).astype(f)
    A = (-rng.random((D, N)) - 0.1).astype(f)
    forms = ((rng.standard_normal((D, N)).astype(f), rng.standard_normal((Bn, T, N)).astype(f)),
             tuple(rng.standard_normal((Bn, T, G, N)).astype(f) for _ in range(2)))
    for Bp, Cp in forms:  # constant B with one group of C; B and C in G groups
        grads = jax.grad(lambda A, Bp, Cp: jnp.sum(lj.state_space_v1(x, A, Bp, Cp, None, dt)[0]),
                         argnums=(0, 1, 2))(A, Bp, Cp)
        want = ops.ssm1_backward(ops.Ssm1Inputs(x, dt, A, Bp, Cp), np.ones((Bn, T, D), f))
        for got, name in zip(grads, ("dA", "dB", "dC")):
            np.testing.assert_allclose(np.asarray(got), want[name], rtol=1e-5, atol=1e-6,
                                       err_msg=name)
    weight = rng.standard_normal((D, 1, W)).astype(f)
    dw = jax.grad(lambda w: jnp.sum(lj.causal_conv1d(x, w)[0]))(weight)
    want = ops.conv1d_backward(ops.Conv1dInputs(x, weight), np.ones((Bn, T, D), f))["dweight"]
    np.testing.assert_array_equal(np.asarray(dw), want)
    gate = rng.standard_normal((Bn, T, H, K)).astype(f)
    A_log, dt_bias = rng.standard_normal(H).astype(f), rng.standard_normal((H, K)).astype(f)
    d_bias = jax.grad(lambda b: jnp.sum(lj.kda_decay(gate, A_log, b)))(dt_bias)
    want = ops.kda_gate_backward(ops.GateInputs(gate, A_log, dt_bias),
                                 np.ones(gate.shape, f))["ddt_bias"]
    assert d_bias.shape == (H, K)
    np.testing.assert_array_equal(np.asarray(d_bias), want)
