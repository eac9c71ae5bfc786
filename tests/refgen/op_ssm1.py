"""SSM1 (the selective scan: docs/semantics.md) and its segment summary: how a case draws
their inputs, their float64 definitions on the tape, their entries (OPS) and their cases
(CASES, and CHECKS for the gradient self-check)."""
import numpy as np

from opdef import OpDef, state_rows, with_state_grad
from ops import activation, sequences
from tape import Value, exp, softplus, stack


def draw(rng, c):
    B, T, D, N = (c[n] for n in 'BTDN')
    rows = len(c['cu']) - 1 if 'cu' in c else B
    bc = (B, T, c['G'], N) if c.get('G') else (B, T, N)
    x = {'x': rng.standard_normal((B, T, D)),
         'A': -np.exp(rng.uniform(np.log(0.1), np.log(4.0), (D, N))),
         'B': rng.standard_normal(bc), 'C': rng.standard_normal(bc)}
    if c.get('dt_softplus'):  # dt before softplus: softplus(dt + bias) lands in (0.01, 1)
        x['dt'] = rng.normal(-2.5, 1.0, (B, T, D))
        x['dt_bias'] = rng.normal(0, 0.5, (D,))
    else:
        x['dt'] = np.exp(rng.uniform(np.log(1e-3), np.log(c.get('dt_max', 0.1)), (B, T, D)))
    if c.get('has_D', True):
        x['D'] = rng.standard_normal((D,))
    if c.get('has_gate'):
        x['gate'] = rng.standard_normal((B, T, D))
    if c.get('has_h0'):
        x['h0'] = rng.normal(0, 0.5, (rows, D, N))
    return x


def forward(x, m):
    B, T, D, N = (m[n] for n in 'BTDN')
    G = m.get('G') or 1
    group_of = np.arange(D) // (D // G)
    Bp, Cp = x['B'], x['C']
    if not m.get('G'):                                  # [B,T,N]: one group
        Bp, Cp = Bp.reshape(B, T, 1, N), Cp.reshape(B, T, 1, N)
    act = m.get('gate_activation') or 'silu'
    spans = sequences(m, T) or [(b, 0, T) for b in range(B)]
    y_rows, finals = {}, []
    for row, start, end in spans:
        b = 0 if 'cu' in m else row
        h = x['h0'][row]
        for t in range(start, end):
            dt = x['dt'][b, t]
            if m.get('dt_softplus'):
                dt = softplus(dt + x['dt_bias'])
            dt = dt.reshape(D, 1)
            xt = x['x'][b, t]
            h = exp(x['A'] * dt) * h + (dt * Bp[b, t][group_of]) * xt.reshape(D, 1)
            y = (h * Cp[b, t][group_of]).sum(axis=1) + x['D'] * xt
            if 'gate' in x:
                y = y * activation(act, x['gate'][b, t])   # after the D skip
            y_rows[(b, t)] = y
        finals.append(h)
    y = stack([stack([y_rows[(b, t)] for t in range(T)]) for b in range(B)])
    return {'y': y, 'hT': stack(finals)}


def segment(x, m):
    """SSM1's segment summary: h_end = P * h_start + R elementwise. R is the end state from
    zeros; P = exp(A sum_t dt_t), the end state of the recurrence from ones with x = 0. C_proj,
    D_skip and the gate enter neither."""
    rows = len(m['cu']) - 1 if 'cu' in m else m['B']
    R = forward(x, m)['hT']
    to_P = dict(x, x=Value(np.zeros(x['x'].shape)), h0=Value(np.ones((rows, m['D'], m['N']))))
    return {'P': forward(to_P, m)['hT'], 'R': R}


def _ssm1_optional(c):
    return {'h0': (state_rows(c), c['D'], c['N']), 'D': (c['D'],), 'dt_bias': (c['D'],)}


def _ssm1_grads(c, inputs, with_h0=True):
    names = ['x', 'dt', 'A', 'B', 'C'] + [n for n in ('D', 'gate') if n in inputs]
    names = with_state_grad(c, inputs, 'h0', names) if with_h0 else names
    return names + (['dt_bias'] if c.get('dt_softplus') else [])


