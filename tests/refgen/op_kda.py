"""KDA (the chunked delta rule with decays: docs/semantics.md) and its segment summary: how
a case draws their inputs, their float64 definitions on the tape, their entries (OPS) and
their cases (CASES, and CHECKS for the gradient self-check)."""
import numpy as np

from opdef import OpDef, state_rows, with_state_grad
from ops import kda_decay_from_gate, sequences
from tape import Value, einsum, exp, sigmoid, sqrt, stack

L2NORM_EPS = 1e-6


# Inputs ----------------------------------------------------------------------------------

def _kda_decay(rng, shape, style, mag):
    """Log decays <= 0. 'rand': -mag*U(0,2). 'heavy': a heavy tail (rare tokens decay a lot).
    'spikes': 'rand' plus a few tokens between -30 and -150, so that the decay summed over
    one chunk goes far below what exp() can undo in float32. 'hard': every token in
    (-2 mag, -mag), so that each forgets almost all of the state and dg is ~e^-mag small
    next to the other gradients: a backward must not leave rounding of O(1) terms in it."""
    if style == 'hard':
        return -mag * rng.uniform(1, 2, shape)
    g = -mag * rng.uniform(0, 2, shape)
    if style == 'heavy':
        g = -mag * rng.exponential(1.0, shape) ** 2
    elif style == 'spikes':
        spikes = rng.uniform(0, 1, shape) < 0.08
        g = np.where(spikes, -rng.uniform(30, 150, shape), g)
    return g


def _unit_rows(rng, shape, lo, hi):
    """Rows of norm U(lo,hi) over the last axis: keeps beta |k|^2 < 2 without l2norm."""
    x = rng.standard_normal(shape)
    norm = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    return x / norm * rng.uniform(lo, hi, shape[:-1] + (1,))


def draw(rng, c):
    B, T, H, K, V = (c[n] for n in 'BTHKV')
    HV = c.get('HV') or H
    rows = len(c['cu']) - 1 if 'cu' in c else B
    decay = c.get('decay') or 'none'
    g_shape = (B, T, HV, K) if decay == 'per_channel' else (B, T, HV)
    x = {'q': rng.standard_normal((B, T, H, K))}
    x['k'] = (rng.standard_normal((B, T, H, K)) if c.get('use_qk_l2norm')
              else _unit_rows(rng, (B, T, H, K), 0.6, 1.2))
    x['v'] = rng.standard_normal((B, T, HV, V))
    if not c.get('no_delta'):  # without beta: gated linear attention
        x['beta'] = (rng.normal(0, 1.5, (B, T, HV)) if c.get('beta_is_logit')
                     else rng.uniform(0.05, 0.95, (B, T, HV)))
    if c.get('gate_in_kernel') and c.get('g_style') == 'hard':
        # softplus(g + dt_bias) in about (0.85, 1.6) times e^A_log = g_mag: g in about
        # (-1.6 g_mag, -0.85 g_mag) on every token
        x['g'] = rng.uniform(0.5, 1.2, g_shape)
        x['A_log'] = np.full((HV,), np.log(c['g_mag']))
        x['dt_bias'] = rng.uniform(-0.2, 0.2, (HV * K,) if decay == 'per_channel' else (HV,))
    elif c.get('gate_in_kernel'):
        x['g'] = rng.normal(0, 2, g_shape)
        x['A_log'] = rng.uniform(-1, 1.5, (HV,))
        x['dt_bias'] = rng.normal(0, 0.5, (HV * K,) if decay == 'per_channel' else (HV,))
    elif decay != 'none':
        x['g'] = _kda_decay(rng, g_shape, c.get('g_style', 'rand'), c.get('g_mag', 0.3))
    if c.get('has_h0'):
        state = (V, K) if c.get('state_v_first') else (K, V)
        x['h0'] = rng.normal(0, 0.5, (rows, HV) + state)
    return x


# The definitions -------------------------------------------------------------------------

def _l2norm(x):
    return x / sqrt((x * x).sum(axis=-1, keepdims=True) + L2NORM_EPS)


def _kda_token(S, q, k, v, beta, g, decay):
    """One token for every value head: S [HV,K,V]; returns (new S, o [HV,V]). beta None:
    no delta rule, the write is k v^T."""
    if decay == 'per_channel':
        S = exp(g).reshape(*g.shape, 1) * S          # decay first
    elif decay == 'per_head':
        S = exp(g).reshape(g.shape[0], 1, 1) * S
    u = v if beta is None else \
        beta.reshape(beta.shape[0], 1) * (v - einsum('hkv,hk->hv', S, k))  # vs decayed S
    S = S + einsum('hk,hv->hkv', k, u)                # rank-1 write
    return S, einsum('hkv,hk->hv', S, q)               # read the updated state


