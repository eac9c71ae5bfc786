"""linseq.compat.neuron: the Trainium KDA package's names against a float64 token-by-token
loop written here from the package's contract (pre-normalised q and k, per-channel decay,
one write gate per token, state keys x values), forward and backward, with sizes the
package cannot run (dk != dv, not 128, lengths that are no multiple of a chunk)."""

import inspect

import numpy as np
import pytest

from conftest import require

torch = require("torch")
from linseq.compat import neuron  # noqa: E402

f32 = np.float32


def ref(q, k, v, g, beta, state=None):
    """float64 KDA over (..., S, d) slices; beta (..., S). Differentiable with torch."""
    q, k, v, g, beta = (torch.as_tensor(x).double() for x in (q, k, v, g, beta))
    *lead, S, dk = q.shape
    dv = v.shape[-1]
    h = torch.zeros(*lead, dk, dv, dtype=torch.float64) if state is None else \
        torch.as_tensor(state).double()
    outs = []
    for t in range(S):
        h = h * torch.exp(g[..., t, :])[..., :, None]
        u = beta[..., t, None] * (v[..., t, :] - torch.einsum("...k,...kv->...v", k[..., t, :], h))
        h = h + k[..., t, :, None] * u[..., None, :]
        outs.append(torch.einsum("...k,...kv->...v", q[..., t, :], h))
    return torch.stack(outs, dim=-2), h


def inputs(lead, S, dk, dv, seed=0, decay=0.3):
    rng = np.random.default_rng(seed)

    def unit(x):
        return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)
    q = (unit(rng.standard_normal((*lead, S, dk))) * dk ** -0.5).astype(f32)
    k = unit(rng.standard_normal((*lead, S, dk))).astype(f32)
    v = rng.standard_normal((*lead, S, dv)).astype(f32)
    g = (-decay * rng.random((*lead, S, dk)) * 3).astype(f32)
    beta = rng.uniform(0.1, 0.9, (*lead, S)).astype(f32)
    state = (0.5 * rng.standard_normal((*lead, dk, dv))).astype(f32)
    return q, k, v, g, beta, state


def close(name, got, want, tol=2e-5):
    got = torch.as_tensor(np.asarray(got) if isinstance(got, np.ndarray) else got).double()
    want = torch.as_tensor(want).double()
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    assert err <= tol, f"{name}: max rel err {err:.3g} > {tol}"


SIZES = [(37, 5, 3), (1, 4, 6), (70, 16, 8)]


@pytest.mark.parametrize("S,dk,dv", SIZES)
def test_recurrent_kernels_match_the_definition(S, dk, dv):
    q, k, v, g, beta, _ = inputs((), S, dk, dv)
    beta_row = np.repeat(beta[:, None], dk, axis=1)   # the package's (S, dk) broadcast gate
    o_ref, h_ref = ref(q, k, v, g, beta)
    o = neuron.kda_recurrent_fwd(q, k, v, g, beta_row)
    assert isinstance(o, np.ndarray) and o.dtype == f32
    close("out", o, o_ref)
    o2, h = neuron.kda_recurrent_fwd_state(q, k, v, g, beta_row)
    close("out", o2, o_ref)
    close("state", h, h_ref)
    assert h.dtype == f32


@pytest.mark.parametrize("S,dk,dv", SIZES)
def test_chunk_steps_carry_the_state(S, dk, dv):
    q, k, v, g, beta, s0 = inputs((), S, dk, dv, seed=1)
    o_ref, h_ref = ref(q, k, v, g, beta, s0)
    o, h = neuron.kda_chunk_step_exact(q, k, v, beta[:, None], g, s0)
    close("out", o, o_ref)
    close("state", h, h_ref)
    gc = np.cumsum(g.astype(np.float64), axis=0).astype(f32)
    o, h = neuron.kda_chunk_step(q, k, v, np.repeat(beta[:, None], dk, 1), gc, gc[-1], s0)
    close("out", o, o_ref, 5e-5)
    close("state", h, h_ref, 5e-5)


