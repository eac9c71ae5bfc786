"""KDA's l2norm eps as an option (vLLM's kernels normalise q and k with eps 1e-5, fla's with
1e-6): linseq's kernels against a float64 recurrence written here with that eps."""

import numpy as np
import pytest

from linseq import ops


def _reference(q, k, v, beta, g, eps):
    """o and the final state of the gated delta rule in float64 (l2norm with eps)."""
    q, k, v, beta, g = (np.asarray(x, np.float64) for x in (q, k, v, beta, g))
    B, T, H, K = q.shape
    V = v.shape[-1]
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps) * K ** -0.5
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
    S, o = np.zeros((B, H, K, V)), np.zeros((B, T, H, V))
    for t in range(T):
        S = np.exp(g[:, t])[..., None] * S
        u = beta[:, t][..., None] * (v[:, t] - np.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + np.einsum("bhk,bhv->bhkv", k[:, t], u)
        o[:, t] = np.einsum("bhkv,bhk->bhv", S, q[:, t])
    return o, S


@pytest.mark.parametrize("eps", [1e-5, 0.05])
@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
def test_the_eps_is_the_one_given(eps, mode):
    rng = np.random.default_rng(5)
    B, T, H, K, V = 2, 40, 2, 8, 4
    q = rng.standard_normal((B, T, H, K)).astype(np.float32) * 0.03  # |q|^2 ~ 1000 eps
    k = rng.standard_normal((B, T, H, K)).astype(np.float32) * 0.03
    v = rng.standard_normal((B, T, H, V)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (B, T, H)).astype(np.float32)
    g = -rng.uniform(0.01, 0.5, (B, T, H, K)).astype(np.float32)
    inputs = ops.KdaInputs(q, k, v, beta, g, qk_l2norm=True, l2norm_eps=eps)
    o, ht = ops.kda_forward(inputs, mode=mode, chunk_size=16)
    want_o, want_h = _reference(q, k, v, beta, g, np.float64(np.float32(eps)))
    assert np.abs(o - want_o).max() <= 2e-5 * np.abs(want_o).max()
    assert np.abs(ht - want_h).max() <= 2e-5 * np.abs(want_h).max()
    other, _ = _reference(q, k, v, beta, g, 1e-6)
    assert np.abs(other - want_o).max() > 1e-4 * np.abs(want_o).max()  # the eps matters here


def test_a_bad_eps_is_refused_by_name():
    x = np.ones((1, 2, 1, 4), np.float32)
    with pytest.raises(ValueError, match="l2norm_eps"):
        ops.KdaInputs(x, x, x, np.ones((1, 2, 1), np.float32), qk_l2norm=True, l2norm_eps=-1)
