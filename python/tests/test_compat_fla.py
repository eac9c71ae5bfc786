"""linseq.compat.fla: fla-core's chunk_kda, fused_recurrent_kda, chunk_gated_delta_rule and
fused_recurrent_gated_delta_rule, argument by argument, against float64 definitions.

Modelled on what fla's own KDA / Gated DeltaNet tests vary (dtypes, grouped value heads,
varlen, initial states, the gate in the kernel, beta logits, negative eigenvalues, the state
layout), forward and backward. The references are tests/naive.py (KDA, per head or per
channel decay, the gates) and `delta_rule` here for what naive lacks: decays per head, per
key and per value channel together, and one beta per value channel.
"""

import warnings

import numpy as np
import pytest

from conftest import require
import naive

torch = require("torch")
F = torch.nn.functional
fla = pytest.importorskip("linseq.compat.fla")
import linseq  # noqa: E402

# relative to the largest reference element: float32 kernels, outputs and gradients rounded
# to the inputs' dtype
TOL = {torch.float32: 2e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def delta_rule(q, k, v, beta, *, g=None, gk=None, gv=None, scale=None, h0=None,
               cu_seqlens=None):
    """The gated delta rule in float64, token by token: S <- diag-decay(S) with the log decay
    g[h] + gk[h,i] + gv[h,j] of entry (i,j); S[:,j] += beta[h(,j)] k (v_j - k.S[:,j]);
    o = S^T q * scale. q, k [B,T,H,K] shared by HV/H value heads; beta [B,T,HV(,V)]."""
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    q = (q.double() * (K ** -0.5 if scale is None else scale)).repeat_interleave(HV // H, 2)
    k = k.double().repeat_interleave(HV // H, 2)
    v, beta = v.double(), beta.double()
    spans = ([(b, 0, T) for b in range(B)] if cu_seqlens is None else
             [(0, int(cu_seqlens[n]), int(cu_seqlens[n + 1])) for n in range(len(cu_seqlens) - 1)])
    out = torch.zeros(B, T, HV, V, dtype=torch.float64)
    finals = []
    for n, (b, start, end) in enumerate(spans):
        S = torch.zeros(HV, K, V, dtype=torch.float64) if h0 is None else h0[n].double()
        for t in range(start, end):
            log_decay = torch.zeros(HV, K, V, dtype=torch.float64)
            if g is not None:
                log_decay = log_decay + g[b, t].double()[:, None, None]
            if gk is not None:
                log_decay = log_decay + gk[b, t].double()[:, :, None]
            if gv is not None:
                log_decay = log_decay + gv[b, t].double()[:, None, :]
            S = S * torch.exp(log_decay)
            bt = beta[b, t] if beta.dim() == 4 else beta[b, t][:, None]
            u = bt * (v[b, t] - torch.einsum("hkv,hk->hv", S, k[b, t]))
            S = S + k[b, t][:, :, None] * u[:, None, :]
            out = out.index_put((torch.tensor([b]), torch.tensor([t])),
                                torch.einsum("hkv,hk->hv", S, q[b, t])[None])
        finals.append(S)
    return out, torch.stack(finals)


def gdn_gate(g, A_log, dt_bias):
    """Gated DeltaNet's per head gate, float64: -exp(A_log) * softplus(g + dt_bias)."""
    return -torch.exp(A_log.double().reshape(-1)) * F.softplus(g.double() + dt_bias.double())


def compare(name, got, want, tol):
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, (name, got.shape, want.shape)
    scale = max(want.abs().max().item(), 1e-30)
    err = (got - want).abs().max().item() / scale
    assert err <= tol, f"{name}: max error {err:.3g} of its largest element (tolerance {tol})"


def check(call, reference, inputs, tol, *, with_state=True):
    """Forward and backward of `call` (the function under test on the given leaves) against
    `reference` (float64 on float64 copies of the same values): o, the final state and the
    gradient of every leaf of sum(o * do) + sum(ht * dht)."""
    leaves = {n: x.detach().clone().requires_grad_(True) for n, x in inputs.items()
              if x is not None}
    refs = {n: x.detach().double().requires_grad_(True) for n, x in leaves.items()}
    o, ht = call(**leaves)
    ro, rht = reference(**refs)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(ro.shape, generator=gen, dtype=torch.float64)
    loss = (o.double() * do).sum()
    rloss = (ro * do).sum()
    if with_state:
        dht = torch.randn(rht.shape, generator=gen, dtype=torch.float64)
        loss = loss + (ht.double() * dht).sum()
        rloss = rloss + (rht * dht).sum()
        compare("final_state", ht, rht, tol)
        assert ht.dtype == torch.float32
    compare("o", o, ro, tol)
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names])
    rgrads = torch.autograd.grad(rloss, [refs[n] for n in names])
    for n, got, want in zip(names, grads, rgrads):
        compare("d" + n, got, want, tol)
    return o, ht


def kda_inputs(B=2, T=37, H=2, HV=2, K=8, V=6, dtype=torch.float32, per_channel=True,
               seed=0, h0=True, varlen=False):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)
    if varlen:
        B = 1
    g_shape = (B, T, HV, K) if per_channel else (B, T, HV)
    n_state = 3 if varlen else B
    a = dict(q=rnd(B, T, H, K).to(dtype), k=rnd(B, T, H, K).to(dtype),
             v=rnd(B, T, HV, V).to(dtype),
             g=F.logsigmoid(rnd(*g_shape)).to(dtype),
             beta=torch.rand(B, T, HV, generator=gen).to(dtype),
             initial_state=rnd(n_state, HV, K, V) if h0 else None)
    a["k"] = F.normalize(a["k"].float(), dim=-1).to(dtype)
    return a


