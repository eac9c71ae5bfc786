"""JAX: the functions under jax.jit, jax.grad and jax.vmap, gradients in each input's dtype,
and framework-side gate activations differentiated by JAX."""

import numpy as np
import pytest

from conftest import require

jax = require("jax")
jnp = require("jax.numpy")
import linseq  # noqa: E402
from linseq import ops  # noqa: E402


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
