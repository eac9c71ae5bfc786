"""SSD, Mamba2's state space duality (docs/semantics.md): how a case draws its inputs, its
float64 definition on the tape, its entry (OPS) and its cases (CASES, and CHECKS for the
gradient self-check). The tensor names and meta.json keys are those of the SSD reference
cases of the spec (x, dt, A, B, C, D, z, dt_bias, h0; has_D, has_z, has_h0, has_dhT)."""
import numpy as np

from opdef import OpDef, state_rows, with_state_grad
from ops import sequences
from tape import exp, relu, sigmoid, softplus, stack


def draw(rng, c):
    B, T, H, P, N, G = (c[n] for n in ('B', 'T', 'H', 'P', 'N', 'G'))
    rows = state_rows(c)
    x = {'x': rng.standard_normal((B, T, H, P)),
         'A': -np.exp(rng.uniform(np.log(1.0), np.log(c.get('A_mag', 16.0)), (H,))),
         'B': rng.standard_normal((B, T, G, N)), 'C': rng.standard_normal((B, T, G, N))}
    if c.get('dt_softplus'):  # dt before softplus: softplus(dt + bias) lands in (0.005, 0.5)
        x['dt'] = rng.normal(-3.0, 1.0, (B, T, H))
        x['dt_bias'] = rng.normal(0, 0.5, (H,))
    else:
        x['dt'] = np.exp(rng.uniform(np.log(1e-3), np.log(c.get('dt_draw_max', 0.1)), (B, T, H)))
    if c.get('has_D', True):
        x['D'] = rng.standard_normal((H, P) if c.get('D_per_channel') else (H,))
    if c.get('has_z'):
        x['z'] = rng.standard_normal((B, T, H, P))
    if c.get('has_h0'):
        shape = (rows, H, N, P) if c.get('state_n_first') else (rows, H, P, N)
        x['h0'] = rng.normal(0, 0.5, shape)
    return x


def _clamp(v, lo, hi):
    """lo <= v <= hi with the gradient 1 inside and 0 where the clamp holds."""
    return lo + relu(v - lo) - relu(v - hi)


def forward(x, m):
    """Per sequence and head: S = exp(dt A) S + dt x B^T, y = S C + D x, y *= silu(z)."""
    B, T, H, P, N = (m[n] for n in ('B', 'T', 'H', 'P', 'N'))
    G = m.get('G') or 1
    group_of = np.arange(H) // (H // G)
    A = x['A'].reshape(H, 1, 1)
    D = x['D'] if m.get('D_per_channel') else x['D'].reshape(H, 1)
    lo, hi = m.get('dt_min') or 0.0, m.get('dt_max') or 0.0
    spans = sequences(m, T) or [(b, 0, T) for b in range(B)]
    y_rows, finals = {}, []
    for row, start, end in spans:
        b = 0 if 'cu' in m else row
        h = x['h0'][row]
        if m.get('state_n_first'):
            h = h.transpose(0, 2, 1)                     # [H,P,N] inside
        for t in range(start, end):
            dt = x['dt'][b, t]
            if m.get('dt_softplus'):
                dt = softplus(dt + x['dt_bias'])
            if hi > lo:
                dt = _clamp(dt, lo, hi)
            dt = dt.reshape(H, 1, 1)
            xt = x['x'][b, t]
            h = exp(dt * A) * h + (dt * xt.reshape(H, P, 1)) * x['B'][b, t][group_of].reshape(H, 1, N)
            y = (h * x['C'][b, t][group_of].reshape(H, 1, N)).sum(axis=2) + D * xt
            if 'z' in x:
                y = y * (x['z'][b, t] * sigmoid(x['z'][b, t]))
            y_rows[(b, t)] = y
        finals.append(h.transpose(0, 2, 1) if m.get('state_n_first') else h)
    y = stack([stack([y_rows[(b, t)] for t in range(T)]) for b in range(B)])
    return {'y': y, 'hT': stack(finals)}


def _optional(c):
    state = ((state_rows(c), c['H'], c['N'], c['P']) if c.get('state_n_first')
             else (state_rows(c), c['H'], c['P'], c['N']))
    D = (c['H'], c['P']) if c.get('D_per_channel') else (c['H'],)
    return {'h0': state, 'D': D, 'dt_bias': (c['H'],)}


def _grads(c, inputs):
    names = ['x', 'dt', 'A', 'B', 'C'] + [n for n in ('D', 'z') if n in inputs]
    return with_state_grad(c, inputs, 'h0', names) + (['dt_bias'] if c.get('dt_softplus')
                                                     else [])


def _options(c, arrays):
    m = dict(dt_softplus=bool(c.get('dt_softplus')), has_D='D' in arrays, has_z='z' in arrays,
             has_h0='h0' in arrays, has_dt_bias='dt_bias' in arrays, has_dhT=bool(c['d_state']),
             varlen='cu' in c)
    for key in ('D_per_channel', 'state_n_first', 'dt_min', 'dt_max'):
        if c.get(key):
            m[key] = c[key]
    return m


OPS = {'ssd': OpDef(draw, forward, ('y', 'hT'), _optional, _grads, _options)}


def ssd(name, seed, B, T, H, P, N, G=1, h0=True, d_state=True, **more):
    c = dict(op='ssd', name=name, seed=seed, B=B, T=T, H=H, P=P, N=N, G=G, has_h0=h0,
             d_state=d_state)
    c.update(more)
    return c


CASES = [
    # long sequences: every chunk size has boundaries, the 128-token chunk more than one
    ssd('ssd_B1_T300_H2_P8_N4_G1_h0_z', 1601, 1, 300, 2, 8, 4, has_z=True),
    # hard decay: dt A down to -50, so a chunk's carry underflows to zero
    ssd('ssd_B2_T70_H2_P8_N8_G2_hard_decay', 1602, 2, 70, 2, 8, 8, G=2, A_mag=50.0,
        dt_draw_max=1.0),
    # groups, per-channel D, softplus with the dt clamp, N-first states
    ssd('ssd_B1_T40_H6_P4_N3_G3_Dchan_softplus_clamp_nfirst', 1603, 1, 40, 6, 4, 3, G=3,
        D_per_channel=True, dt_softplus=True, dt_min=0.01, dt_max=0.1, state_n_first=True),
    # mamba2's geometry: head dim 64, state 128
    ssd('ssd_B1_T20_H2_P64_N128_G1_z', 1604, 1, 20, 2, 64, 128, has_z=True),
    # packed sequences with an empty one; no h0, its gradient at zeros; no D
    ssd('ssd_varlen3_B1_T70_H4_P8_N4_G2_noh0_dh0_noD_empty', 1605, 1, 70, 4, 8, 4, G=2,
        h0=False, dstate_at_zero=True, has_D=False, cu=[0, 30, 30, 70]),
]

# Tiny versions of every option for the gradient self-check (finite differences).
CHECKS = [
    ssd('ssd_plain', 21, 1, 3, 2, 2, 2),
    ssd('ssd_groups_z_softplus', 22, 1, 3, 4, 2, 2, G=2, has_z=True, dt_softplus=True),
    ssd('ssd_clamp_dchan_nfirst_varlen', 23, 1, 4, 2, 2, 3, D_per_channel=True,
        dt_min=0.01, dt_max=0.05, state_n_first=True, cu=[0, 1, 1, 4]),
    ssd('ssd_noD_dh0', 24, 2, 2, 2, 2, 2, has_D=False, h0=False, dstate_at_zero=True),
]