CU = torch.tensor([0, 11, 11, 37])   # three sequences, one empty


# ------------------------------------------------------------------------------------------
# KDA: chunk_kda and fused_recurrent_kda
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", ["chunk_kda", "fused_recurrent_kda"])
@pytest.mark.parametrize("heads,varlen", [((2, 2), False), ((1, 4), False), ((2, 4), True)])
def test_kda_matches_float64(dtype, fn, heads, varlen):
    H, HV = heads
    a = kda_inputs(H=H, HV=HV, dtype=dtype, varlen=varlen)
    cu = CU if varlen else None
    f = getattr(fla, fn)

    def call(**x):
        return f(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=0.4,
                 initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu,
                 use_qk_l2norm_in_kernel=True)

    def ref(**x):
        return naive.kda(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=0.4,
                         h0=x["initial_state"], l2=True, cu_seqlens=cu)
    o, _ = check(call, ref, a, TOL[dtype])
    # fla's output dtypes: the chunked form answers in q's dtype, the recurrent one in v's
    assert o.dtype == dtype


@pytest.mark.parametrize("fn", ["chunk_kda", "fused_recurrent_kda"])
@pytest.mark.parametrize("lower_bound", [None, -3.0])
def test_kda_gate_in_kernel(fn, lower_bound):
    a = kda_inputs(HV=4, H=2)
    gen = torch.Generator().manual_seed(1)
    # A_log of any shape with HV elements, as fla's tests pass it
    a["A_log"] = torch.randn(1, 1, 4, 1, generator=gen)
    a["dt_bias"] = torch.randn(4 * 8, generator=gen)
    a["g"] = torch.randn(a["g"].shape, generator=gen)
    f = getattr(fla, fn)

    def call(**x):
        return f(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                 dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                 output_final_state=True, use_gate_in_kernel=True, lower_bound=lower_bound)

    def ref(**x):
        return naive.kda(x["q"], x["k"], x["v"], x["g"], x["beta"], h0=x["initial_state"],
                         gate_in_kernel=True, A_log=x["A_log"].reshape(-1),
                         dt_bias=x["dt_bias"], lower_bound=lower_bound)
    check(call, ref, a, TOL[torch.float32])


