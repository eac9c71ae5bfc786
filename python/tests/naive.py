"""Plain float64 PyTorch versions of the ops, token by token, written from the definitions
(README "Semantics"), for autograd to differentiate: the independent reference of the
training-step tests."""

import torch
import torch.nn.functional as F


def kda(q, k, v, g, beta, *, scale=None, h0=None, l2=False, gate_in_kernel=False,
        A_log=None, dt_bias=None, lower_bound=None, beta_logit=False, cu_seqlens=None,
        state_v_first=False):
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    per_channel = g.dim() == 4
    if beta_logit:
        beta = torch.sigmoid(beta)
    if gate_in_kernel:
        a = torch.zeros(HV, dtype=torch.float64) if A_log is None else A_log.double()
        bias = 0 if dt_bias is None else (dt_bias.double().reshape(HV, K) if per_channel
                                          else dt_bias.double())
        a = a[:, None] if per_channel else a
        if lower_bound is None:
            g = -torch.exp(a) * F.softplus(g + bias)
        else:
            g = lower_bound * torch.sigmoid(torch.exp(a) * (g + bias))
    if l2:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * (K ** -0.5 if scale is None else scale)
    q = q.repeat_interleave(HV // H, dim=2)
    k = k.repeat_interleave(HV // H, dim=2)
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(c) for c in cu_seqlens]
        spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    pieces = [[] for _ in range(B)]
    finals = []
    for n, (b, start, end) in enumerate(spans):
        S = torch.zeros(HV, K, V, dtype=torch.float64)
        if h0 is not None:
            S = h0[n].double().transpose(-1, -2) if state_v_first else h0[n].double()
        rows = []
        for t in range(start, end):
            decay = torch.exp(g[b, t])
            S = S * (decay[:, :, None] if per_channel else decay[:, None, None])
            u = beta[b, t][:, None] * (v[b, t] - torch.einsum("hkv,hk->hv", S, k[b, t]))
            S = S + k[b, t][:, :, None] * u[:, None, :]
            rows.append(torch.einsum("hkv,hk->hv", S, q[b, t]))
        if rows:
            pieces[b].append(torch.stack(rows))
        finals.append(S.transpose(-1, -2) if state_v_first else S)
    return torch.stack([torch.cat(p) for p in pieces]), torch.stack(finals)


def ssm1(x, A, Bp, Cp, D, dt, gate=None, h0=None, act=F.silu):
    x, A, Bp, Cp, dt = (t.double() for t in (x, A, Bp, Cp, dt))
    Bsz, T, Dm = x.shape
    if Bp.dim() == 3:
        Bp, Cp = Bp[:, :, None], Cp[:, :, None]
    G = Bp.shape[2]
    Bp = Bp.repeat_interleave(Dm // G, dim=2)
    Cp = Cp.repeat_interleave(Dm // G, dim=2)
    h = torch.zeros(Bsz, Dm, A.shape[1], dtype=torch.float64) if h0 is None else h0.double()
    ys = []
    for t in range(T):
        h = torch.exp(A * dt[:, t, :, None]) * h + (dt[:, t] * x[:, t])[..., None] * Bp[:, t]
        y = (h * Cp[:, t]).sum(-1)
        if D is not None:
            y = y + D.double() * x[:, t]
        ys.append(y)
    y = torch.stack(ys, dim=1)
    if gate is not None:
        y = y * act(gate.double())
    return y, h
