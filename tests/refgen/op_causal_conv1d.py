"""The causal depthwise conv1d (docs/semantics.md): how a case draws its inputs, its float64
definition on the tape, its entry (OPS) and its cases (CASES, and CHECKS for the gradient
self-check)."""
from opdef import OpDef, state_rows, with_state_grad
from ops import activation, sequences
from tape import concat, stack


def draw(rng, c):
    B, T, D, W = (c[n] for n in 'BTDW')
    rows = len(c['cu']) - 1 if 'cu' in c else B
    x = {'x': rng.standard_normal((B, T, D)), 'weight': rng.normal(0, 0.5, (D, W))}
    if c.get('has_bias'):
        x['bias'] = rng.standard_normal((D,))
    if c.get('has_state'):
        x['conv_state'] = rng.standard_normal((rows, D, W - 1))
    return x


def forward(x, m):
    B, T, D, W = (m[n] for n in 'BTDW')
    spans = sequences(m, T) or [(b, 0, T) for b in range(B)]
    act = m.get('activation') or 'identity'
    y_rows, finals = {}, []
    for row, start, end in spans:
        b = 0 if 'cu' in m else row
        # the window: the state (oldest input first), then the sequence's inputs
        xs = concat([x['conv_state'][row]] +
                    [x['x'][b, t].reshape(D, 1) for t in range(start, end)], axis=1)
        for i, t in enumerate(range(start, end)):
            z = (x['weight'] * xs[:, i:i + W]).sum(axis=1)   # weight[:, W-1] hits x_t
            y_rows[(b, t)] = activation(act, z + x['bias'])
        finals.append(xs[:, xs.shape[1] - (W - 1):])
    y = stack([stack([y_rows[(b, t)] for t in range(T)]) for b in range(B)])
    return {'y': y, 'conv_state_out': stack(finals)}


def _conv_optional(c):
    return {'bias': (c['D'],), 'conv_state': (state_rows(c), c['D'], c['W'] - 1)}


def _conv_grads(c, inputs):
    names = ['x', 'weight'] + (['bias'] if 'bias' in inputs else [])
    return with_state_grad(c, inputs, 'conv_state', names)


def _conv_options(c, arrays):
    return dict(activation=c['activation'], has_bias='bias' in arrays,
                has_state='conv_state' in arrays, varlen='cu' in c)


OPS = {
    'causal_conv1d': OpDef(draw, forward, ('y', 'conv_state_out'), _conv_optional,
                           _conv_grads, _conv_options),
}


def conv(name, seed, B, T, D, W, act, bias=True, state=True, d_state=False, **more):
    c = dict(op='causal_conv1d', name=name, seed=seed, B=B, T=T, D=D, W=W, activation=act,
             has_bias=bias, has_state=state, d_state=d_state)
    c.update(more)
    return c


CASES = [
    # causal conv1d. The first one: tests/check_cli_errors.sh and fuzz/make_seeds.py.
    conv('conv_B1_T2_D8_W4_none_nobias_state', 1301, 1, 2, 8, 4, None, bias=False),
    conv('conv_B2_T5_D4_W1_silu_bias_nostate', 1302, 2, 5, 4, 1, 'silu', state=False),
    conv('conv_B1_T9_D6_W2_none_bias_state_dstate', 1303, 1, 9, 6, 2, None, d_state=True),
    conv('conv_B2_T33_D8_W4_silu_bias_state', 1304, 2, 33, 8, 4, 'silu'),
    conv('conv_B2_T2_D8_W4_none_bias_nostate_dstate0', 1305, 2, 2, 8, 4, None, state=False,
         dstate_at_zero=True),
    conv('conv_B1_T1_D5_W4_silu_nobias_state_dstate', 1306, 1, 1, 5, 4, 'silu', bias=False,
         d_state=True),
    conv('conv_varlen3_B1_T10_D4_W3_sigmoid_bias_state_empty', 1307, 1, 10, 4, 3, 'sigmoid',
         cu=[0, 1, 1, 10], d_state=True),
    conv('conv_B1_T7_D4_W4_gelu_tanh_bias_state', 1308, 1, 7, 4, 4, 'gelu_tanh'),
    conv('conv_B1_T6_D3_W3_relu_bias_nostate', 1309, 1, 6, 3, 3, 'relu', state=False),
    conv('conv_B1_T4_D3_W2_identity_nobias_nostate', 1310, 1, 4, 3, 2, 'identity', bias=False,
         state=False),
]

# Tiny versions of every option for the gradient self-check (finite differences).
CHECKS = [
    conv('conv_silu', 13, 1, 4, 2, 3, 'silu', d_state=True),
    conv('conv_short_nostate', 14, 2, 1, 2, 4, 'gelu_tanh', state=False, dstate_at_zero=True,
         d_state=True),
    conv('conv_varlen_sigmoid', 15, 1, 4, 2, 2, 'sigmoid', cu=[0, 3, 3, 4], d_state=True),
]
