"""linseq.compat.mamba_ssd.mamba_chunk_scan_combined against mamba-ssm's definition of the
Mamba2 scan (its docstring and the paper's recurrence, written here in float64 PyTorch, token
by token): outputs, final and per-sequence states, and every gradient through autograd, over
its arguments (groups, D per head or channel, z, dt_bias with and without softplus, dt_limit,
initial_states, seq_idx over several rows, return_varlen_states)."""
import math

import pytest

from conftest import require

torch = require("torch")
from linseq.compat.mamba_ssd import mamba_chunk_scan_combined  # noqa: E402


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
