"""What an adversarial run found in the Python front ends, one regression test per finding:
JAX's per-option function cache, traced scales, in-place decode under torch autograd, and a
dt_bias that only has the right size."""

import numpy as np
import pytest

import linseq
from conftest import require

f32 = np.float32


def _kda(rng, B=1, T=6, H=2, K=4, V=3):
    return dict(q=rng.standard_normal((B, T, H, K)).astype(f32),
                k=rng.standard_normal((B, T, H, K)).astype(f32),
                v=rng.standard_normal((B, T, H, V)).astype(f32),
                g=-rng.random((B, T, H, K)).astype(f32),
                beta=rng.random((B, T, H)).astype(f32))


def test_jax_options_do_not_grow_a_cache():
    """A new scale per call must not add a compiled function per call (it grew RSS ~1 MB a
    call); nor must a refused scale."""
    jnp = require("jax.numpy")
    import linseq.jax as lj
    rng = np.random.default_rng(0)
    a = {n: jnp.asarray(x) for n, x in _kda(rng).items()}
    d = {n: jnp.asarray(x) for n, x in _kda(rng, T=1).items()}
    pool = jnp.zeros((1, 2, 4, 3))

    def calls(scale):
        lj.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], scale=scale)
        lj.kda_decode(d["q"], d["k"], d["v"], d["g"], d["beta"], pool, scale=scale)

    calls(0.5)
    before = lj.cached_functions()  # the forward's and the decode's functions included
    for i in range(300):
        calls(0.1 + i * 1e-3)
        with pytest.raises(ValueError, match="scale"):
            calls(float("nan"))
    assert lj.cached_functions() == before


def test_jax_scale_as_a_jax_scalar_and_under_jit():
    """A concrete jnp scalar works like the Python float; a traced one is refused by name."""
    jax = require("jax")
    jnp = jax.numpy
    import linseq.jax as lj
    a = {n: jnp.asarray(x) for n, x in _kda(np.random.default_rng(1)).items()}
    args = (a["q"], a["k"], a["v"], a["g"], a["beta"])
    want = np.asarray(linseq.chunk_kda(*(np.asarray(x) for x in args), scale=0.3)[0])
    got = np.asarray(lj.chunk_kda(*args, scale=jnp.float32(0.3))[0])
    np.testing.assert_array_equal(got, want)
    # the scale varies between the calls of one jitted function: that costs no new entry
    jitted = jax.jit(lambda s, *x: lj.chunk_kda(*x, scale=s)[0], static_argnums=0)
    np.testing.assert_array_equal(np.asarray(jitted(0.3, *args)), want)
    with pytest.raises(TypeError, match="scale"):
        jax.jit(lambda s, *x: lj.chunk_kda(*x, scale=s)[0])(0.3, *args)


def test_torch_inplace_decode_is_an_inplace_op():
    """The pool is written as a torch in-place op: its version counter moves, so autograd
    refuses a backward that saved the old values, and a leaf requiring grad is refused."""
    torch = require("torch")
    import linseq.torch as lt
    rng = np.random.default_rng(2)
    t = {n: torch.from_numpy(x) for n, x in _kda(rng, B=2, T=1).items()}
    pool = torch.from_numpy(rng.standard_normal((2, 2, 4, 3)).astype(f32))
    w = torch.ones_like(pool, requires_grad=True)
    loss = (w * pool).sum()  # saves pool for w's gradient
    version = pool._version
    lt.kda_decode(t["q"], t["k"], t["v"], t["g"], t["beta"], pool, inplace=True)
    assert pool._version > version
    with pytest.raises(RuntimeError, match="inplace"):
        loss.backward()

    leaf = pool.clone().requires_grad_(True)
    before = leaf.detach().clone()
    with pytest.raises(RuntimeError, match="state"):
        lt.kda_decode(t["q"], t["k"], t["v"], t["g"], t["beta"], leaf, inplace=True)
    assert torch.equal(leaf.detach(), before)
    with torch.no_grad():  # as torch allows an in-place update of a leaf without grad mode
        lt.kda_decode(t["q"], t["k"], t["v"], t["g"], t["beta"], leaf, inplace=True)
    assert not torch.equal(leaf.detach(), before)


def test_dt_bias_as_heads_by_channels_is_the_flat_bias():
    """[HV,K] is the flat [HV*K] bias row by row (the gate equals it exactly), and the gradient
    comes back in the given shape; [K,HV] is refused, not flattened (covered in the table)."""
    rng = np.random.default_rng(3)
    a = _kda(rng, H=2, K=4)
    bias = rng.standard_normal(8).astype(f32)
    kw = dict(use_gate_in_kernel=True, A_log=np.zeros(2, f32))
    flat = linseq.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], dt_bias=bias, **kw)[0]
    square = linseq.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"],
                              dt_bias=bias.reshape(2, 4), **kw)[0]
    np.testing.assert_array_equal(flat, square)