@pytest.mark.parametrize("fn", ["chunk_kda", "fused_recurrent_kda"])
def test_kda_lower_bound_gate_without_A_log(fn):
    """With lower_bound, A_log may be None: the gate is lower_bound * sigmoid(g + dt_bias)."""
    a = kda_inputs()
    a["g"] = torch.randn(a["g"].shape)
    bias = torch.randn(2 * 8)
    f = getattr(fla, fn)
    got, _ = f(a["q"], a["k"], a["v"], a["g"], a["beta"], dt_bias=bias, lower_bound=-2.0,
               use_gate_in_kernel=True)
    want, _ = naive.kda(a["q"], a["k"], a["v"], -2.0 * torch.sigmoid(a["g"].double() +
                                                                      bias.double().view(2, 8)),
                        a["beta"])
    compare("o", got, want, TOL[torch.float32])
    with pytest.raises(ValueError, match="A_log"):
        f(a["q"], a["k"], a["v"], a["g"], a["beta"], use_gate_in_kernel=True)


def test_kda_lower_bound_unused_without_the_gate():
    """fla reads lower_bound (and A_log, dt_bias) only with the gate in the kernel; its tests
    pass lower_bound=-5 with safe_gate and a precomputed decay."""
    a = kda_inputs(h0=False)
    plain, _ = fla.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"])
    for f in (fla.chunk_kda, fla.fused_recurrent_kda):
        got, _ = f(a["q"], a["k"], a["v"], a["g"], a["beta"], lower_bound=-5.0,
                   A_log=torch.zeros(2), dt_bias=torch.zeros(16), safe_gate=True)
        compare("o", got, plain, TOL[torch.float32])


@pytest.mark.parametrize("fn", ["chunk_kda", "fused_recurrent_kda"])
def test_kda_beta_logits_and_negative_eigenvalues(fn):
    a = kda_inputs(HV=4, H=2)
    a["beta"] = torch.randn(a["beta"].shape) * 2
    f = getattr(fla, fn)
    for neg in (False, True):
        def call(**x):
            return f(x["q"], x["k"], x["v"], x["g"], x["beta"],
                     initial_state=x["initial_state"], output_final_state=True,
                     use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg)

        def ref(**x):
            beta = torch.sigmoid(x["beta"]) * (2 if neg else 1)
            return naive.kda(x["q"], x["k"], x["v"], x["g"], beta, h0=x["initial_state"])
        check(call, ref, a, TOL[torch.float32])
    with pytest.raises(ValueError, match="allow_neg_eigval"):
        f(a["q"], a["k"], a["v"], a["g"], a["beta"], allow_neg_eigval=True)


@pytest.mark.parametrize("state_v_first", [False, True])
def test_fused_recurrent_kda_beta_per_value_channel(state_v_first):
    """fla's recurrent KDA kernel also takes beta [B,T,HV,V]; here with the gate in the
    kernel (then computed by linseq's gate op before the per value channel heads)."""
    a = kda_inputs(H=1, HV=2, varlen=True)
    gen = torch.Generator().manual_seed(4)
    a["beta"] = torch.rand(1, 37, 2, 6, generator=gen)
    a["g"] = torch.randn(a["g"].shape, generator=gen)
    a["A_log"] = torch.randn(2, generator=gen)
    a["dt_bias"] = torch.randn(2, 8, generator=gen)
    if state_v_first:
        a["initial_state"] = a["initial_state"].transpose(-1, -2).contiguous()

    def call(**x):
        return fla.fused_recurrent_kda(
            x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"],
            initial_state=x["initial_state"], output_final_state=True,
            use_gate_in_kernel=True, state_v_first=state_v_first, cu_seqlens=CU)

    def ref(**x):
        gk = -torch.exp(x["A_log"])[:, None] * F.softplus(x["g"] + x["dt_bias"])
        h0 = x["initial_state"].transpose(-1, -2) if state_v_first else x["initial_state"]
        o, ht = delta_rule(x["q"], x["k"], x["v"], x["beta"], gk=gk, h0=h0, cu_seqlens=CU)
        return o, (ht.transpose(-1, -2) if state_v_first else ht)
    check(call, ref, a, TOL[torch.float32])