def _ssm1_options(c, arrays, with_state=True):
    m = dict(dt_softplus=bool(c.get('dt_softplus')), gate_activation=c['gate_activation'],
             has_gate='gate' in arrays)
    if with_state:
        m.update(has_h0='h0' in arrays, has_dhT=bool(c['d_state']))
    m['varlen'] = 'cu' in c
    return m


OPS = {
    'ssm1': OpDef(draw, forward, ('y', 'hT'), _ssm1_optional, _ssm1_grads, _ssm1_options),
    # The summary starts from zeros: no h0 and no dh0 (the case has none to list).
    'ssm1_segment': OpDef(draw, segment, ('P', 'R'), _ssm1_optional,
                          lambda c, inputs: _ssm1_grads(c, inputs, with_h0=False),
                          lambda c, arrays: _ssm1_options(c, arrays, with_state=False)),
}


def ssm1(name, seed, B, T, D, N, gate=True, h0=True, d_state=True, act='silu', **more):
    c = dict(op='ssm1', name=name, seed=seed, B=B, T=T, D=D, N=N, has_gate=gate, has_h0=h0,
             d_state=d_state, gate_activation=act if gate else None)
    c.update(more)
    return c


def ssm1_segment(name, seed, B, T, D, N, gate=True, d_state=True, act='silu', **more):
    return dict(ssm1(name, seed, B, T, D, N, gate=gate, h0=False, d_state=d_state, act=act,
                     **more), op='ssm1_segment')


CASES = [
    # SSM1. The first one is small on purpose: fuzz/make_seeds.py stores a copy of it.
    ssm1('ssm1_B2_T1_D8_N4_gate_h0', 1201, 2, 1, 8, 4),
    ssm1('ssm1_B1_T70_D8_N4_nogate_noh0', 1202, 1, 70, 8, 4, gate=False, h0=False),
    ssm1('ssm1_B2_T20_D8_N4_G2_sigmoid_softplus_h0', 1203, 2, 20, 8, 4, G=2, act='sigmoid',
         dt_softplus=True),
    ssm1('ssm1_B1_T10_D6_N3_gelu_tanh_noD_h0_dt0.5', 1204, 1, 10, 6, 3, act='gelu_tanh',
         has_D=False, dt_max=0.5),
    ssm1('ssm1_B1_T9_D4_N2_G4_relu_noh0_dh0', 1205, 1, 9, 4, 2, G=4, act='relu', h0=False,
         dstate_at_zero=True),
    ssm1('ssm1_B2_T6_D4_N3_identity_h0_nodht', 1206, 2, 6, 4, 3, act='identity',
         d_state=False),
    ssm1('ssm1_varlen3_B1_T17_D6_N4_G3_silu_softplus_h0_empty', 1207, 1, 17, 6, 4, G=3,
         dt_softplus=True, cu=[0, 5, 5, 17]),
    # The segment summary (context parallelism): P and R of every sequence; C, D and the
    # gate are given although they do not enter, so their gradients must come out zero.
    ssm1_segment('ssm1_segment_B2_T20_D8_N4_G2_sigmoid_softplus', 1501, 2, 20, 8, 4, G=2,
                 act='sigmoid', dt_softplus=True),
    ssm1_segment('ssm1_segment_varlen3_B1_T17_D6_N3_nogate_noD_nodR', 1502, 1, 17, 6, 3,
                 gate=False, has_D=False, d_state=False, cu=[0, 5, 5, 17]),
]

# Tiny versions of every option for the gradient self-check (finite differences).
CHECKS = [
    ssm1('ssm_silu', 9, 1, 3, 2, 2),
    ssm1('ssm_groups_softplus_gelu', 10, 1, 3, 4, 2, G=2, act='gelu_tanh', dt_softplus=True),
    ssm1('ssm_sigmoid_relu_varlen', 11, 1, 4, 2, 2, act='sigmoid', cu=[0, 1, 1, 4]),
    ssm1('ssm_relu_noD', 12, 2, 2, 2, 2, act='relu', has_D=False, h0=False,
         dstate_at_zero=True),
    ssm1_segment('ssm1_segment_groups_softplus', 18, 1, 3, 4, 2, G=2, dt_softplus=True),
    ssm1_segment('ssm1_segment_varlen_noD', 19, 1, 4, 2, 2, has_D=False, cu=[0, 1, 1, 4]),
]
