"""SSD's segment summary (docs/semantics.md, "Segment summaries"): per sequence and head,
S_end = P S_start + R with P = exp(A sum_t dt_t) (dt after dt_bias, softplus and the clamp,
as the recurrence takes it) and R the end state from zeros. Its float64 definition on the
tape, its entry (OPS) and its cases (CASES, and CHECKS for the gradient self-check); the
inputs are drawn as SSD's (op_ssd.py)."""
from op_ssd import _clamp, draw, forward
from opdef import OpDef, state_rows
from ops import sequences
from tape import exp, softplus, stack


def segment(x, m):
    """R: SSD's recurrence from zeros (x['h0'] is zeros: the summary has none); P: the sum of
    each sequence's dt, times A, exponentiated. C, D and z enter neither."""
    B, T = m['B'], m['T']
    lo, hi = m.get('dt_min') or 0.0, m.get('dt_max') or 0.0
    spans = sequences(m, T) or [(b, 0, T) for b in range(B)]
    rows = []
    for row, start, end in spans:
        b = 0 if 'cu' in m else row
        total = x['A'] * 0.0                 # an empty sequence: P = 1
        for t in range(start, end):
            dt = x['dt'][b, t]
            if m.get('dt_softplus'):
                dt = softplus(dt + x['dt_bias'])
            if hi > lo:
                dt = _clamp(dt, lo, hi)
            total = total + dt
        rows.append(exp(x['A'] * total))
    return {'P': stack(rows), 'R': forward(x, m)['hT']}


def _optional(c):
    state = ((state_rows(c), c['H'], c['N'], c['P']) if c.get('state_n_first')
             else (state_rows(c), c['H'], c['P'], c['N']))
    D = (c['H'], c['P']) if c.get('D_per_channel') else (c['H'],)
    return {'h0': state, 'D': D, 'dt_bias': (c['H'],)}


def _grads(c, inputs):
    """No h0 and no dh0: the summary starts from zeros."""
    names = ['x', 'dt', 'A', 'B', 'C'] + [n for n in ('D', 'z') if n in inputs]
    return names + (['dt_bias'] if c.get('dt_softplus') else [])


def _options(c, arrays):
    m = dict(dt_softplus=bool(c.get('dt_softplus')), has_D='D' in arrays, has_z='z' in arrays,
             has_dt_bias='dt_bias' in arrays, varlen='cu' in c)
    for key in ('D_per_channel', 'state_n_first', 'dt_min', 'dt_max'):
        if c.get(key):
            m[key] = c[key]
    return m


OPS = {'ssd_segment': OpDef(draw, segment, ('P', 'R'), _optional, _grads, _options)}


def ssd_segment(name, seed, B, T, H, P, N, G=1, d_state=True, **more):
    c = dict(op='ssd_segment', name=name, seed=seed, B=B, T=T, H=H, P=P, N=N, G=G,
             has_h0=False, d_state=d_state)
    c.update(more)
    return c


CASES = [
    # several chunks at every chunk size; D and z given although they do not enter, so their
    # gradients must come out zero; A small enough that P stays well above zero
    ssd_segment('ssd_segment_B2_T150_H2_P8_N4_G1_D_z', 1701, 2, 150, 2, 8, 4, has_z=True,
                A_mag=1.05, dt_draw_max=0.02),
    # groups, per-channel D, softplus with the dt clamp, N-first states
    ssd_segment('ssd_segment_B1_T40_H6_P4_N3_G3_Dchan_softplus_clamp_nfirst', 1702, 1, 40, 6,
                4, 3, G=3, D_per_channel=True, dt_softplus=True, dt_min=0.01, dt_max=0.1,
                state_n_first=True),
    # packed sequences with an empty one (P = 1, R = 0), no D, no upstream gradient of R
    ssd_segment('ssd_segment_varlen3_B1_T70_H4_P8_N4_G2_noD_nodR_empty', 1703, 1, 70, 4, 8, 4,
                G=2, has_D=False, d_state=False, cu=[0, 30, 30, 70]),
]

# Tiny versions of every option for the gradient self-check (finite differences).
CHECKS = [
    ssd_segment('ssd_segment_plain_z', 25, 1, 3, 2, 2, 2, has_z=True),
    ssd_segment('ssd_segment_groups_softplus_clamp_varlen', 26, 1, 4, 4, 2, 2, G=2,
                dt_softplus=True, dt_min=0.01, dt_max=0.05, state_n_first=True,
                cu=[0, 1, 1, 4]),
]