def test_fused_recurrent_kda_positional_order():
    """fla's order: (q, k, v, g, beta, A_log, dt_bias, scale, initial_state,
    output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
    use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first, cu_seqlens)."""
    a = kda_inputs(varlen=True)
    A_log, bias = torch.randn(2), torch.randn(16)
    g_raw = torch.randn(a["g"].shape)
    logits = torch.randn(a["beta"].shape)
    h0_vk = a["initial_state"].transpose(-1, -2).contiguous()
    o, ht = fla.fused_recurrent_kda(a["q"], a["k"], a["v"], g_raw, logits, A_log, bias, 0.3,
                                    h0_vk, True, True, True, True, True, -4.0, True, CU)
    want, want_h = naive.kda(a["q"], a["k"], a["v"], g_raw, 2 * torch.sigmoid(logits.double()),
                             scale=0.3, h0=h0_vk, l2=True, gate_in_kernel=True, A_log=A_log,
                             dt_bias=bias, lower_bound=-4.0, cu_seqlens=CU, state_v_first=True)
    compare("o", o, want, TOL[torch.float32])
    compare("ht", ht, want_h, TOL[torch.float32])


def test_chunk_kda_positional_order():
    """fla's order: (q, k, v, g, beta, scale, initial_state, output_final_state,
    use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
    allow_neg_eigval, safe_gate, lower_bound, disable_recompute, return_intermediate_states,
    state_v_first, cu_seqlens, cu_seqlens_cpu, cp_context)."""
    a = kda_inputs(varlen=True)
    A_log, bias = torch.randn(2), torch.randn(16)
    g_raw = torch.randn(a["g"].shape)
    logits = torch.randn(a["beta"].shape)
    h0_vk = a["initial_state"].transpose(-1, -2).contiguous()
    o, ht = fla.chunk_kda(a["q"], a["k"], a["v"], g_raw, logits, 0.3, h0_vk, True, True, True,
                          True, True, True, -4.0, True, False, True, CU, CU, None,
                          A_log=A_log, dt_bias=bias, chunk_size=16)
    want, want_h = naive.kda(a["q"], a["k"], a["v"], g_raw, 2 * torch.sigmoid(logits.double()),
                             scale=0.3, h0=h0_vk, l2=True, gate_in_kernel=True, A_log=A_log,
                             dt_bias=bias, lower_bound=-4.0, cu_seqlens=CU, state_v_first=True)
    compare("o", o, want, TOL[torch.float32])
    compare("ht", ht, want_h, TOL[torch.float32])


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("state_v_first", [False, True])
def test_chunk_kda_intermediate_states(varlen, state_v_first):
    """h[b, i] is the state before chunk i (h[:, 0] the initial state), in k's dtype; with
    cu_seqlens the chunks of every sequence in turn (an empty sequence has none)."""
    a = kda_inputs(varlen=varlen, dtype=torch.bfloat16)
    C = 16
    h0 = a["initial_state"]
    if state_v_first:
        h0 = h0.transpose(-1, -2).contiguous()
    with torch.inference_mode():
        o, ht, h = fla.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=h0,
                                 output_final_state=True, return_intermediate_states=True,
                                 state_v_first=state_v_first,
                                 cu_seqlens=CU if varlen else None, chunk_size=C)
    assert h.dtype == torch.bfloat16
    spans = ([(0, int(CU[n]), int(CU[n + 1])) for n in range(3)] if varlen else
             [(b, 0, 37) for b in range(2)])
    want = []
    for n, (b, start, end) in enumerate(spans):
        for s in range(start, end, C):
            if s == start:
                want.append(h0[n])
                continue
            x = {key: a[key][b:b + 1, start:s] for key in ("q", "k", "v", "g", "beta")}
            _, state = naive.kda(x["q"], x["k"], x["v"], x["g"], x["beta"], h0=h0[n:n + 1],
                                 state_v_first=state_v_first)
            want.append(state[0])
    if varlen:
        assert h.shape == ((1, 3, 2, 6, 8) if state_v_first else (1, 3, 2, 8, 6))
        got = [h[0, i] for i in range(h.shape[1])]
    else:
        assert h.shape[:2] == (2, 3)
        got = [h[b, i] for b in range(2) for i in range(3)]
    assert len(got) == len(want)
    for i, (x, w) in enumerate(zip(got, want)):
        compare(f"h[{i}]", x, w, TOL[torch.bfloat16])


