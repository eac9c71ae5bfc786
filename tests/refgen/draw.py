"""Random inputs for one case: which files an op takes with the case's options, and how
each is drawn (float32 values from a seeded PCG64 generator, so reruns are identical)."""
import numpy as np


def f32(a):
    return np.asarray(a, dtype=np.float32)


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


def kda(rng, c):
    B, T, H, K, V = (c[n] for n in 'BTHKV')
    HV = c.get('HV') or H
    rows = len(c['cu']) - 1 if 'cu' in c else B
    decay = c.get('decay') or 'none'
    g_shape = (B, T, HV, K) if decay == 'per_channel' else (B, T, HV)
    x = {'q': rng.standard_normal((B, T, H, K))}
    x['k'] = (rng.standard_normal((B, T, H, K)) if c.get('use_qk_l2norm')
              else _unit_rows(rng, (B, T, H, K), 0.6, 1.2))
    x['v'] = rng.standard_normal((B, T, HV, V))
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


def kda_gate(rng, c):
    B, T, H = c['B'], c['T'], c['H']
    per_channel = c['decay'] == 'per_channel'
    shape = (B, T, H, c['K']) if per_channel else (B, T, H)
    x = {'g_raw': rng.normal(0, 2, shape)}
    if c.get('over_threshold'):  # a few g_raw + dt_bias above softplus's threshold 20
        x['g_raw'] = np.where(rng.uniform(0, 1, shape) < 0.1, rng.uniform(21, 30, shape),
                              x['g_raw'])
    if c.get('has_params', True):
        x['A_log'] = rng.uniform(-1, 1.5, (H,))
        x['dt_bias'] = rng.normal(0, 0.5, (H * c['K'],) if per_channel else (H,))
    return x


def ssm1(rng, c):
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


def causal_conv1d(rng, c):
    B, T, D, W = (c[n] for n in 'BTDW')
    rows = len(c['cu']) - 1 if 'cu' in c else B
    x = {'x': rng.standard_normal((B, T, D)), 'weight': rng.normal(0, 0.5, (D, W))}
    if c.get('has_bias'):
        x['bias'] = rng.standard_normal((D,))
    if c.get('has_state'):
        x['conv_state'] = rng.standard_normal((rows, D, W - 1))
    return x


def inputs(c, rng, draw_op):
    """The case's input files as float32 arrays (cu_seqlens added as int64): draw_op is its
    op's draw function (defs.py)."""
    x = {name: f32(a) for name, a in draw_op(rng, c).items()}
    if 'cu' in c:
        x['cu_seqlens'] = np.asarray(c['cu'], dtype=np.int64)
    return x


def ema(rng, c):
    """a in [0, 1] with both ends present (D >= 2), as the op allows."""
    B, T, D = (c[n] for n in 'BTD')
    a = rng.uniform(0, 1, (D,))
    a[0], a[-1] = 0.0, 1.0
    x = {'x': rng.standard_normal((B, T, D)), 'a': a}
    if c.get('has_h0'):
        x['h0'] = rng.standard_normal((B, D))
    return x
