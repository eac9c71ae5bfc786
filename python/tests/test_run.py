"""The generic entry of every front end (linseq.api.run, linseq.torch.run, linseq.jax.run): an
op of the library's table by name, its arrays by the table's names, its options as keywords,
the same results as the per-op functions written over it."""

import numpy as np
import pytest

from conftest import require
from linseq import _lib, _opspec, api


def _kda(seed=0, B=2, T=11, H=2, K=8, V=4):
    rng = np.random.default_rng(seed)
    f = np.float32
    return dict(q=rng.standard_normal((B, T, H, K)).astype(f),
                k=rng.standard_normal((B, T, H, K)).astype(f),
                v=rng.standard_normal((B, T, H, V)).astype(f),
                g=-rng.random((B, T, H, K)).astype(f), beta=rng.random((B, T, H)).astype(f))


def _conv(seed=1, B=2, T=9, D=5, W=4):
    rng = np.random.default_rng(seed)
    return dict(x=rng.standard_normal((B, T, D)).astype(np.float32),
                weight=rng.standard_normal((D, W)).astype(np.float32))


def test_numpy_run_is_the_functions_call():
    a = _kda()
    o, ht = api.run("kda", a, scale=0.5, qk_l2norm=True, mode="recurrent")
    want_o, want_ht = api.kda(a["q"], a["k"], a["v"], a["beta"], a["g"], softmax_scale=0.5,
                              use_chunked=False)
    np.testing.assert_array_equal(o, want_o)
    np.testing.assert_array_equal(ht, want_ht)
    c = _conv()
    y, state = api.run("causal_conv1d", c, activation="silu")
    want_y, want_state = api.causal_conv1d(c["x"], c["weight"], activation="silu")
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(state, want_state)
    assert set(_opspec.SPECS) == {o["name"] for o in _lib.op_table["ops"]}


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="op: expected one of"):
        api.run("conv1d", _conv())
    with pytest.raises(ValueError, match=r"arrays: causal_conv1d takes .*\['bias_typo'\]"):
        api.run("causal_conv1d", dict(_conv(), bias_typo=None))
    with pytest.raises(TypeError):
        api.run("causal_conv1d", _conv(), act="silu")
    with pytest.raises(ValueError, match="scale"):
        api.run("kda", _kda(), scale=0.0)


def test_torch_run_is_differentiable():
    torch = require("torch")
    import linseq.torch as lt
    c = {n: torch.from_numpy(a).requires_grad_() for n, a in _conv().items()}
    y, _ = lt.run("causal_conv1d", c, activation="silu")
    y.square().sum().backward()
    got = [c["x"].grad, c["weight"].grad]
    d = {n: a.detach().clone().requires_grad_() for n, a in c.items()}
    want, _ = lt.causal_conv1d(d["x"], d["weight"], activation="silu")
    want.square().sum().backward()
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    for g, w in zip(got, [d["x"].grad, d["weight"].grad]):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_jax_run_under_jit():
    jax = require("jax")
    import jax.numpy as jnp

    import linseq.jax as lj
    a = {n: jnp.asarray(x) for n, x in _kda().items()}
    o, _ = jax.jit(lambda a: lj.run("kda", a, qk_l2norm=True))(a)
    want, _ = lj.kda(a["q"], a["k"], a["v"], a["beta"], a["g"])
    np.testing.assert_array_equal(np.asarray(o), np.asarray(want))