def test_transpose_state_layout_is_deprecated_state_v_first():
    a = kda_inputs()
    h0_vk = a["initial_state"].transpose(-1, -2).contiguous()
    want = fla.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=h0_vk,
                         output_final_state=True, state_v_first=True)
    for f in (fla.chunk_kda, fla.fused_recurrent_kda, fla.chunk_gated_delta_rule,
              fla.fused_recurrent_gated_delta_rule):
        g = a["g"] if f in (fla.chunk_kda, fla.fused_recurrent_kda) else a["g"][..., 0]
        with pytest.warns(DeprecationWarning, match="state_v_first"):
            o, ht = f(a["q"], a["k"], a["v"], g, beta=a["beta"], initial_state=h0_vk,
                      output_final_state=True, transpose_state_layout=True)
        assert ht.shape == h0_vk.shape
        if f is fla.chunk_kda:
            compare("o", o, want[0], 1e-6)
            compare("ht", ht, want[1], 1e-6)
        with pytest.raises(ValueError, match="transpose_state_layout"):
            f(a["q"], a["k"], a["v"], g, beta=a["beta"], state_v_first=True,
              transpose_state_layout=True)


@pytest.mark.parametrize("fn", ["chunk_kda", "fused_recurrent_kda", "chunk_gated_delta_rule",
                                "fused_recurrent_gated_delta_rule"])
def test_accepted_unused_and_refused_keywords(fn):
    a = kda_inputs(varlen=True)
    f = getattr(fla, fn)
    g = a["g"] if "kda" in fn else a["g"][..., 0]
    args = (a["q"], a["k"], a["v"], g)
    plain, _ = f(*args, beta=a["beta"], cu_seqlens=CU)
    unused = dict(safe_gate=False, disable_recompute=True, cu_seqlens_cpu=CU,
                  chunk_indices=torch.tensor([[0, 0]]), cp_context=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, _ = f(*args, beta=a["beta"], cu_seqlens=CU, **unused)
    assert torch.equal(got, plain)
    with pytest.raises(NotImplementedError, match="cp_context"):
        f(*args, beta=a["beta"], cp_context=object())
    with pytest.raises(TypeError, match="not_an_fla_argument"):
        f(*args, beta=a["beta"], not_an_fla_argument=1)
    with pytest.raises(TypeError, match="head_first"):
        f(*args, beta=a["beta"], head_first=False)


def test_chunk_sizes_fla_refuses_are_accepted():
    a = kda_inputs(h0=False)
    want, _ = naive.kda(a["q"], a["k"], a["v"], a["g"], a["beta"])
    for C in (16, 128):   # fla's chunk_kda takes 32 and 64 only
        got, _ = fla.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], chunk_size=C)
        compare("o", got, want, TOL[torch.float32])
    with pytest.raises(ValueError, match="chunk_size"):
        fla.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], chunk_size=48)


def test_safe_gate_checks_of_fla():
    a = kda_inputs(h0=False)
    kw = dict(use_gate_in_kernel=True, A_log=torch.zeros(2), safe_gate=True)
    with pytest.raises(ValueError, match="lower_bound"):
        fla.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **kw)
    with pytest.raises(ValueError, match="lower_bound"):
        fla.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], lower_bound=-6.0, **kw)


def test_linseq_names_are_the_compat_functions():
    assert linseq.chunk_kda is fla.chunk_kda
    assert linseq.fused_recurrent_kda is fla.fused_recurrent_kda


