"""The EMA, the template op (forward-only, with a decode step: docs/semantics.md): how a
case draws its inputs, its float64 definition on the tape, its entry (OPS) and its cases.
A forward-only op has no gradients (grads None), and so no CHECKS."""
from opdef import OpDef
from tape import stack


def draw(rng, c):
    """a in [0, 1] with both ends present (D >= 2), as the op allows."""
    B, T, D = (c[n] for n in 'BTD')
    a = rng.uniform(0, 1, (D,))
    a[0], a[-1] = 0.0, 1.0
    x = {'x': rng.standard_normal((B, T, D)), 'a': a}
    if c.get('has_h0'):
        x['h0'] = rng.standard_normal((B, D))
    return x


def forward(x, m):
    """Per channel: s = a s + (1 - a) x_t, y_t = s, from s = h0 (zeros when absent)."""
    B, T = m['B'], m['T']
    ys, finals = [], []
    for b in range(B):
        s, rows = x['h0'][b], []
        for t in range(T):
            s = x['a'] * s + (1.0 - x['a']) * x['x'][b, t]
            rows.append(s)
        ys.append(stack(rows))
        finals.append(s)
    return {'y': stack(ys), 'hT': stack(finals)}


def _ema_options(c, arrays):
    return dict(has_h0='h0' in arrays)


OPS = {
    'ema': OpDef(draw, forward, ('y', 'hT'), lambda c: {'h0': (c['B'], c['D'])}, None,
                 _ema_options),
}


def ema(name, seed, B, T, D, h0=True):
    return dict(op='ema', name=name, seed=seed, B=B, T=T, D=D, has_h0=h0)


CASES = [
    # EMA (forward-only): D past one 64-channel block, and without h0.
    ema('ema_B2_T9_D70_h0', 1401, 2, 9, 70),
    ema('ema_B1_T1_D3_noh0', 1402, 1, 1, 3, h0=False),
    ema('ema_B3_T33_D5_h0', 1403, 3, 33, 5),
]
