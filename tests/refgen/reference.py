"""One case's outputs and gradients in float64: the op of ops.py on the tape, the loss
sum(out * d_out) over the upstream gradients given, and the tape's gradients of that loss."""
import numpy as np

import ops
from tape import Value, grad


def _optional_zeros(c):
    """Every optional differentiable input: its shape, so that an absent one is zeros."""
    op = c['op']
    if op == 'kda':
        HV, K, V = c.get('HV') or c['H'], c['K'], c['V']
        rows = len(c['cu']) - 1 if 'cu' in c else c['B']
        per_channel = c.get('decay') == 'per_channel'
        state = (V, K) if c.get('state_v_first') else (K, V)
        return {'h0': (rows, HV) + state, 'A_log': (HV,),
                'dt_bias': (HV * K,) if per_channel else (HV,)}
    if op == 'kda_gate':
        per_channel = c['decay'] == 'per_channel'
        return {'A_log': (c['H'],), 'dt_bias': (c['H'] * c['K'],) if per_channel else (c['H'],)}
    if op == 'ssm1':
        rows = len(c['cu']) - 1 if 'cu' in c else c['B']
        return {'h0': (rows, c['D'], c['N']), 'D': (c['D'],), 'dt_bias': (c['D'],)}
    if op == 'ema':
        return {'h0': (c['B'], c['D'])}
    rows = len(c['cu']) - 1 if 'cu' in c else c['B']
    return {'bias': (c['D'],), 'conv_state': (rows, c['D'], c['W'] - 1)}


OUTPUTS = {'kda': ['o', 'ht'], 'kda_gate': ['g'], 'ssm1': ['y', 'hT'],
           'causal_conv1d': ['y', 'conv_state_out'], 'ema': ['y', 'hT']}
# Ops without a backward: their cases have no upstream gradients and no gradients.
FORWARD_ONLY = {'ema'}


def grad_names(c, inputs):
    """The gradient files of the case: those the options make computable, as 'd' + input."""
    op = c['op']
    if op in FORWARD_ONLY:
        return []
    if op == 'kda':
        names = ['q', 'k', 'v', 'beta'] + (['g'] if (c.get('decay') or 'none') != 'none' else [])
        names += ['h0'] if 'h0' in inputs or c.get('dstate_at_zero') else []
        names += ['A_log', 'dt_bias'] if c.get('gate_in_kernel') else []
    elif op == 'kda_gate':
        names = ['g_raw', 'A_log', 'dt_bias']
    elif op == 'ssm1':
        names = ['x', 'dt', 'A', 'B', 'C'] + [n for n in ('D', 'gate') if n in inputs]
        names += ['h0'] if 'h0' in inputs or c.get('dstate_at_zero') else []
        names += ['dt_bias'] if c.get('dt_softplus') else []
    else:
        names = ['x', 'weight'] + (['bias'] if 'bias' in inputs else [])
        names += ['conv_state'] if 'conv_state' in inputs or c.get('dstate_at_zero') else []
    return names


def forward(c, arrays):
    """(outputs {name: Value}, differentiable inputs {name: Value}) from float arrays."""
    values = {n: Value(a) for n, a in arrays.items() if n != 'cu_seqlens'}
    for name, shape in _optional_zeros(c).items():
        values.setdefault(name, Value(np.zeros(shape)))
    return ops.OPS[c['op']](values, c), values


def loss_of(outputs, upstream):
    total = None
    for name, out in outputs.items():
        d = upstream.get('d_' + name)
        if d is not None:
            term = (out * d).sum()
            total = term if total is None else total + term
    return total


def evaluate(c, arrays, upstream):
    """({output: float64 array}, {grad file: float64 array}) of one case."""
    outputs, values = forward(c, arrays)
    names = grad_names(c, arrays)
    grads = grad(loss_of(outputs, upstream), [values[n] for n in names])
    return ({n: outputs[n].data for n in OUTPUTS[c['op']]},
            {'d' + n: g for n, g in zip(names, grads)})