def test_numpy_arrays_with_the_flags_done_outside_the_kernel():
    """The NumPy path of the same functions: negative eigenvalues and per value channel beta
    (computed around the kernel in NumPy)."""
    a = kda_inputs(h0=False)
    n = {key: x.numpy() for key, x in a.items() if x is not None}
    logits = np.random.default_rng(0).standard_normal(n["beta"].shape).astype(np.float32)
    o, _ = fla.chunk_kda(n["q"], n["k"], n["v"], n["g"], logits,
                         use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    want, _ = naive.kda(a["q"], a["k"], a["v"], a["g"],
                        2 * torch.sigmoid(torch.from_numpy(logits).double()))
    assert isinstance(o, np.ndarray)
    compare("o", torch.from_numpy(o), want, TOL[torch.float32])
    beta_v = np.random.default_rng(1).random(n["v"].shape).astype(np.float32)
    o, _ = fla.fused_recurrent_kda(n["q"], n["k"], n["v"], n["g"], beta_v)
    want, _ = delta_rule(a["q"], a["k"], a["v"], torch.from_numpy(beta_v), gk=a["g"])
    compare("o", torch.from_numpy(o), want, TOL[torch.float32])


# ------------------------------------------------------------------------------------------
# Gated DeltaNet: chunk_gated_delta_rule and fused_recurrent_gated_delta_rule
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"])
@pytest.mark.parametrize("heads,varlen", [((2, 2), False), ((1, 4), True)])
def test_gdn_matches_float64(dtype, fn, heads, varlen):
    H, HV = heads
    a = kda_inputs(H=H, HV=HV, dtype=dtype, per_channel=False, varlen=varlen)
    cu = CU if varlen else None
    f = getattr(fla, fn)

    def call(**x):
        return f(x["q"], x["k"], x["v"], x["g"], beta=x["beta"],
                 initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu)

    def ref(**x):
        return naive.kda(x["q"], x["k"], x["v"], x["g"], x["beta"], h0=x["initial_state"],
                         cu_seqlens=cu)
    o, _ = check(call, ref, a, TOL[dtype])
    assert o.dtype == dtype


@pytest.mark.parametrize("fn", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"])
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_gdn_gate_in_kernel(fn, chunk_size):
    """-exp(A_log) * softplus(g + dt_bias) per head, A_log given as [1,1,HV,1] as in fla's
    tests; its gradient comes back in that shape."""
    a = kda_inputs(H=1, HV=4, per_channel=False, varlen=True)
    gen = torch.Generator().manual_seed(3)
    a["g"] = torch.randn(a["g"].shape, generator=gen) * 2
    a["A_log"] = torch.randn(1, 1, 4, 1, generator=gen)
    a["dt_bias"] = torch.randn(4, generator=gen)
    f = getattr(fla, fn)
    extra = {} if "recurrent" in fn else dict(chunk_size=chunk_size)

    def call(**x):
        return f(x["q"], x["k"], x["v"], x["g"], beta=x["beta"], A_log=x["A_log"],
                 dt_bias=x["dt_bias"], use_gate_in_kernel=True,
                 initial_state=x["initial_state"], output_final_state=True, cu_seqlens=CU,
                 **extra)

    def ref(**x):
        return naive.kda(x["q"], x["k"], x["v"], gdn_gate(x["g"], x["A_log"], x["dt_bias"]),
                         x["beta"], h0=x["initial_state"], cu_seqlens=CU)
    check(call, ref, a, TOL[torch.float32])


@pytest.mark.parametrize("terms", ["gk", "gv", "g+gk", "g+gv", "gk+gv", "g+gk+gv", "none"])
@pytest.mark.parametrize("beta_per_value", [False, True])
def test_gdn_recurrent_decays_per_key_and_value_channel(terms, beta_per_value):
    a = kda_inputs(H=1, HV=2, per_channel=False, varlen=True)
    B, T, HV, K, V = 1, 37, 2, 8, 6
    gen = torch.Generator().manual_seed(5)
    parts = terms.split("+")
    a["g"] = a["g"] if "g" in parts else None
    a["gk"] = (F.logsigmoid(torch.randn(B, T, HV, K, generator=gen)) if "gk" in parts
               else None)
    a["gv"] = (F.logsigmoid(torch.randn(B, T, HV, V, generator=gen)) if "gv" in parts
               else None)
    if beta_per_value:
        a["beta"] = torch.rand(B, T, HV, V, generator=gen)

    def call(**x):
        return fla.fused_recurrent_gated_delta_rule(
            x["q"], x["k"], x["v"], x.get("g"), x.get("gk"), x.get("gv"), x["beta"],
            initial_state=x["initial_state"], output_final_state=True, cu_seqlens=CU)

    def ref(**x):
        return delta_rule(x["q"], x["k"], x["v"], x["beta"], g=x.get("g"), gk=x.get("gk"),
                          gv=x.get("gv"), h0=x["initial_state"], cu_seqlens=CU)
    check(call, ref, a, TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gdn_recurrent_everything_at_once_positional(dtype):
    """The gate in the kernel with gk and gv, per value channel beta logits with negative
    eigenvalues, l2 norm, the state [V,K]-first, grouped value heads: by position, in fla's
    order (q, k, v, g, gk, gv, beta, scale, initial_state, output_final_state,
    use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
    allow_neg_eigval, state_v_first, cu_seqlens)."""
    B, T, H, HV, K, V = 2, 23, 1, 2, 8, 4
    gen = torch.Generator().manual_seed(9)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)
    a = dict(q=rnd(B, T, H, K).to(dtype), k=rnd(B, T, H, K).to(dtype),
             v=rnd(B, T, HV, V).to(dtype), g=rnd(B, T, HV).to(dtype),
             gk=F.logsigmoid(rnd(B, T, HV, K)).to(dtype), gv=F.logsigmoid(rnd(B, T, HV, V)),
             beta=rnd(B, T, HV, V).to(dtype), h0=rnd(B, HV, V, K), A_log=rnd(HV) * 0.5,
             dt_bias=rnd(HV))

    def call(**x):
        return fla.fused_recurrent_gated_delta_rule(
            x["q"], x["k"], x["v"], x["g"], x["gk"], x["gv"], x["beta"], 0.5, x["h0"], True,
            True, True, x["A_log"], x["dt_bias"], True, True, True, None)

    def ref(**x):
        q = x["q"] / torch.sqrt((x["q"] ** 2).sum(-1, keepdim=True) + 1e-6)
        k = x["k"] / torch.sqrt((x["k"] ** 2).sum(-1, keepdim=True) + 1e-6)
        o, ht = delta_rule(q, k, x["v"], 2 * torch.sigmoid(x["beta"]),
                           g=gdn_gate(x["g"], x["A_log"], x["dt_bias"]), gk=x["gk"],
                           gv=x["gv"], scale=0.5, h0=x["h0"].transpose(-1, -2))
        return o, ht.transpose(-1, -2)
    o, ht = check(call, ref, a, TOL[dtype])
    assert o.dtype == dtype and ht.shape == (B, HV, V, K)


def test_gdn_beta_none_is_ones():
    """fla's default beta is ones (read through the beta flags: sigmoid(1) with logits)."""
    a = kda_inputs(per_channel=False)
    for logits in (False, True):
        o, ht = fla.fused_recurrent_gated_delta_rule(
            a["q"], a["k"], a["v"], a["g"], initial_state=a["initial_state"],
            output_final_state=True, use_beta_sigmoid_in_kernel=logits)
        beta = torch.full(a["beta"].shape, torch.sigmoid(torch.tensor(1.0)).item()
                          if logits else 1.0, dtype=torch.float64)
        want, want_h = naive.kda(a["q"], a["k"], a["v"], a["g"], beta, h0=a["initial_state"])
        compare("o", o, want, TOL[torch.float32])
        compare("ht", ht, want_h, TOL[torch.float32])


def test_gdn_chunk_beta_logits_negative_eigenvalues():
    a = kda_inputs(H=1, HV=2, per_channel=False)
    a["beta"] = torch.randn(a["beta"].shape)

    def call(**x):
        return fla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], None,
                                          x["initial_state"], True, False, True, True)

    def ref(**x):
        return naive.kda(x["q"], x["k"], x["v"], x["g"], 2 * torch.sigmoid(x["beta"]),
                         h0=x["initial_state"])
    check(call, ref, a, TOL[torch.float32])


