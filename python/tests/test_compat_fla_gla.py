"""linseq.compat.fla's gated linear attention (chunk_gla, fused_recurrent_gla,
chunk_simple_gla, fused_recurrent_simple_gla) against fla's documented definition, written
here in float64 (PyTorch, so that its autograd gives the reference gradients):

    S_t = diag(exp(gk_t)) S_{t-1} diag(exp(gv_t)) + k_t v_t^T,   o_t = scale * S_t^T q_t

per head, S starting from initial_state; simple GLA's decay exp(g_t + g_gamma) scales the
whole state; reverse runs each sequence from its last token; cu_seqlens packs sequences.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from linseq.compat import fla  # noqa: E402

TOL = 2e-5  # float32 kernels against the float64 definition (relative to the largest value)


def reference(q, k, v, *, gk=None, gv=None, g=None, scale=None, h0=None, reverse=False,
              cu=None, state_v_first=False):
    """(o, final states [N,HV,K,V] or V-first) in float64, from torch tensors."""
    q, k, v = (x.double() for x in (q, k, v))
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    scale = K ** -0.5 if scale is None else scale
    spans = [(b, 0, T) for b in range(B)] if cu is None else \
        [(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]
    outs, finals = torch.zeros(B, T, HV, V, dtype=torch.float64), []
    for n, (b, start, end) in enumerate(spans):
        states = []
        for hv in range(HV):
            h = hv // (HV // H)
            if h0 is None:
                S = torch.zeros(K, V, dtype=torch.float64)
            else:
                S = h0[n, hv].double()
                S = S.T if state_v_first else S
            order = range(end - 1, start - 1, -1) if reverse else range(start, end)
            for t in order:
                if gk is not None:
                    S = torch.exp(gk[b, t, hv].double())[:, None] * S
                if gv is not None:
                    S = S * torch.exp(gv[b, t, hv].double())[None, :]
                if g is not None:
                    S = torch.exp(g[b, t, hv].double()) * S
                S = S + torch.outer(k[b, t, h], v[b, t, hv])
                outs[b, t, hv] = scale * (q[b, t, h] @ S)
            states.append(S.T if state_v_first else S)
        finals.append(torch.stack(states))
    return outs, torch.stack(finals)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _inputs(seed, B=2, T=37, H=2, HV=2, K=12, V=10, n_seqs=None):
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape, s=1.0):
        return (s * torch.randn(*shape, generator=gen)).float()

    q, k = normal(B, T, H, K), normal(B, T, H, K, s=0.5)
    v = normal(B, T, HV, V)
    gk = torch.nn.functional.logsigmoid(normal(B, T, HV, K) + 2.0)
    gv = torch.nn.functional.logsigmoid(normal(B, T, HV, V) + 2.0)
    g = torch.nn.functional.logsigmoid(normal(B, T, HV) + 2.0)
    N = B if n_seqs is None else n_seqs
    h0 = normal(N, HV, K, V, s=0.5)
    return dict(q=q, k=k, v=v, gk=gk, gv=gv, g=g, h0=h0)


CU = torch.tensor([0, 9, 9, 30, 37], dtype=torch.int64)  # an empty sequence among them


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("v_first", [False, True])
def test_chunk_gla_forward(varlen, v_first):
    x = _inputs(1, B=1 if varlen else 2, n_seqs=4 if varlen else None)
    h0 = x["h0"].transpose(-1, -2).contiguous() if v_first else x["h0"]
    cu = CU if varlen else None
    o, ht = fla.chunk_gla(x["q"], x["k"], x["v"], x["gk"], scale=0.4, initial_state=h0,
                          output_final_state=True, state_v_first=v_first, cu_seqlens=cu)
    ro, rh = reference(x["q"], x["k"], x["v"], gk=x["gk"], scale=0.4, h0=h0, cu=cu,
                       state_v_first=v_first)
    assert _rel(o, ro) <= TOL and _rel(ht, rh) <= TOL


@pytest.mark.parametrize("decays", [("gk",), ("gv",), ("gk", "gv"), ()])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
def test_fused_recurrent_gla_forward(decays, reverse, varlen):
    x = _inputs(2, B=1 if varlen else 2, HV=4, n_seqs=4 if varlen else None)
    cu = CU if varlen else None
    given = {name: x[name] for name in decays}
    o, ht = fla.fused_recurrent_gla(x["q"], x["k"], x["v"], initial_state=x["h0"],
                                    output_final_state=True, reverse=reverse, cu_seqlens=cu,
                                    **given)
    ro, rh = reference(x["q"], x["k"], x["v"], h0=x["h0"], reverse=reverse, cu=cu, **given)
    assert _rel(o, ro) <= TOL and _rel(ht, rh) <= TOL


@pytest.mark.parametrize("function", ["chunk_simple_gla", "fused_recurrent_simple_gla"])
@pytest.mark.parametrize("decay", ["g", "g_gamma", "both", "none"])
def test_simple_gla_forward(function, decay):
    x = _inputs(3, HV=4)
    gamma = -torch.tensor([0.05, 0.3, 1.0, 4.0])
    given = dict(g=x["g"] if decay in ("g", "both") else None,
                 g_gamma=gamma if decay in ("g_gamma", "both") else None)
    o, ht = getattr(fla, function)(x["q"], x["k"], x["v"], initial_state=x["h0"],
                                   output_final_state=True, **given)
    total = None
    if given["g"] is not None or given["g_gamma"] is not None:
        total = (given["g"] if given["g"] is not None else 0) + \
            (gamma.expand(2, 37, 4) if given["g_gamma"] is not None else 0)
    ro, rh = reference(x["q"], x["k"], x["v"], g=total, h0=x["h0"])
    assert _rel(o, ro) <= TOL and _rel(ht, rh) <= TOL


def test_numpy_arrays_and_reverse_simple_gla():
    x = _inputs(4, B=1, n_seqs=4)
    arrays = {name: t.numpy() for name, t in x.items()}
    o, ht = fla.fused_recurrent_simple_gla(arrays["q"], arrays["k"], arrays["v"], g=arrays["g"],
                                           initial_state=arrays["h0"], output_final_state=True,
                                           reverse=True, cu_seqlens=CU.numpy())
    ro, rh = reference(x["q"], x["k"], x["v"], g=x["g"], h0=x["h0"], reverse=True, cu=CU)
    assert isinstance(o, np.ndarray) and _rel(o, ro) <= TOL and _rel(ht, rh) <= TOL


def _grads(fn, inputs, names):
    """The gradients of a fixed random projection of (o, final state) w.r.t. names."""
    leaves = {name: inputs[name].detach().clone().requires_grad_() for name in names}
    args = dict(inputs, **leaves)
    o, ht = fn(args)
    gen = torch.Generator().manual_seed(9)
    # drawn in float64 for both sides, then cast: the same projection whatever o's dtype
    loss = (o * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)).sum() + \
        (ht * torch.randn(ht.shape, generator=gen, dtype=torch.float64).to(ht.dtype)).sum()
    loss.backward()
    return {name: leaves[name].grad for name in names}


@pytest.mark.parametrize("case", ["chunk_gla", "recurrent_gk_gv_reverse", "chunk_simple_gla",
                                  "recurrent_simple_gla_varlen"])
def test_gradients_against_the_definition(case):
    varlen = case.endswith("varlen")
    x = _inputs(5, B=1 if varlen else 2, HV=2, n_seqs=4 if varlen else None)
    cu = CU if varlen else None
    if case == "chunk_gla":
        names = ["q", "k", "v", "gk", "h0"]
        ours = lambda a: fla.chunk_gla(a["q"], a["k"], a["v"], a["gk"], initial_state=a["h0"],
                                       output_final_state=True)
        ref = lambda a: reference(a["q"], a["k"], a["v"], gk=a["gk"], h0=a["h0"])
    elif case == "recurrent_gk_gv_reverse":
        names = ["q", "k", "v", "gk", "gv", "h0"]
        ours = lambda a: fla.fused_recurrent_gla(a["q"], a["k"], a["v"], a["gk"], a["gv"],
                                                 initial_state=a["h0"],
                                                 output_final_state=True, reverse=True)
        ref = lambda a: reference(a["q"], a["k"], a["v"], gk=a["gk"], gv=a["gv"], h0=a["h0"],
                                  reverse=True)
    elif case == "chunk_simple_gla":
        names = ["q", "k", "v", "g", "h0"]
        ours = lambda a: fla.chunk_simple_gla(a["q"], a["k"], a["v"], a["g"],
                                              initial_state=a["h0"], output_final_state=True,
                                              chunk_size=16)
        ref = lambda a: reference(a["q"], a["k"], a["v"], g=a["g"], h0=a["h0"])
    else:
        names = ["q", "k", "v", "g", "h0"]
        ours = lambda a: fla.fused_recurrent_simple_gla(a["q"], a["k"], a["v"], a["g"],
                                                        initial_state=a["h0"],
                                                        output_final_state=True, cu_seqlens=cu)
        ref = lambda a: reference(a["q"], a["k"], a["v"], g=a["g"], h0=a["h0"], cu=cu)
    got = _grads(ours, x, names)
    want = _grads(ref, {n: t.double() for n, t in x.items()}, names)
    for name in names:
        assert _rel(got[name], want[name]) <= 1e-4, name


def test_g_gamma_gradient_flows_through_the_broadcast():
    x = _inputs(6, HV=2)
    gamma = torch.tensor([-0.2, -0.7], requires_grad=True)
    o, _ = fla.chunk_simple_gla(x["q"], x["k"], x["v"], g_gamma=gamma)
    o.sum().backward()
    gamma64 = gamma.detach().double().requires_grad_()
    ro, _ = reference(x["q"], x["k"], x["v"], g=gamma64.expand(2, 37, 2))
    ro.sum().backward()
    assert _rel(gamma.grad, gamma64.grad) <= 1e-4


def test_compiles_without_graph_break():
    x = _inputs(7)
    compiled = torch.compile(lambda q, k, v, g: fla.chunk_gla(q, k, v, g)[0], fullgraph=True)
    eager = fla.chunk_gla(x["q"], x["k"], x["v"], x["gk"])[0]
    assert torch.equal(compiled(x["q"], x["k"], x["v"], x["gk"]), eager)


def test_jax_arrays_and_grad():
    jax = pytest.importorskip("jax")
    x = _inputs(8, B=1)
    arrays = {name: jax.numpy.asarray(t.numpy()) for name, t in x.items()}

    def loss(q, gk):
        o, _ = fla.chunk_gla(q, arrays["k"], arrays["v"], gk, initial_state=arrays["h0"])
        return (o * o).sum()

    dq, dgk = jax.grad(loss, argnums=(0, 1))(arrays["q"], arrays["gk"])
    q64 = x["q"].double().requires_grad_()
    gk64 = x["gk"].double().requires_grad_()
    ro, _ = reference(q64, x["k"], x["v"], gk=gk64, h0=x["h0"])
    (ro * ro).sum().backward()
    assert _rel(np.asarray(dq), q64.grad) <= 1e-4 and _rel(np.asarray(dgk), gk64.grad) <= 1e-4


@pytest.mark.parametrize("call, words", [
    (lambda x: fla.chunk_simple_gla(x["q"], x["k"], x["v"], g_gamma=torch.zeros(3)),
     "g_gamma"),
    (lambda x: fla.chunk_gla(x["q"], x["k"], x["v"], x["gk"], cu_seqlens=CU), "batch size"),
    (lambda x: fla.chunk_simple_gla(x["q"], x["k"], x["v"], x["g"], chunk_size=24),
     "power of 2"),
    (lambda x: fla.fused_recurrent_gla(x["q"], x["k"], x["v"], x["gk"], beta=x["g"]), "beta"),
    (lambda x: fla.chunk_gla(x["q"], x["k"], x["v"], x["gk"][:, :, :, :5]), "g"),
])
def test_bad_arguments_are_refused_by_name(call, words):
    x = _inputs(10)
    with pytest.raises((ValueError, TypeError)) as info:
        call(x)
    assert words in str(info.value)
