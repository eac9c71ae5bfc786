"""linseq.compat.mamba_ssm against float64 definitions written here: selective_scan_fn
forward and backward (dtypes, variable / grouped / constant B and C with independent group
counts, D, z, delta_bias, softplus, the last state and its gradient), selective_state_update
(Mamba1 and Mamba2 shapes, groups, tied head dims, pool rows with padding requests, in-place
state), mamba_inner_fn (variable and given B / C, projection biases, RMS norms), and the
refusals."""

import pytest

from conftest import require

torch = require("torch")
import torch.nn.functional as F  # noqa: E402
from linseq.compat import mamba_ssm as ms  # noqa: E402

# relative tolerance per input dtype: outputs and gradients of the per-token inputs are
# rounded to it; float32 parameters (A, D, delta_bias, constant B / C) get their own
TOL = {torch.float32: 5e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}


def _rel(got, want):
    got, want = got.detach().double(), want.detach().double()
    return (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)


# ------------------------------------------------------------------------------------------
# float64 definitions
# ------------------------------------------------------------------------------------------

def _per_channel(P, batch, dim, seqlen):
    """B or C as [batch, dim, N, seqlen]: constant [dim, N] for every token, [batch, N, l]
    for every channel, [batch, G, N, l] for the dim/G consecutive channels of each group."""
    P = P.double()
    if P.dim() == 2:
        return P[None, :, :, None].expand(batch, dim, P.shape[1], seqlen)
    if P.dim() == 3:
        return P[:, None].expand(batch, dim, P.shape[1], seqlen)
    return P.repeat_interleave(dim // P.shape[1], dim=1)


def scan_def(u, delta, A, B, C, D=None, z=None, delta_bias=None, softplus=False, h0=None):
    """Per channel d and state n, token by token in float64:
        dt = delta + delta_bias, then softplus(dt) when asked
        h[n] = exp(dt A[d,n]) h[n] + dt B[n] u;   y = sum_n C[n] h[n] + D[d] u;   y *= silu(z)
    Returns (y [batch, dim, seqlen], the last h [batch, dim, N])."""
    u, delta, A = u.double(), delta.double(), A.double()
    batch, dim, seqlen = u.shape
    dt = delta if delta_bias is None else delta + delta_bias.double()[:, None]
    if softplus:
        dt = F.softplus(dt)
    Bc, Cc = _per_channel(B, batch, dim, seqlen), _per_channel(C, batch, dim, seqlen)
    h = torch.zeros(batch, dim, A.shape[1], dtype=torch.float64) if h0 is None else h0.double()
    ys = []
    for t in range(seqlen):
        step = dt[:, :, t, None]
        h = torch.exp(step * A) * h + step * Bc[..., t] * u[:, :, t, None]
        ys.append((h * Cc[..., t]).sum(-1))
    y = torch.stack(ys, dim=2)
    if D is not None:
        y = y + D.double()[:, None] * u
    if z is not None:
        y = y * F.silu(z.double())
    return y, h


# ------------------------------------------------------------------------------------------
# selective_scan_fn
# ------------------------------------------------------------------------------------------

# (B form, C form): "const" [dim, N], 1 = [batch, N, l], g > 1 = [batch, g, N, l]
LAYOUTS = [(1, 1), (2, 2), (2, 4), (4, 1), ("const", 1), (1, "const"), ("const", "const"),
           ("const", 2)]
FLAGS = [(D, z, bias, sp) for D in (False, True) for z in (False, True)
         for bias in (False, True) for sp in (False, True)]


def _scan_inputs(dtype, b_form, c_form, has_D, has_z, has_bias, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, dim, N, seqlen = 2, 8, 5, 21

    def rnd(*shape, scale=1.0, dt=dtype):
        return (scale * torch.randn(*shape, generator=gen)).to(dt).requires_grad_()

    def bc(form):
        if form == "const":
            return rnd(dim, N, dt=torch.float32)
        return rnd(batch, N, seqlen) if form == 1 else rnd(batch, form, N, seqlen)

    u = rnd(batch, dim, seqlen)
    delta = (0.5 * torch.rand(batch, dim, seqlen, generator=gen)).to(dtype).requires_grad_()
    A = (-0.2 - torch.rand(dim, N, generator=gen)).requires_grad_()
    args = dict(u=u, delta=delta, A=A, B=bc(b_form), C=bc(c_form),
                D=rnd(dim, dt=torch.float32) if has_D else None,
                z=rnd(batch, dim, seqlen) if has_z else None,
                delta_bias=(0.5 * torch.rand(dim, generator=gen)).requires_grad_()
                if has_bias else None)
    return args


def _check_scan(dtype, b_form, c_form, has_D, has_z, has_bias, softplus, last_state, seed):
    args = _scan_inputs(dtype, b_form, c_form, has_D, has_z, has_bias, seed)
    res = ms.selective_scan_fn(args["u"], args["delta"], args["A"], args["B"], args["C"],
                               args["D"], args["z"], args["delta_bias"], softplus, last_state)
    out, last = res if last_state else (res, None)
    y_def, h_def = scan_def(**args, softplus=softplus)
    assert out.shape == args["u"].shape and out.dtype == dtype and out.is_contiguous()
    assert _rel(out, y_def) <= TOL[dtype]
    gen = torch.Generator().manual_seed(seed + 1)
    d_out = torch.randn(out.shape, generator=gen)
    loss, loss_def = (out.double() * d_out).sum(), (y_def * d_out).sum()
    if last_state:
        assert last.shape == h_def.shape and last.dtype == torch.float32
        assert _rel(last, h_def) <= (5e-5 if dtype == torch.float32 else 1e-5 + TOL[dtype])
        # unlike mamba-ssm, the last state's gradient reaches the inputs
        d_last = torch.randn(last.shape, generator=gen)
        loss, loss_def = loss + (last.double() * d_last).sum(), loss_def + (h_def * d_last).sum()
    names = [n for n, t in args.items() if t is not None]
    got = torch.autograd.grad(loss, [args[n] for n in names])
    want = torch.autograd.grad(loss_def, [args[n] for n in names])
    for n, g, w in zip(names, got, want):
        assert g.shape == args[n].shape and g.dtype == args[n].dtype, n
        tol = 2e-4 if dtype == torch.float32 else 3 * TOL[dtype]
        assert _rel(g, w) <= tol, f"d{n}: {_rel(g, w):.3g}"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("flags", FLAGS)
def test_scan_float32_every_flag(layout, flags):
    _check_scan(torch.float32, *layout, *flags, last_state=True, seed=sum(map(int, flags)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", [(1, 1), (2, 4), ("const", 2)])
@pytest.mark.parametrize("flags", [(True, True, True, True), (False, False, False, False)])
@pytest.mark.parametrize("last_state", [False, True])
def test_scan_half_precision(dtype, layout, flags, last_state):
    _check_scan(dtype, *layout, *flags, last_state=last_state, seed=7)


def test_scan_returns_only_out_without_last_state():
    args = _scan_inputs(torch.float32, 1, 1, True, False, False, 3)
    out = ms.selective_scan_fn(*args.values())
    assert isinstance(out, torch.Tensor)


def test_scan_channel_last_views():
    """u, delta, z as transposed [batch, seqlen, dim] tensors give the same result."""
    args = _scan_inputs(torch.float32, 2, 2, True, True, True, 5)
    ref = ms.selective_scan_fn(*args.values(), delta_softplus=True)
    views = {n: (t.detach().transpose(1, 2).contiguous().transpose(1, 2)
                 if n in ("u", "delta", "z") else t.detach()) for n, t in args.items()}
    got = ms.selective_scan_fn(*views.values(), delta_softplus=True)
    assert torch.equal(got, ref.detach())


def test_scan_refusals():
    args = _scan_inputs(torch.float32, 1, 1, False, False, False, 1)
    u, delta, A, B, C = (args[n].detach() for n in ("u", "delta", "A", "B", "C"))
    with pytest.raises(TypeError, match="A: complex"):
        ms.selective_scan_fn(u, delta, A.to(torch.complex64), B, C)
    with pytest.raises(ValueError, match="delta"):
        ms.selective_scan_fn(u, delta[:, :, 1:], A, B, C)
    with pytest.raises(ValueError, match="B"):
        ms.selective_scan_fn(u, delta, A, B[:, :, 1:], C)
    with pytest.raises(ValueError, match="C: the groups"):
        ms.selective_scan_fn(u, delta, A, B, torch.randn(2, 3, 5, 21))  # 3 does not divide 8
    with pytest.raises(ValueError, match="D"):
        ms.selective_scan_fn(u, delta, A, B, C, D=torch.zeros(7))
    with pytest.raises(ValueError, match="delta_bias"):
        ms.selective_scan_fn(u, delta, A, B, C, delta_bias=torch.zeros(3))
    with pytest.raises(ValueError, match="A"):
        ms.selective_scan_fn(u, delta, A[1:], B, C)


# ------------------------------------------------------------------------------------------
# selective_state_update
# ------------------------------------------------------------------------------------------

def update_def(state, x, dt, A, B, C, D, z, dt_bias, softplus):
    """One token on each request's own state [H, P, N] (float64 copies); B, C [b, G, N]
    shared by the H/G consecutive heads of each group. Returns (out [b, H, P], state)."""
    nheads = state.shape[1]
    dt = dt.double() if dt_bias is None else dt.double() + dt_bias.double()
    if softplus:
        dt = F.softplus(dt)
    Bh = B.double().repeat_interleave(nheads // B.shape[1], dim=1)[:, :, None]
    Ch = C.double().repeat_interleave(nheads // C.shape[1], dim=1)[:, :, None]
    h = torch.exp(dt[..., None] * A.double()) * state.double() + \
        dt[..., None] * Bh * x.double()[..., None]
    out = (h * Ch).sum(-1)
    if D is not None:
        out = out + D.double() * x.double()
    if z is not None:
        out = out * F.silu(z.double())
    return out, h


def _update_inputs(heads, ngroups, tie, dtype, gen, batch, entries):
    H, P, N = (4, 3, 6) if heads else (1, 7, 6)
    state = torch.randn(entries, H, P, N, generator=gen).to(dtype)
    x = torch.randn(batch, H, P, generator=gen).to(dtype)
    if tie:  # Mamba2: one dt, bias, A and D per head, broadcast over the head dim
        dt = torch.randn(batch, H, 1, generator=gen).to(dtype).expand(batch, H, P)
        dt_bias = (torch.rand(H, 1, generator=gen) - 4).expand(H, P)
        A = (-torch.rand(H, 1, 1, generator=gen) - 1).expand(H, P, N)
        D = torch.randn(H, 1, generator=gen).expand(H, P)
    else:
        dt = torch.randn(batch, H, P, generator=gen).to(dtype)
        dt_bias = torch.rand(H, P, generator=gen) - 4
        A = -torch.rand(H, P, N, generator=gen) - 1
        D = torch.randn(H, P, generator=gen)
    B = torch.randn(batch, ngroups, N, generator=gen)
    C = torch.randn(batch, ngroups, N, generator=gen)
    z = torch.randn(batch, H, P, generator=gen).to(dtype)
    return dict(state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,ngroups,tie", [(False, 1, False), (True, 1, False),
                                               (True, 2, False), (True, 4, True),
                                               (True, 2, True)])
@pytest.mark.parametrize("pool", ["batch", "rows", "rows+padding"])
@pytest.mark.parametrize("has_z", [False, True])
@pytest.mark.parametrize("has_D,dt_bias,softplus", [(True, True, True), (False, False, True),
                                                    (True, True, False),
                                                    (False, False, False)])
def test_state_update(dtype, heads, ngroups, tie, pool, has_z, has_D, dt_bias, softplus):
    gen = torch.Generator().manual_seed(ngroups * 3 + tie)
    batch = 5
    entries = batch if pool == "batch" else 3 * batch
    a = _update_inputs(heads, ngroups, tie, dtype, gen, batch, entries)
    if not softplus:  # the step as given: keep it positive so that the state decays
        a["dt"], a["dt_bias"] = a["dt"].abs(), a["dt_bias"].abs()
    rows = None
    if pool != "batch":
        rows = torch.randperm(entries, generator=gen)[:batch].to(torch.int32)
        if pool == "rows+padding":
            rows[1::2] = -1
    idx = torch.arange(batch) if rows is None else rows.long()
    live = idx >= 0
    call = dict(a)
    if not heads:  # Mamba1 shapes: no heads axis anywhere
        call = {n: (t[:, 0] if n in ("state", "x", "dt", "z", "B", "C") else t[0])
                for n, t in a.items()}
    call["D"] = call["D"] if has_D else None
    call["z"] = call["z"] if has_z else None
    call["dt_bias"] = call["dt_bias"] if dt_bias else None
    before = a["state"].clone()
    out = ms.selective_state_update(call.pop("state"), **call, dt_softplus=softplus,
                                    state_batch_indices=rows)
    # the Mamba1 call updated a view of a["state"]: its [entries, 1, P, N] storage
    out_def, state_def = update_def(
        before[idx[live]], a["x"][live], a["dt"][live], a["A"], a["B"][live], a["C"][live],
        a["D"] if has_D else None, a["z"][live] if has_z else None,
        a["dt_bias"] if dt_bias else None, softplus)
    out4 = out if heads else out[:, None]
    assert out.dtype == dtype and out.shape == call["x"].shape
    assert _rel(out4[live], out_def) <= 2 * TOL[dtype]
    assert torch.all(out4[~live] == 0)
    assert _rel(a["state"][idx[live]], state_def) <= 2 * TOL[dtype]
    untouched = torch.ones(entries, dtype=torch.bool)
    untouched[idx[live]] = False
    assert torch.equal(a["state"][untouched], before[untouched])


def test_state_update_continues_the_scan():
    """Decoding token by token reproduces selective_scan_fn's outputs and last state."""
    args = _scan_inputs(torch.float32, 1, 1, True, True, True, 11)
    args = {n: t.detach() for n, t in args.items()}
    out, last = ms.selective_scan_fn(*args.values(), delta_softplus=True,
                                     return_last_state=True)
    state = torch.zeros_like(last)
    steps = [ms.selective_state_update(state, args["u"][..., t], args["delta"][..., t],
                                       args["A"], args["B"][..., t], args["C"][..., t],
                                       D=args["D"], z=args["z"][..., t],
                                       dt_bias=args["delta_bias"], dt_softplus=True)
             for t in range(out.shape[2])]
    assert _rel(torch.stack(steps, dim=2), out) <= 1e-5
    assert _rel(state, last) <= 1e-5


def test_state_update_refusals():
    gen = torch.Generator().manual_seed(0)
    a = _update_inputs(True, 2, False, torch.float32, gen, 3, 3)
    state = a.pop("state")
    before = state.clone()
    with pytest.raises(TypeError, match="A: complex"):
        ms.selective_state_update(state, **{**a, "A": a["A"].to(torch.complex64)})
    with pytest.raises(ValueError, match="B"):
        ms.selective_state_update(state, **{**a, "B": torch.randn(3, 3, 6)})  # 3 !| 4 heads
    with pytest.raises(ValueError, match="C"):
        ms.selective_state_update(state, **{**a, "C": torch.randn(3, 1, 6)})
    with pytest.raises(ValueError, match="dt_bias"):
        ms.selective_state_update(state, **{**a, "dt_bias": torch.zeros(4, 2)})
    with pytest.raises(ValueError, match="x"):
        ms.selective_state_update(state, **{**a, "x": torch.zeros(3, 4, 2)})
    with pytest.raises(TypeError, match="state_batch_indices"):
        ms.selective_state_update(state, **a, state_batch_indices=torch.zeros(3))
    with pytest.raises(ValueError, match="state_batch_indices"):
        ms.selective_state_update(state, **a, state_batch_indices=torch.tensor([0, 1, 3]))
    for pool in (state, state.to(torch.bfloat16)):   # a row shared by two requests
        with pytest.raises(ValueError, match="state_batch_indices: two requests"):
            ms.selective_state_update(pool, **a, state_batch_indices=torch.tensor([2, -1, 2]))
    with pytest.raises(ValueError, match="state"):
        ms.selective_state_update(state[:2], **a)
    assert torch.equal(state, before)


# ------------------------------------------------------------------------------------------
# mamba_inner_fn
# ------------------------------------------------------------------------------------------

def _rms(t, w, eps):
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def inner_def(xz, conv_w, conv_b, x_proj_w, dt_proj_w, out_w, out_b, A, B=None, C=None,
              D=None, delta_bias=None, B_bias=None, C_bias=None, softplus=True, b_rms=None,
              c_rms=None, dt_rms=None, eps=1e-6):
    """The Mamba1 mixer in float64: conv (taps over the W-1 previous tokens) + bias, silu;
    the x projection's columns [dt rank | B | C]; dt, B, C with their optional biases and RMS
    norms; the scan; the out projection. Returns [batch, seqlen, out_dim]."""
    xz = xz.double()
    batch, two_dim, seqlen = xz.shape
    dim = two_dim // 2
    x, z = xz[:, :dim], xz[:, dim:]
    w = conv_w.double().reshape(dim, -1)
    W = w.shape[1]
    xs = torch.cat([torch.zeros(batch, dim, W - 1, dtype=torch.float64), x], dim=2)
    conv = sum(w[:, j, None] * xs[:, :, j:j + seqlen] for j in range(W))
    conv = F.silu(conv + conv_b.double()[:, None])
    rows = conv.transpose(1, 2).reshape(batch * seqlen, dim)
    x_dbl = rows @ x_proj_w.double().T
    rank, N = dt_proj_w.shape[1], A.shape[1]
    dt = x_dbl[:, :rank] @ dt_proj_w.double().T
    if dt_rms is not None:
        dt = _rms(dt, dt_rms, eps)

    def projected(cols, bias, rms):
        P = cols if bias is None else cols + bias.double()
        P = P if rms is None else _rms(P, rms, eps)
        return P.reshape(batch, seqlen, N).transpose(1, 2)

    def given(P, rms):  # a given variable B / C: normed over dstate; biases not applied
        return P if rms is None else _rms(P.double().transpose(-1, -2), rms, eps).transpose(-1, -2)

    B = projected(x_dbl[:, rank:rank + N], B_bias, b_rms) if B is None else given(B, b_rms)
    C = projected(x_dbl[:, rank + N:], C_bias, c_rms) if C is None else given(C, c_rms)
    y, _ = scan_def(conv, dt.reshape(batch, seqlen, dim).transpose(1, 2), A, B, C, D, z,
                    delta_bias, softplus)
    out = y.transpose(1, 2) @ out_w.double().T
    return out if out_b is None else out + out_b.double()


def _inner_inputs(given_B, given_C, extras, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, dim, seqlen, N, rank, W, out_dim = 2, 8, 15, 4, 3, 4, 6

    def p(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).requires_grad_()

    a = dict(xz=p(batch, 2 * dim, seqlen), conv1d_weight=p(dim, 1, W, scale=0.5),
             conv1d_bias=p(dim), x_proj_weight=p(rank + 2 * N, dim, scale=0.4),
             delta_proj_weight=p(dim, rank, scale=0.4), out_proj_weight=p(out_dim, dim),
             out_proj_bias=p(out_dim),
             A=(-0.2 - torch.rand(dim, N, generator=gen)).requires_grad_(),
             B=p(dim, N) if given_B == "const" else p(batch, 2, N, seqlen) if given_B else None,
             C=p(dim, N) if given_C == "const" else p(batch, 2, N, seqlen) if given_C else None,
             D=p(dim), delta_bias=p(dim, scale=0.5))
    if extras:
        a.update(B_proj_bias=p(N), C_proj_bias=p(N), b_rms_weight=p(N), c_rms_weight=p(N),
                 dt_rms_weight=p(dim))
    return a


@pytest.mark.parametrize("given_B,given_C", [(None, None), ("const", None), (None, "grouped"),
                                             ("const", "const")])
@pytest.mark.parametrize("extras", [False, True])
@pytest.mark.parametrize("softplus", [True, False])
def test_inner_fn(given_B, given_C, extras, softplus):
    a = _inner_inputs(given_B, given_C, extras, seed=3 + extras)
    if extras and "const" in (given_B, given_C):
        with pytest.raises(ValueError, match="rms_weight"):   # no norm of a constant B / C
            ms.mamba_inner_fn(**a, delta_softplus=softplus)
        return
    out = ms.mamba_inner_fn(**a, delta_softplus=softplus)
    names = {"B_proj_bias": "B_bias", "C_proj_bias": "C_bias", "b_rms_weight": "b_rms",
             "c_rms_weight": "c_rms", "dt_rms_weight": "dt_rms", "conv1d_weight": "conv_w",
             "conv1d_bias": "conv_b", "x_proj_weight": "x_proj_w",
             "delta_proj_weight": "dt_proj_w", "out_proj_weight": "out_w",
             "out_proj_bias": "out_b"}
    want = inner_def(**{names.get(n, n): t for n, t in a.items()}, softplus=softplus)
    assert out.shape == want.shape and out.dtype == torch.float32
    assert _rel(out, want) <= 5e-5
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    leaves = [n for n, t in a.items() if t is not None]
    got = torch.autograd.grad((out.double() * d_out).sum(), [a[n] for n in leaves],
                              allow_unused=True)
    ref = torch.autograd.grad((want * d_out).sum(), [a[n] for n in leaves], allow_unused=True)
    for n, g, r in zip(leaves, got, ref):
        if r is None:   # a projection bias beside a given B / C: unused, as in mamba-ssm
            assert g is None, n
            continue
        assert g.shape == a[n].shape, n
        assert _rel(g, r) <= 2e-4, f"d{n}: {_rel(g, r):.3g}"


def test_inner_fn_refusals():
    a = {n: (t.detach() if t is not None else None)
         for n, t in _inner_inputs(None, None, False, 0).items()}
    with pytest.raises(ValueError, match="checkpoint_lvl"):
        ms.mamba_inner_fn(**a, checkpoint_lvl=2)
    with pytest.raises(TypeError, match="A: complex"):
        ms.mamba_inner_fn(**{**a, "A": a["A"].to(torch.complex64)})
    with pytest.raises(ValueError, match="xz"):
        ms.mamba_inner_fn(**{**a, "xz": a["xz"][:, 1:]})
    out0 = ms.mamba_inner_fn(**a, checkpoint_lvl=0)
    out1 = ms.mamba_inner_fn(**a, checkpoint_lvl=1)
    assert torch.equal(out0, out1)   # the level chooses mamba-ssm's recomputation only


# ------------------------------------------------------------------------------------------
# The caller's memory: what the kernels read and write is the caller's tensors themselves
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("views", ["contiguous", "xz halves"])
def test_scan_reads_and_writes_the_callers_memory(kernel_calls, views):
    """Float32 u, delta, z in mamba's layout (contiguous, xz.chunk halves, a transposed
    [b, l, d] delta) and a constant C reach the kernel as the caller's memory, and y and
    the per-token gradients are the arrays the kernel wrote: nothing transposed or copied."""
    gen = torch.Generator().manual_seed(2)
    batch, dim, N, seqlen = 2, 8, 5, 21
    if views == "contiguous":
        u = torch.randn(batch, dim, seqlen, generator=gen).requires_grad_()
        z = torch.randn(batch, dim, seqlen, generator=gen).requires_grad_()
        grad_of = (u, z)
    else:
        xz = torch.randn(batch, 2 * dim, seqlen, generator=gen).requires_grad_()
        u, z = xz.chunk(2, dim=1)
        grad_of = (xz,)
    delta = (0.5 * torch.rand(batch, seqlen, dim, generator=gen)).transpose(1, 2)
    delta.requires_grad_()
    A = (-0.2 - torch.rand(dim, N, generator=gen)).requires_grad_()
    B = torch.randn(batch, N, seqlen, generator=gen).requires_grad_()
    C = torch.randn(dim, N, generator=gen).requires_grad_()
    D, bias = torch.randn(dim, generator=gen), torch.rand(dim, generator=gen)
    out, last = ms.selective_scan_fn(u, delta, A, B, C, D, z, bias, True, True)
    d_out = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad((out * d_out).sum() + last.sum(), (delta,) + grad_of)

    assert len(kernel_calls["Ssm1Inputs"]) == 2  # the forward's problem, the backward's
    for inputs in kernel_calls["Ssm1Inputs"]:
        p = inputs.problem
        assert inputs.channel_first
        assert (p.x, p.dt, p.gate) == (u.data_ptr(), delta.data_ptr(), z.data_ptr())
        assert (p.B_proj, p.C_proj) == (B.data_ptr(), C.data_ptr())  # C: [d, N] as given
    assert out.data_ptr() == kernel_calls["ssm1_forward"][0].ctypes.data and out.is_contiguous()
    kernel_grads = kernel_calls["ssm1_backward"][0]
    assert grads[0].data_ptr() == kernel_grads["ddt"].ctypes.data
    if views == "contiguous":
        assert grads[1].data_ptr() == kernel_grads["dx"].ctypes.data
        assert grads[2].data_ptr() == kernel_grads["dgate"].ctypes.data
    # the same numbers as from dense copies of the inputs
    dense = [t.detach().contiguous() for t in (u, delta, A, B, C, D, z, bias)]
    assert torch.equal(ms.selective_scan_fn(*dense, True), out.detach())
    want = scan_def(u, delta, A, B, C, D, z, bias, softplus=True)[0]
    assert _rel(out, want) <= TOL[torch.float32]


def test_inner_fn_scan_reads_the_conv_output_and_xz(kernel_calls):
    """In mamba_inner_fn the scan reads the conv's output, the delta projection and z (xz's
    second half) where they lie, and the conv reads xz's first half."""
    a = _inner_inputs(None, None, False, seed=5)
    ms.mamba_inner_fn(**a)
    x, z = a["xz"].chunk(2, dim=1)
    assert kernel_calls["Conv1dInputs"][0].problem.x == x.data_ptr()
    scan = kernel_calls["Ssm1Inputs"][0]
    assert scan.problem.x == kernel_calls["conv1d_forward"][0].ctypes.data
    assert scan.problem.gate == z.data_ptr()
    # y is written token by token ([b, l, d]), the rows the out projection multiplies
    assert not scan.channel_first and not kernel_calls["Conv1dInputs"][0].channel_first


@pytest.mark.parametrize("heads", [False, True])
def test_state_update_decodes_in_the_callers_pool(kernel_calls, heads):
    """A float32 C-contiguous state is the pool the kernel updates (no gather, no scatter),
    x read where it lies; other dtypes go through a float32 copy of the named rows."""
    gen = torch.Generator().manual_seed(4)
    a = _update_inputs(heads, 1, False, torch.float32, gen, 3, 7)
    if not heads:
        a = {n: (t[:, 0] if n in ("state", "x", "dt", "z", "B", "C") else t[0])
             for n, t in a.items()}
        a["state"] = a["state"].contiguous()
    state = a.pop("state")
    rows = torch.tensor([5, -1, 2], dtype=torch.int32)
    before = state.clone()
    out = ms.selective_state_update(state, **a, dt_softplus=True, state_batch_indices=rows)
    assert kernel_calls["ssm1_decode"] == [state.data_ptr()]
    assert kernel_calls["Ssm1Inputs"][0].problem.x == a["x"].data_ptr()
    half = before.to(torch.bfloat16)
    out_half = ms.selective_state_update(half, **a, dt_softplus=True, state_batch_indices=rows)
    assert kernel_calls["ssm1_decode"][1] != half.data_ptr()
    assert _rel(half, state) <= 1e-2 and _rel(out_half, out) <= 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_update_every_request_padding(dtype):
    """Only padding requests: out is 0 and the pool is untouched, whatever its dtype."""
    gen = torch.Generator().manual_seed(12)
    a = _update_inputs(True, 2, False, dtype, gen, 3, 4)
    state = a.pop("state")
    before = state.clone()
    out = ms.selective_state_update(state, **a, state_batch_indices=torch.tensor([-1] * 3))
    assert torch.all(out == 0) and torch.equal(state, before)