def forward(x, m):
    """x: q k v beta [g] h0 [A_log dt_bias] as Values; m: the options."""
    B, T, H, K, V = (m[n] for n in 'BTHKV')
    HV = m.get('HV') or H
    decay = m.get('decay') or 'none'
    head_of = np.arange(HV) // (HV // H)               # value head hv reads q/k head hv/G
    g = x.get('g')
    if m.get('gate_in_kernel'):
        A_log = x['A_log'].reshape(HV, 1) if decay == 'per_channel' else x['A_log']
        bias = x['dt_bias'].reshape(HV, K) if decay == 'per_channel' else x['dt_bias']
        g = kda_decay_from_gate(g, A_log, bias, m.get('lower_bound') or 0.0)
    beta = x.get('beta')
    if beta is not None and m.get('beta_is_logit'):
        beta = sigmoid(beta)
    h0 = x['h0'].transpose(0, 1, 3, 2) if m.get('state_v_first') else x['h0']
    spans = sequences(m, T) or [(b, 0, T) for b in range(B)]
    o_rows, finals = {}, []
    for row, start, end in spans:
        b = 0 if 'cu' in m else row
        S = h0[row]
        for t in range(start, end):
            q, k = x['q'][b, t][head_of], x['k'][b, t][head_of]
            if m.get('use_qk_l2norm'):
                q, k = _l2norm(q), _l2norm(k)
            q = m['scale'] * q                          # scale after the norm
            S, o = _kda_token(S, q, k, x['v'][b, t], None if beta is None else beta[b, t],
                              None if g is None else g[b, t], decay)
            o_rows[(b, t)] = o
        finals.append(S)
    o = stack([stack([o_rows[(b, t)] for t in range(T)]) for b in range(B)])
    ht = stack(finals)
    return {'o': o, 'ht': ht.transpose(0, 1, 3, 2) if m.get('state_v_first') else ht}


def segment(x, m):
    """KDA's segment summary: S_end = P S_start + R per (sequence, value head). R is the end
    state from zeros; P [K,K] the product of the tokens' (I - beta k k^T) diag(exp g), which is
    the end state of the same recurrence run from the identity with v = 0 (K-major whatever
    the state layout). q enters neither."""
    B, T, K = m['B'], m['T'], m['K']
    HV = m.get('HV') or m['H']
    rows = len(m['cu']) - 1 if 'cu' in m else B
    R = forward(x, m)['ht']
    eye = Value(np.broadcast_to(np.eye(K), (rows, HV, K, K)).copy())
    to_P = dict(x, v=Value(np.zeros((B, T, HV, K))), h0=eye)
    P = forward(to_P, dict(m, V=K, state_v_first=False))['ht']
    return {'P': P, 'R': R}


# The entries -----------------------------------------------------------------------------

def _kda_prepare(c):
    """The scale as the float32 the library gets from meta.json."""
    return dict(c, scale=float(np.float32(c.get('scale') or c['K'] ** -0.5)))


def _kda_optional(c):
    HV, K, V = c.get('HV') or c['H'], c['K'], c['V']
    state = (V, K) if c.get('state_v_first') else (K, V)
    return {'h0': (state_rows(c), HV) + state, 'A_log': (HV,),
            'dt_bias': (HV * K,) if c.get('decay') == 'per_channel' else (HV,)}


def _kda_grads(c, inputs, with_h0=True):
    names = ['q', 'k', 'v'] + ([] if c.get('no_delta') else ['beta']) + (['g'] if (c.get('decay') or 'none') != 'none' else [])
    names = with_state_grad(c, inputs, 'h0', names) if with_h0 else names
    return names + (['A_log', 'dt_bias'] if c.get('gate_in_kernel') else [])


def _kda_options(c, arrays, with_state=True):
    """with_state: the flags of h0 and of d_ht (the summary has neither)."""
    m = dict(decay=c['decay'], use_qk_l2norm=c['use_qk_l2norm'],
             beta_is_logit=bool(c.get('beta_is_logit')),
             state_v_first=bool(c.get('state_v_first')),
             gate_in_kernel=bool(c.get('gate_in_kernel')), scale=c['scale'],
             scale_is_default='scale' not in c['given'], lower_bound=c.get('lower_bound'),
             varlen='cu' in c)
    if with_state:
        m.update(has_h0='h0' in arrays, has_dht=bool(c['d_state']))
    m['g_style'] = c.get('g_style', 'rand')
    return m