def test_chunk_step_is_exact_when_channels_decay_differently():
    """The regime where a mean over the channels is wrong: one channel keeps everything,
    another forgets almost everything at every token."""
    S, dk, dv = 40, 6, 4
    q, k, v, _, beta, s0 = inputs((), S, dk, dv, seed=2)
    g = np.zeros((S, dk), f32)
    g[:, 1], g[:, 2], g[:, 3] = -4.0, -0.01, -1.5
    gc = np.cumsum(g.astype(np.float64), axis=0).astype(f32)
    o, h = neuron.kda_chunk_step(q, k, v, beta[:, None], gc, gc[-1:], s0)
    o_ref, h_ref = ref(q, k, v, g, beta, s0)
    close("out", o, o_ref, 5e-5)
    close("state", h, h_ref, 5e-5)


def test_chunks_in_sequence_equal_one_pass():
    q, k, v, g, beta, s0 = inputs((), 90, 8, 5, seed=3)
    h = s0
    outs = []
    for c0 in range(0, 90, 32):   # 32, 32, 26: the last chunk is short
        sl = slice(c0, c0 + 32)
        o, h = neuron.kda_chunk_step_exact(q[sl], k[sl], v[sl], beta[sl, None], g[sl], h)
        outs.append(o)
    o_ref, h_ref = ref(q, k, v, g, beta, s0)
    close("out", np.concatenate(outs), o_ref)
    close("state", h, h_ref)


def test_multihead_and_decode_batch():
    q, k, v, g, beta, s0 = inputs((3,), 20, 8, 12, seed=4)
    o, h = neuron.kda_chunk_step_exact_multihead(q, k, v, beta[..., None], g, s0)
    o_ref, h_ref = ref(q, k, v, g, beta, s0)
    close("out", o, o_ref)
    close("state", h, h_ref)
    # decode: row n of every input is one (batch, head) pair, one token each
    o, h = neuron.kda_decode_batch(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0, None], s0)
    o_ref, h_ref = ref(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], s0)
    close("out", o, o_ref[:, 0])
    close("state", h, h_ref)
    assert np.array_equal(s0, inputs((3,), 20, 8, 12, seed=4)[5])   # the given state is kept


@pytest.mark.parametrize("wide_beta", [False, True])
@pytest.mark.parametrize("with_d_state", [False, True])
def test_chunk_step_exact_bwd_matches_autograd(wide_beta, with_d_state):
    S, dk, dv = 45, 6, 4
    q, k, v, g, beta, s0 = inputs((), S, dk, dv, seed=5)
    rng = np.random.default_rng(6)
    d_o = rng.standard_normal((S, dv)).astype(f32)
    d_h = rng.standard_normal((dk, dv)).astype(f32) if with_d_state else None
    beta_in = np.repeat(beta[:, None], dk, 1) if wide_beta else beta[:, None]
    grads = neuron.kda_chunk_step_exact_bwd(q, k, v, beta_in, g, s0, d_o, d_h)

    leaves = [torch.tensor(x, dtype=torch.float64, requires_grad=True)
              for x in (q, k, v, beta, g, s0)]
    o, h = ref(leaves[0], leaves[1], leaves[2], leaves[4], leaves[3], leaves[5])
    loss = (o * torch.as_tensor(d_o).double()).sum()
    if d_h is not None:
        loss = loss + (h * torch.as_tensor(d_h).double()).sum()
    loss.backward()
    names = ["d_query", "d_key", "d_value", "d_beta", "d_g", "d_state_in"]
    for name, got, leaf in zip(names, grads, leaves):
        want = leaf.grad
        if name == "d_beta":
            assert got.shape == beta_in.shape
            assert not got[:, 1:].any()
            got = got[:, 0]
        close(name, got, want, 5e-5)


