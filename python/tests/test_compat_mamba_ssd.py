"""linseq.compat.mamba_ssd.mamba_chunk_scan_combined against mamba-ssm's definition of the
Mamba2 scan (its docstring and the paper's recurrence, written here in float64 PyTorch, token
by token): outputs, final and per-sequence states, and every gradient through autograd, over
its arguments (groups, D per head or channel, z, dt_bias with and without softplus, dt_limit,
initial_states, seq_idx over several rows, return_varlen_states).

mamba_split_conv1d_scan_combined, the fused mixer, against mamba-ssm's documented definition
written the same way (the split of zxbcdt, the causal depthwise conv tap by tap, the scan
above, the gated RMSNorm per group of dim / ngroups channels before or after the gate, the
SwiGLU of the extra columns, the output projection): outputs, final states and the gradient
of every tensor argument, over both norm_before_gate values, with and without the RMSNorm
and projection weights, seq_idx, initial_states and dt_limit."""
import math

import pytest

from conftest import require

torch = require("torch")
from linseq.compat.mamba_ssd import (mamba_chunk_scan_combined,  # noqa: E402
                                     mamba_split_conv1d_scan_combined)


def reference(x, dt, A, B, C, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
              dt_softplus=False, dt_limit=(0.0, math.inf)):
    """(out, final states, the state after every token) in float64: per row and head,
    S = exp(dt A) S + dt x B^T, y = S C + D x, y *= silu(z); the state restarts from zeros
    where seq_idx changes along a row."""
    x, dt, A, B, C = (t.double() for t in (x, dt, A, B, C))
    batch, seqlen, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    heads_per_group = H // G
    dt = dt + dt_bias.double() if dt_bias is not None else dt
    dt = torch.nn.functional.softplus(dt) if dt_softplus else dt
    if tuple(dt_limit) != (0.0, math.inf):
        dt = dt.clamp(dt_limit[0], dt_limit[1])
    outs, finals, after = [], [], {}
    for b in range(batch):
        S = (initial_states[b].double() if initial_states is not None
             else torch.zeros(H, P, N, dtype=torch.float64))
        rows = []
        for t in range(seqlen):
            if seq_idx is not None and t > 0 and seq_idx[b, t] != seq_idx[b, t - 1]:
                S = torch.zeros(H, P, N, dtype=torch.float64)
            Bt = B[b, t].repeat_interleave(heads_per_group, 0)     # [H, N]
            Ct = C[b, t].repeat_interleave(heads_per_group, 0)
            decay = torch.exp(dt[b, t] * A).reshape(H, 1, 1)
            S = decay * S + (dt[b, t].reshape(H, 1) * x[b, t]).unsqueeze(-1) * Bt.unsqueeze(1)
            y = (S * Ct.unsqueeze(1)).sum(-1)
            if D is not None:
                y = y + (D.double() if D.dim() == 2 else D.double().reshape(H, 1)) * x[b, t]
            if z is not None:
                y = y * torch.nn.functional.silu(z[b, t].double())
            rows.append(y)
            after[(b, t)] = S
        outs.append(torch.stack(rows))
        finals.append(S)
    return torch.stack(outs), torch.stack(finals), after


def make(seed, batch=2, seqlen=45, H=4, P=8, G=2, N=4, D_shape="head", z=True, softplus=True):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    a = dict(x=r(batch, seqlen, H, P), A=-torch.rand(H, generator=g) * 3 - 0.5,
             B=r(batch, seqlen, G, N), C=r(batch, seqlen, G, N),
             dt=(r(batch, seqlen, H) - 2.5) if softplus else torch.rand(batch, seqlen, H,
                                                                         generator=g) * 0.2,
             dt_bias=r(H) * 0.5, initial_states=r(batch, H, P, N) * 0.5)
    a["D"] = r(H, P) if D_shape == "channel" else r(H)
    if z:
        a["z"] = r(batch, seqlen, H, P)
    return a