@pytest.mark.parametrize("fn", ["chunk_kda", "fused_recurrent_kda", "chunk_gated_delta_rule",
                                "fused_recurrent_gated_delta_rule"])
def test_the_calls_fla_layers_make(fn):
    """The keywords fla's KimiDeltaAttention and GatedDeltaNet layers pass (gate, beta logits
    and negative eigenvalues in the kernel, l2 norm, [V,K] states, varlen)."""
    kda = "kda" in fn
    a = kda_inputs(H=1, HV=2, varlen=True, per_channel=kda)
    gen = torch.Generator().manual_seed(11)
    a["g"] = torch.randn(a["g"].shape, generator=gen)
    a["beta"] = torch.randn(a["beta"].shape, generator=gen)
    a["A_log"] = torch.randn(2, generator=gen)
    a["dt_bias"] = torch.randn(2 * 8 if kda else 2, generator=gen)
    a["initial_state"] = a["initial_state"].transpose(-1, -2).contiguous()
    extra = dict(safe_gate=True, lower_bound=-5.0) if fn == "chunk_kda" else {}
    if fn == "fused_recurrent_kda":
        extra = dict(lower_bound=-5.0)

    def call(**x):
        return getattr(fla, fn)(
            q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], A_log=x["A_log"],
            dt_bias=x["dt_bias"], initial_state=x["initial_state"], output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, state_v_first=True,
            cu_seqlens=CU, **extra)

    def ref(**x):
        return naive.kda(x["q"], x["k"], x["v"], x["g"], 2 * torch.sigmoid(x["beta"]),
                         h0=x["initial_state"], l2=True, gate_in_kernel=True,
                         A_log=x["A_log"], dt_bias=x["dt_bias"],
                         lower_bound=-5.0 if kda else None, cu_seqlens=CU, state_v_first=True)
    check(call, ref, a, TOL[torch.float32])