OPS = {
    'kda': OpDef(draw, forward, ('o', 'ht'), _kda_optional, _kda_grads, _kda_options,
                 _kda_prepare),
    # The summary starts from zeros: no h0 and no dh0 (the case has none to list).
    'kda_segment': OpDef(draw, segment, ('P', 'R'), _kda_optional,
                         lambda c, inputs: _kda_grads(c, inputs, with_h0=False),
                         lambda c, arrays: _kda_options(c, arrays, with_state=False),
                         _kda_prepare),
}


# The cases (what a case holds: opdef.py) -------------------------------------------------

def kda(name, seed, B, T, H, K, V, decay, l2=True, h0=True, d_state=True, **more):
    c = dict(op='kda', name=name, seed=seed, B=B, T=T, H=H, K=K, V=V, decay=decay,
             use_qk_l2norm=l2, has_h0=h0, d_state=d_state)
    c.update(more)
    return c


def kda_segment(name, seed, B, T, H, K, V, decay, l2=True, d_state=True, **more):
    """The summary starts from zeros (no h0); d_state: the upstream gradient of R too."""
    return dict(kda(name, seed, B, T, H, K, V, decay, l2=l2, h0=False, d_state=d_state, **more),
                op='kda_segment')


CASES = [
    # KDA. The first one is small on purpose: tests/check_cli_errors.sh edits copies of it.
    kda('kda_pc_B1_T1_H1_K16_V16_g0.3_l2_h0', 1001, 1, 1, 1, 16, 16, 'per_channel'),
    kda('kda_pc_B2_T37_H2_K8_V8_g1.0_l2_h0', 1002, 2, 37, 2, 8, 8, 'per_channel', g_mag=1.0),
    kda('kda_pc_B1_T70_H1_K16_V8_spikes_nol2_noh0_dh0', 1003, 1, 70, 1, 16, 8, 'per_channel',
        l2=False, h0=False, g_style='spikes', dstate_at_zero=True),
    kda('kda_pc_B1_T40_H2_K8_V8_heavy2.0_l2_h0_scale1', 1004, 1, 40, 2, 8, 8, 'per_channel',
        g_style='heavy', g_mag=2.0, scale=1.0),
    kda('kda_ph_B2_T20_H2_K8_V16_g0.3_l2_h0_nodht', 1005, 2, 20, 2, 8, 16, 'per_head',
        d_state=False),
    kda('kda_ph_B1_T140_H1_K8_V8_spikes_l2_h0', 1006, 1, 140, 1, 8, 8, 'per_head',
        g_style='spikes'),
    kda('kda_none_B1_T33_H2_K8_V8_l2_h0', 1007, 1, 33, 2, 8, 8, 'none'),
    kda('kda_none_B2_T5_H1_K4_V4_nol2_noh0', 1008, 2, 5, 1, 4, 4, 'none', l2=False, h0=False),
    kda('kda_gva_pc_B1_T24_H2_HV4_K8_V8_g0.3_l2_h0_scale0.5', 1009, 1, 24, 2, 8, 8,
        'per_channel', HV=4, scale=0.5),
    kda('kda_vfirst_ph_B2_T17_H1_K8_V12_logit_l2_h0', 1010, 2, 17, 1, 8, 12, 'per_head',
        state_v_first=True, beta_is_logit=True, g_mag=1.0),
    kda('kda_gik_pc_B1_T40_H2_K8_V8_l2_h0', 1011, 1, 40, 2, 8, 8, 'per_channel',
        gate_in_kernel=True),
    kda('kda_gik_ph_lb-5_B2_T20_H1_HV2_K8_V8_vfirst_logit_nol2_noh0', 1012, 2, 20, 1, 8, 8,
        'per_head', HV=2, gate_in_kernel=True, lower_bound=-5.0, state_v_first=True,
        beta_is_logit=True, l2=False, h0=False),
    kda('kda_varlen4_pc_B1_T50_H2_K8_V8_g1.0_l2_h0_empty', 1013, 1, 50, 2, 8, 8,
        'per_channel', cu=[0, 20, 20, 45, 50], g_mag=1.0, N=4),
    kda('kda_varlen3_ph_B1_T30_H1_HV2_K8_V8_gik_nol2_noh0_dh0', 1014, 1, 30, 1, 8, 8,
        'per_head', cu=[0, 0, 12, 30], HV=2, gate_in_kernel=True, l2=False, h0=False,
        dstate_at_zero=True),
    # Every token decaying hard (per-head as fla's Gated DeltaNet tests draw it, per-channel,
    # and through the in-kernel gate): dg is ~1e-11 and below while the other gradients are
    # O(1), and must still match relative to its own scale in every chunk size.
    kda('kda_hard_pc_B1_T140_H1_K16_V8_g25_l2_h0', 1015, 1, 140, 1, 16, 8, 'per_channel',
        g_style='hard', g_mag=25.0),
    kda('kda_hard_ph_B2_T140_H2_K8_V8_g34.5_nol2_h0', 1016, 2, 140, 2, 8, 8, 'per_head',
        l2=False, g_style='hard', g_mag=34.5),
    kda('kda_hard_gik_pc_B1_T140_H1_HV2_K8_V8_g30_l2_h0', 1017, 1, 140, 1, 8, 8,
        'per_channel', HV=2, gate_in_kernel=True, g_style='hard', g_mag=30.0),
    # Without beta: gated linear attention (fla's GLA, simple GLA, plain linear attention).
    kda('kda_gla_pc_B2_T70_H2_K8_V8_g0.3_nol2_h0', 1018, 2, 70, 2, 8, 8, 'per_channel',
        l2=False, no_delta=True),
    kda('kda_gla_varlen2_ph_B1_T40_H2_K8_V8_g0.5_nol2_h0', 1021, 1, 40, 2, 8, 8, 'per_head',
        cu=[0, 15, 40], N=2, l2=False, g_mag=0.5, no_delta=True),
    kda('kda_gla_varlen3_ph_B1_T90_H2_K8_V16_gik_nol2_h0_empty', 1019, 1, 90, 2, 8, 16,
        'per_head', cu=[0, 40, 40, 90], N=3, gate_in_kernel=True, l2=False, no_delta=True),
    kda('kda_gla_none_B1_T33_H1_K4_V8_vfirst_l2_noh0_dh0', 1020, 1, 33, 1, 4, 8, 'none',
        state_v_first=True, h0=False, dstate_at_zero=True, no_delta=True),
    # The segment summary (context parallelism): P and R of every sequence, T across chunk
    # boundaries; q is given although it does not enter, so its gradient must come out zero.
    kda_segment('kda_segment_pc_B2_T37_H2_K8_V8_g0.05_l2', 1401, 2, 37, 2, 8, 8, 'per_channel',
                g_mag=0.05),
    kda_segment('kda_segment_varlen3_ph_B1_T70_H1_HV2_K8_V4_g0.05_vfirst_logit_nol2', 1402, 1,
                70, 1, 8, 4, 'per_head', cu=[0, 25, 45, 70], N=3, HV=2, g_mag=0.05,
                state_v_first=True, beta_is_logit=True, l2=False),
    kda_segment('kda_segment_none_varlen2_B1_T20_H1_K4_V8_empty_nodR', 1403, 1, 20, 1, 4, 8,
                'none', cu=[0, 0, 20], N=2, d_state=False),
    kda_segment('kda_segment_gik_pc_lb-3_B2_T10_H1_K8_V8', 1404, 2, 10, 1, 8, 8, 'per_channel',
                gate_in_kernel=True, lower_bound=-3.0),
]