@pytest.mark.parametrize("fn", ["kda_recurrent", "kda_chunked", "kda_chunked_fused"])
@pytest.mark.parametrize("with_state", [False, True])
def test_differentiable_names_train(fn, with_state):
    q, k, v, g, beta, s0 = inputs((2, 3), 37, 8, 5, seed=7)
    ours = [torch.tensor(x, requires_grad=True) for x in (q, k, v, g, beta, s0)]
    theirs = [torch.tensor(x, dtype=torch.float64, requires_grad=True)
              for x in (q, k, v, g, beta, s0)]
    gen = torch.Generator().manual_seed(8)
    w_o, w_h = torch.randn(2, 3, 37, 5, generator=gen), torch.randn(2, 3, 8, 5, generator=gen)
    state = ours[5] if with_state else None
    o, h = getattr(neuron, fn)(*ours[:5], state)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float32
    ((o * w_o).sum() + (h * w_h).sum()).backward()
    o_ref, h_ref = ref(*theirs[:5], theirs[5] if with_state else None)
    close("out", o, o_ref)
    close("state", h, h_ref)
    ((o_ref * w_o.double()).sum() + (h_ref * w_h.double()).sum()).backward()
    for name, a, b in zip("q k v g beta initial_state".split(), ours, theirs):
        if name == "initial_state" and not with_state:
            assert a.grad is None
            continue
        close("d" + name, a.grad, b.grad, 5e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_dtypes(dtype):
    q, k, v, g, beta, s0 = (torch.tensor(x).to(dtype) for x in inputs((), 33, 8, 8, seed=9))
    o, h = neuron.kda_chunk_step_exact(q, k, v, beta[:, None], g, s0)
    assert o.dtype == dtype and h.dtype == torch.float32
    o_ref, h_ref = ref(q, k, v, g, beta, s0)    # on the same (rounded) inputs
    tol = 2e-5 if dtype == torch.float64 else 1e-2   # the output is rounded to dtype
    close("out", o, o_ref, tol)
    close("state", h, h_ref, 2e-5)


def test_keyword_names_reach_the_right_arguments():
    q, k, v, g, beta, s0 = inputs((), 12, 4, 3, seed=10)
    by_position = neuron.kda_chunk_step_exact(q, k, v, beta[:, None], g, s0)
    by_name = neuron.kda_chunk_step_exact(state_in=s0, g=g, beta=beta[:, None], value=v,
                                          key=k, query=q)
    np.testing.assert_array_equal(by_position[0], by_name[0])
    assert list(inspect.signature(neuron.kda_chunk_step).parameters) == [
        "q", "k", "v", "beta_broadcast", "g_cumsum", "g_last", "state_in"]
    assert list(inspect.signature(neuron.kda_recurrent_fwd).parameters) == [
        "query", "key", "value", "g_in", "beta_in"]


def _bad(fn, exc, words, *args):
    with pytest.raises(exc) as info:
        fn(*args)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_bad_arguments_are_refused_by_name():
    q, k, v, g, beta, s0 = inputs((), 10, 4, 3, seed=11)
    rows = np.repeat(beta[:, None], 4, 1)
    uneven = rows.copy()
    uneven[3, 2] += 0.1
    _bad(neuron.kda_recurrent_fwd, ValueError, ["beta_in", "row (3,)"], q, k, v, g, uneven)
    _bad(neuron.kda_recurrent_fwd, ValueError, ["value", "(..., S, dv)"], q, k, v[:9], g, rows)
    _bad(neuron.kda_recurrent_fwd, ValueError, ["key"], q, k[:, :3], v, g, rows)
    _bad(neuron.kda_recurrent_fwd, ValueError, ["g_in"], q, k, v, g[:, :3], rows)
    _bad(neuron.kda_recurrent_fwd, ValueError, ["query"], q[0], k, v, g, rows)
    _bad(neuron.kda_chunk_step_exact, ValueError, ["state_in", "(..., dk, dv)"],
         q, k, v, beta[:, None], g, s0.T)
    _bad(neuron.kda_chunk_step_exact, ValueError, ["beta"], q, k, v, beta[:, None, None], g, s0)
    _bad(neuron.kda_chunk_step_exact, TypeError, ["query", "complex"],
         q.astype(np.complex64), k, v, beta[:, None], g, s0)
    gc = np.cumsum(g, axis=0)
    _bad(neuron.kda_chunk_step, ValueError, ["g_last", "last row"],
         q, k, v, rows, gc, gc[-2], s0)
    _bad(neuron.kda_chunk_step, ValueError, ["g_last", "(..., dk)"],
         q, k, v, rows, gc, gc[-1, :2], s0)
    _bad(neuron.kda_chunk_step_exact_bwd, ValueError, ["d_chunk_out"],
         q, k, v, beta[:, None], g, s0, np.ones((10, 4), f32))