def close(got, want, what, tol=2e-5):
    err = (got.double() - want).abs().max() / max(1.0, want.abs().max().item())
    assert err < tol, f"{what}: {err:.2e}"


@pytest.mark.parametrize("case", ["plain", "channel_D_no_softplus_bias", "limit", "seq_idx"])
def test_matches_the_definition_with_gradients(case):
    a = make(1, D_shape="channel" if case == "channel_D_no_softplus_bias" else "head",
             softplus=case != "channel_D_no_softplus_bias")
    kw = dict(dt_softplus=case != "channel_D_no_softplus_bias")
    if case == "limit":
        kw["dt_limit"] = (0.02, 0.3)
    if case == "seq_idx":
        kw["seq_idx"] = torch.tensor([[0] * 20 + [1] * 25, [0] * 5 + [3] * 40])
    leaves = {k: v.clone().requires_grad_(True) for k, v in a.items()}
    ref_leaves = {k: v.clone().double().requires_grad_(True) for k, v in a.items()}
    out, final = mamba_chunk_scan_combined(chunk_size=256, return_final_states=True, **leaves,
                                           **kw)
    want_out, want_final, _ = reference(**ref_leaves, **kw)
    close(out, want_out.detach(), "out")
    close(final, want_final.detach(), "final_states")
    g = torch.Generator().manual_seed(7)
    d_out, d_final = torch.randn(out.shape, generator=g), torch.randn(final.shape, generator=g)
    ((out * d_out).sum() + (final * d_final).sum()).backward()
    ((want_out * d_out.double()).sum() + (want_final * d_final.double()).sum()).backward()
    for name in leaves:
        close(leaves[name].grad, ref_leaves[name].grad, f"d{name}", tol=1e-4)


def test_varlen_states_and_returns():
    a = make(2, batch=1, seqlen=40, z=False)
    seq_idx = torch.tensor([[0] * 12 + [1] * 28])
    cu = torch.tensor([0, 12, 40])
    out, final, states = mamba_chunk_scan_combined(
        chunk_size=64, seq_idx=seq_idx, cu_seqlens=cu, dt_softplus=True,
        return_final_states=True, return_varlen_states=True, **a)
    want_out, want_final, after = reference(seq_idx=seq_idx, dt_softplus=True, **a)
    close(out, want_out, "out")
    close(final, want_final, "final_states")
    close(states[0], after[(0, 11)], "varlen state 0")
    close(states[1], after[(0, 39)], "varlen state 1")
    only = mamba_chunk_scan_combined(chunk_size=64, dt_softplus=True, **a)
    assert torch.is_tensor(only)
    with pytest.raises(ValueError, match="seq_idx"):
        mamba_chunk_scan_combined(chunk_size=64, cu_seqlens=cu, return_varlen_states=True, **a)
    with pytest.raises(ValueError, match="chunk_size"):
        mamba_chunk_scan_combined(chunk_size=0, **a)


def test_compiles_fullgraph():
    a = make(3, z=True)
    fn = torch.compile(lambda **k: mamba_chunk_scan_combined(chunk_size=128, dt_softplus=True,
                                                             **k), fullgraph=True)
    want = mamba_chunk_scan_combined(chunk_size=128, dt_softplus=True, **a)
    assert torch.equal(fn(**a), want)


# ------------------------------------------------------------------------------------------
# mamba_split_conv1d_scan_combined
# ------------------------------------------------------------------------------------------