# Tiny versions of every option for the gradient self-check (finite differences).
CHECKS = [
    kda('pc', 1, 1, 3, 1, 3, 2, 'per_channel'),
    kda('ph_nol2_noh0', 2, 2, 3, 1, 3, 2, 'per_head', l2=False, h0=False,
        dstate_at_zero=True),
    kda('none_gva_vfirst_logit', 3, 1, 3, 1, 2, 3, 'none', HV=2, state_v_first=True,
        beta_is_logit=True, scale=0.7),
    kda('gik_pc', 4, 1, 3, 1, 3, 2, 'per_channel', gate_in_kernel=True, d_state=False),
    kda('gik_ph_lb', 5, 1, 3, 1, 2, 2, 'per_head', gate_in_kernel=True, lower_bound=-3.0),
    kda('varlen_empty', 6, 1, 4, 1, 2, 2, 'per_channel', cu=[0, 1, 1, 4]),
    kda('gla_pc_vfirst', 7, 1, 3, 1, 3, 2, 'per_channel', state_v_first=True, no_delta=True),
    kda('gla_gik_ph', 8, 1, 3, 1, 2, 2, 'per_head', gate_in_kernel=True, no_delta=True),
    kda_segment('kda_segment_pc', 16, 1, 3, 1, 3, 2, 'per_channel'),
    kda_segment('kda_segment_gik_vfirst_varlen', 17, 1, 4, 1, 2, 2, 'per_head', HV=2,
                gate_in_kernel=True, state_v_first=True, cu=[0, 1, 1, 4]),
]