@pytest.mark.parametrize("lower_bound,with_A", [(None, True), (-5.0, True), (-5.0, False)])
def test_fused_kda_gate(lower_bound, with_A):
    """fla's gate helper: g [..., H, K] with any leading dimensions, A_log of H elements,
    dt_bias [H*K]; forward and gradients against float64."""
    gen = torch.Generator().manual_seed(2)
    a = dict(g=torch.randn(2, 3, 5, 4, 6, generator=gen),
             A_log=torch.randn(1, 1, 4, 1, generator=gen) if with_A else None,
             dt_bias=torch.randn(24, generator=gen))

    def call(**x):
        return fla.fused_kda_gate(x["g"], x.get("A_log"), x["dt_bias"], lower_bound), None

    def ref(**x):
        a_exp = torch.exp(x["A_log"].reshape(4, 1)) if with_A else 1.0
        z = x["g"] + x["dt_bias"].reshape(4, 6)
        if lower_bound is None:
            return -a_exp * F.softplus(z), None
        return lower_bound * torch.sigmoid(a_exp * z), None
    check(call, ref, a, TOL[torch.float32], with_state=False)
    with pytest.raises(ValueError, match="A_log"):
        fla.fused_kda_gate(a["g"], None, a["dt_bias"])


def test_fused_gdn_gate():
    gen = torch.Generator().manual_seed(6)
    a = dict(g=torch.randn(2, 7, 3, generator=gen).to(torch.bfloat16),
             A_log=torch.randn(3, generator=gen), dt_bias=torch.randn(3, generator=gen))

    def call(**x):
        return fla.fused_gdn_gate(x["g"], x["A_log"], x["dt_bias"]), None

    def ref(**x):
        return gdn_gate(x["g"], x["A_log"], x["dt_bias"]), None
    check(call, ref, a, TOL[torch.bfloat16], with_state=False)
    assert fla.fused_gdn_gate(a["g"], a["A_log"], output_dtype=torch.bfloat16).dtype == \
        torch.bfloat16