def split_reference(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states=None,
                    seq_idx=None, dt_limit=(0.0, math.inf), activation="silu",
                    rmsnorm_weight=None, rmsnorm_eps=1e-6, outproj_weight=None,
                    outproj_bias=None, headdim=None, ngroups=1, norm_before_gate=True):
    """(out, final states) in float64 from mamba-ssm's documented definition: zxbcdt's last
    dim is [zx0 (2 d_nonssm) | z (dim) | xBC (dim + 2 G N) | dt (H)]; xBC goes through the
    causal depthwise conv (a tap reads a token only of the same seq_idx) and silu; the scan
    (reference above) with dt_softplus; then y * silu(z), or the gated RMSNorm over groups
    of dim / ngroups channels; [silu(zx0 first half) * second half, y]; the projection."""
    dbl = lambda t: None if t is None else t.double()  # noqa: E731
    zxbcdt, w, bias, D = dbl(zxbcdt), dbl(conv1d_weight), dbl(conv1d_bias), dbl(D)
    H = D.shape[0]
    P = headdim if D.dim() == 1 else D.shape[1]
    dim, conv_dim, width = H * P, w.shape[0], w.shape[1]
    N = (conv_dim - dim) // (2 * ngroups)
    batch, seqlen, total = zxbcdt.shape
    extra = (total - dim - conv_dim - H) // 2
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * extra, dim, conv_dim, H], dim=-1)
    conv = []
    for t in range(seqlen):
        acc = torch.zeros(batch, conv_dim, dtype=torch.float64) if bias is None \
            else bias.expand(batch, conv_dim)
        for k in range(width):
            s = t - (width - 1) + k          # the tap k reads token s; the newest tap is last
            if s < 0:
                continue
            tap = w[:, k] * xBC[:, s]
            if seq_idx is not None:
                tap = tap * (seq_idx[:, s] == seq_idx[:, t]).double().unsqueeze(-1)
            acc = acc + tap
        conv.append(acc)
    conv = torch.stack(conv, 1)
    if activation is not None:
        conv = conv * torch.sigmoid(conv)
    x, B, C = torch.split(conv, [dim, ngroups * N, ngroups * N], dim=-1)
    zh = z.reshape(batch, seqlen, H, P)
    y, final, _ = reference(x.reshape(batch, seqlen, H, P), dt, A, B.reshape(batch, seqlen,
                            ngroups, N), C.reshape(batch, seqlen, ngroups, N), D=D,
                            z=zh if rmsnorm_weight is None else None, dt_bias=dt_bias,
                            initial_states=initial_states, seq_idx=seq_idx, dt_softplus=True,
                            dt_limit=dt_limit)
    y = y.reshape(batch, seqlen, dim)
    if rmsnorm_weight is not None:
        gate = z * torch.sigmoid(z)
        v = y if norm_before_gate else y * gate
        size = dim // ngroups
        parts = [v[..., i:i + size] / torch.sqrt((v[..., i:i + size] ** 2).mean(-1, True)
                                                 + rmsnorm_eps) for i in range(0, dim, size)]
        y = torch.cat(parts, -1) * rmsnorm_weight.double()
        if norm_before_gate:
            y = y * gate
    if extra:
        a, b = zx0[..., :extra], zx0[..., extra:]
        y = torch.cat([a * torch.sigmoid(a) * b, y], -1)
    if outproj_weight is not None:
        y = y @ outproj_weight.double().T
        if outproj_bias is not None:
            y = y + outproj_bias.double()
    return y, final


