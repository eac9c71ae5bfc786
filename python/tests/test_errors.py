"""Bad input is refused before any kernel runs, with the argument and what was expected."""

import numpy as np
import pytest

import linseq
from conftest import require

f32 = np.float32


def _kda(B=1, T=5, H=2, K=4, V=3, HV=None):
    HV = HV or H
    return dict(q=np.ones((B, T, H, K), f32), k=np.ones((B, T, H, K), f32),
                v=np.ones((B, T, HV, V), f32), g=-np.ones((B, T, HV, K), f32),
                beta=np.full((B, T, HV), 0.5, f32))


def _call(**over):
    a = _kda()
    kw = {k: over.pop(k) for k in list(over) if k not in a}
    a.update(over)
    return linseq.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **kw)


@pytest.mark.parametrize("over,exc,words", [
    (dict(q=np.ones((5, 2, 4), f32)), ValueError, ["q", "[B,T,H,K]"]),
    (dict(k=np.ones((1, 5, 2, 5), f32)), ValueError, ["k", "[B,T,H,K]"]),
    (dict(v=np.ones((1, 5, 3, 3), f32)), ValueError, ["v", "multiple"]),
    (dict(v=np.ones((1, 4, 2, 3), f32)), ValueError, ["v", "B,T"]),
    (dict(beta=np.ones((1, 5), f32)), ValueError, ["beta", "[B,T,HV]"]),
    (dict(g=np.ones((1, 5, 2, 3), f32)), ValueError, ["g", "[B,T,HV,K]"]),
    (dict(q=np.ones((1, 5, 2, 4), np.complex64)), TypeError, ["q", "complex"]),
    (dict(q=np.full((1, 5, 2, 4), "a")), TypeError, ["q", "dtype"]),
    (dict(initial_state=np.ones((1, 2, 3, 4), f32)), ValueError, ["initial_state", "[N,HV,K,V]"]),
    (dict(cu_seqlens=np.array([0, 3, 4])), ValueError, ["cu_seqlens", "T = 5"]),
    (dict(cu_seqlens=np.array([0, 4, 2, 5])), ValueError, ["cu_seqlens", "non-decreasing"]),
    (dict(cu_seqlens=np.array([0.0, 5.0])), TypeError, ["cu_seqlens", "integer"]),
    (dict(chunk_size=48), ValueError, ["chunk_size", "16, 32, 64 or 128"]),
    (dict(use_gate_in_kernel=True, dt_bias=np.zeros(7, f32)), ValueError, ["dt_bias"]),
    (dict(scale=float("nan")), ValueError, ["scale"]),
])
def test_kda_refuses(over, exc, words):
    with pytest.raises(exc) as info:
        _call(**over)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_library_errors_carry_the_c_message():
    # a pool row beyond the pool is a value only the library judges (lower_bound > 0, once
    # the example here, is refused in Python now, with every other unusable scalar option)
    a = _kda(T=1)
    with pytest.raises(linseq.LinseqError) as info:
        linseq.kda_decode(a["q"], a["k"], a["v"], a["g"], a["beta"], np.zeros((1, 2, 4, 3), f32),
                          np.array([3]))
    assert "state_rows[0] = 3" in str(info.value) and info.value.status == 7


def test_ssm_conv_decode_refuse():
    x = np.ones((1, 4, 6), f32)
    with pytest.raises(ValueError, match="A: expected shape"):
        linseq.state_space_v1(x, np.ones((5, 2), f32), np.ones((1, 4, 2), f32),
                              np.ones((1, 4, 2), f32), None, x)
    with pytest.raises(ValueError, match="groups G = 4 must divide D = 6"):
        linseq.state_space_v1(x, -np.ones((6, 2), f32), np.ones((1, 4, 4, 2), f32),
                              np.ones((1, 4, 4, 2), f32), None, x)
    with pytest.raises(ValueError, match="act_fn"):
        linseq.state_space_v1(x, -np.ones((6, 2), f32), np.ones((1, 4, 2), f32),
                              np.ones((1, 4, 2), f32), None, x, gate=x, act_fn="gelu")
    with pytest.raises(ValueError, match="weight"):
        linseq.causal_conv1d(x, np.ones((6, 2, 4), f32))
    with pytest.raises(ValueError, match="conv_state"):
        linseq.causal_conv1d(x, np.ones((6, 4), f32), conv_state=np.ones((1, 6, 4), f32))
    with pytest.raises(ValueError, match="activation"):
        linseq.causal_conv1d(x, np.ones((6, 4), f32), activation="tanh")
    a = _kda(T=1)
    with pytest.raises(ValueError, match="state"):
        linseq.kda_decode(a["q"], a["k"], a["v"], a["g"], a["beta"], np.zeros((3, 2, 4), f32))
    with pytest.raises(ValueError, match="one token"):
        b = _kda(T=2)
        linseq.kda_decode(b["q"], b["k"], b["v"], b["g"], b["beta"], np.zeros((1, 2, 4, 3), f32))
    with pytest.raises(linseq.LinseqError, match="state_rows"):
        linseq.kda_decode(a["q"], a["k"], a["v"], a["g"], a["beta"], np.zeros((1, 2, 4, 3), f32),
                          np.array([3]))


def test_frameworks_refuse_what_they_cannot_do():
    torch = require("torch")
    jnp = require("jax.numpy")
    a = _kda(T=1)
    with pytest.raises(TypeError, match="inplace"):
        linseq.kda_decode(*(jnp.asarray(a[n]) for n in ("q", "k", "v", "g", "beta")),
                          jnp.zeros((1, 2, 4, 3)), inplace=True)
    with pytest.raises(TypeError, match="float32"):
        linseq.kda_decode(*(torch.from_numpy(a[n]) for n in ("q", "k", "v", "g", "beta")),
                          torch.zeros((1, 2, 4, 3), dtype=torch.float64), inplace=True)
    with pytest.raises(TypeError, match="complex"):
        t = {n: torch.from_numpy(x) for n, x in _kda().items()}
        linseq.chunk_kda(t["q"].to(torch.complex64), t["k"], t["v"], t["g"], t["beta"])