def make_mixer(seed, batch=2, seqlen=45, H=4, P=8, G=2, N=4, width=4, extra=0, D_shape="head",
               rmsnorm=True, outproj=True, outproj_bias=True, initial_states=True):
    """The tensor arguments of one call (keyword names as mamba-ssm's) and its headdim."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    dim, conv_dim = H * P, H * P + 2 * G * N
    zxbcdt = r(batch, seqlen, 2 * extra + dim + conv_dim + H)
    zxbcdt[..., -H:] -= 2.0          # dt columns: softplus(dt + dt_bias) near 0.1
    a = dict(zxbcdt=zxbcdt, conv1d_weight=r(conv_dim, width) * 0.5,
             conv1d_bias=r(conv_dim) * 0.2, dt_bias=r(H) * 0.5,
             A=-torch.rand(H, generator=g) * 3 - 0.5, D=r(H, P) if D_shape == "channel" else r(H))
    if initial_states:
        a["initial_states"] = r(batch, H, P, N) * 0.5
    if rmsnorm:
        a["rmsnorm_weight"] = 1 + 0.3 * r(dim)
    if outproj:
        a["outproj_weight"] = r(24, extra + dim) / math.sqrt(dim)
        if outproj_bias:
            a["outproj_bias"] = r(24)
    return a, dict(headdim=P if D_shape == "head" else None, ngroups=G)


MIXER_CASES = {
    # transformers' Mamba2 layers: normed after the gate, the projection without a bias
    "norm_after_gate": dict(make=dict(outproj_bias=False, initial_states=False),
                            call=dict(norm_before_gate=False)),
    "norm_before_gate": dict(make=dict(), call=dict(norm_before_gate=True,
                                                    return_final_states=True)),
    # no RMSNorm: z gates inside the scan; no projection: out is [.., dim]
    "gate_in_scan_no_projection": dict(make=dict(rmsnorm=False, outproj=False),
                                       call=dict(return_final_states=True)),
    "norm_no_projection": dict(make=dict(outproj=False, D_shape="channel"),
                               call=dict(norm_before_gate=False, rmsnorm_eps=1e-3)),
    "seq_idx": dict(make=dict(), call=dict(
        norm_before_gate=False, return_final_states=True,
        seq_idx=torch.tensor([[0] * 20 + [1] * 25, [0] * 5 + [3] * 40], dtype=torch.int32))),
    "dt_limit_no_activation": dict(make=dict(rmsnorm=False, G=1),
                                   call=dict(dt_limit=(0.05, 0.2), activation=None,
                                             return_final_states=True)),
    # d_nonssm > 0: SwiGLU columns before the SSM's, through the projection
    "extra_columns": dict(make=dict(extra=6), call=dict(norm_before_gate=True)),
    "extra_columns_no_norm_no_projection": dict(make=dict(extra=6, rmsnorm=False,
                                                          outproj=False), call=dict()),
}


@pytest.mark.parametrize("case", MIXER_CASES)
def test_split_conv1d_scan_matches_the_definition_with_gradients(case):
    spec = MIXER_CASES[case]
    a, sizes = make_mixer(11, **spec["make"])
    kw = dict(sizes, **spec["call"])
    leaves = {k: v.clone().requires_grad_(True) for k, v in a.items()}
    ref_leaves = {k: v.clone().double().requires_grad_(True) for k, v in a.items()}
    got = mamba_split_conv1d_scan_combined(chunk_size=64, **leaves, **kw)
    want_out, want_final = split_reference(
        **ref_leaves, **{k: v for k, v in kw.items() if k != "return_final_states"})
    returns_final = kw.get("return_final_states", False)
    out, final = got if returns_final else (got, None)
    assert torch.is_tensor(out) and out.dtype == torch.float32
    assert out.shape == want_out.shape
    close(out, want_out.detach(), "out")
    g = torch.Generator().manual_seed(5)
    d_out = torch.randn(out.shape, generator=g)
    loss, want_loss = (out * d_out).sum(), (want_out * d_out.double()).sum()
    if returns_final:
        assert final.shape == want_final.shape and final.dtype == torch.float32
        close(final, want_final.detach(), "final_states")
        d_final = torch.randn(final.shape, generator=g)
        loss = loss + (final * d_final).sum()
        want_loss = want_loss + (want_final * d_final.double()).sum()
    loss.backward()
    want_loss.backward()
    for name in leaves:
        assert leaves[name].grad is not None, f"d{name} missing"
        close(leaves[name].grad, ref_leaves[name].grad, f"d{name}", tol=1e-4)


def test_split_conv1d_scan_dtypes_and_returns():
    a, sizes = make_mixer(12, seqlen=20, rmsnorm=True, outproj=False)
    only = mamba_split_conv1d_scan_combined(chunk_size=256, **a, **sizes)
    assert torch.is_tensor(only) and only.shape == (2, 20, 32)
    half = {k: v.bfloat16() if k == "zxbcdt" else v for k, v in a.items()}
    out, final = mamba_split_conv1d_scan_combined(chunk_size=256, return_final_states=True,
                                                  state_dtype=torch.bfloat16, **half, **sizes)
    assert out.dtype == torch.bfloat16 and final.dtype == torch.float32
    a, sizes = make_mixer(12, seqlen=20, outproj=True)
    projected = mamba_split_conv1d_scan_combined(chunk_size=256, **a, **sizes)
    assert projected.shape == (2, 20, 24)


def _mixer_error(match, exc=ValueError, make=None, **call):
    a, sizes = make_mixer(13, seqlen=10, **(make or {}))
    with pytest.raises(exc, match=match):
        mamba_split_conv1d_scan_combined(**{"chunk_size": 64, **a, **sizes, **call})


def test_split_conv1d_scan_refuses_bad_arguments_by_name():
    _mixer_error(r"zxbcdt: expected a last dim", zxbcdt=torch.randn(2, 10, 83))
    _mixer_error(r"zxbcdt: expected a floating-point tensor", zxbcdt=torch.randn(2, 10))
    _mixer_error(r"headdim", headdim=None)
    _mixer_error(r"ngroups: expected a divisor of nheads = 4", ngroups=3)
    _mixer_error(r"conv1d_weight: expected \[dim \+ 2\*ngroups\*dstate, width\]",
                 conv1d_weight=torch.randn(33, 4))
    _mixer_error(r"conv1d_bias: expected shape", conv1d_bias=torch.randn(47))
    _mixer_error(r"dt_bias: expected shape \[nheads\]", dt_bias=torch.randn(5))
    _mixer_error(r"A: expected shape \[nheads\]", A=-torch.rand(4, 1))
    _mixer_error(r"initial_states: expected shape \[batch, nheads, headdim, dstate\] = "
                 r"\[2, 4, 8, 4\]", initial_states=torch.randn(2, 4, 4, 8))
    _mixer_error(r"rmsnorm_weight: expected shape \[dim\] = \[32\]",
                 rmsnorm_weight=torch.randn(16))
    _mixer_error(r"rmsnorm_eps", rmsnorm_eps=None)
    _mixer_error(r"outproj_weight: expected \[out_dim, d_nonssm \+ dim\]",
                 outproj_weight=torch.randn(24, 30))
    _mixer_error(r"outproj_bias: must be None without outproj_weight",
                 make=dict(outproj=False), outproj_bias=torch.randn(24))
    _mixer_error(r"activation: expected None, 'silu' or 'swish'", activation="gelu")
    _mixer_error(r"state_dtype", state_dtype="float32")
    _mixer_error(r"chunk_size: expected a positive int", chunk_size=0)
    _mixer_error(r"seq_idx: expected", seq_idx=torch.zeros(2, 9, dtype=torch.int64))


@pytest.mark.parametrize("packed", [False, True])
def test_split_conv1d_scan_compiles_fullgraph_with_gradients(packed):
    """Also with seq_idx: the conv's and the scan's packed sequences are counted inside
    their custom ops, so their number is no data-dependent size in the graph."""
    a, sizes = make_mixer(14, seqlen=40)
    kw = dict(sizes, norm_before_gate=False, return_final_states=True)
    if packed:
        kw["seq_idx"] = torch.tensor([[0] * 15 + [1] * 25, [0] * 33 + [2] * 7])

    def step(fn, args):
        leaves = {k: v.clone().requires_grad_(True) for k, v in args.items()}
        out, final = fn(**leaves)
        (out.square().sum() + final.sum()).backward()
        return out.detach(), final.detach(), {k: v.grad for k, v in leaves.items()}

    compiled = torch.compile(lambda **k: mamba_split_conv1d_scan_combined(
        chunk_size=64, **k, **kw), fullgraph=True)
    got = step(compiled, a)
    want = step(lambda **k: mamba_split_conv1d_scan_combined(chunk_size=64, **k, **kw), a)
    for g_, w_, what in ((got[0], want[0], "out"), (got[1], want[1], "final_states")):
        close(g_, w_.double(), what, tol=1e-5)
    for name in a:
        close(got[2][name], want[2][name].double(), f"d{name}", tol=1e-5)
