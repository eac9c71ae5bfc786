"""Every op the generator knows, one entry each in OPS: how a case draws its inputs
(draw.py), the op's float64 definition (ops.py), its outputs, the optional inputs that are
zeros when absent, the gradient files a case lists, and its meta.json options.

The other modules reach an op only through op_def(name), which raises for an op with no
entry: an op missing here is an error that names it, never another op's branch. The C test
test_op_coverage checks that every op of the library's op table has generated cases, so a
new op of the table fails there, named, until its entry and cases are written here.
"""
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

import draw
import ops


@dataclass(frozen=True)
class OpDef:
    draw: Callable        # (rng, case) -> {input name: float64 array}
    forward: Callable     # (values, case) -> {output name: Value}
    outputs: tuple        # the outputs' file names; d_<first> is always given upstream,
    #                       d_<second> (the state's) with the case's 'd_state'
    optional: Callable    # case -> {optional differentiable input: shape}: zeros when absent
    grads: Optional[Callable]  # (case, inputs) -> the inputs whose gradient files the case
    #                            lists; None for a forward-only op (no upstream, no gradients)
    options: Callable     # (case, arrays) -> meta.json's options and presence flags
    prepare: Optional[Callable] = None  # case -> case with derived options (KDA's scale)


def op_def(name):
    """The definition of op `name`; ValueError, naming it, when there is none."""
    if name not in OPS:
        raise ValueError(f'refgen: no definition of op {name!r} (defined: {", ".join(OPS)})')
    return OPS[name]


def _state_rows(c):
    return len(c['cu']) - 1 if 'cu' in c else c['B']


def _with_state_grad(c, inputs, state, names):
    """names, plus the initial state's when it is given or asked for at zeros."""
    return names + ([state] if state in inputs or c.get('dstate_at_zero') else [])


# KDA and its segment summary ------------------------------------------------------------

def _kda_prepare(c):
    """The scale as the float32 the library gets from meta.json."""
    return dict(c, scale=float(np.float32(c.get('scale') or c['K'] ** -0.5)))


def _kda_optional(c):
    HV, K, V = c.get('HV') or c['H'], c['K'], c['V']
    state = (V, K) if c.get('state_v_first') else (K, V)
    return {'h0': (_state_rows(c), HV) + state, 'A_log': (HV,),
            'dt_bias': (HV * K,) if c.get('decay') == 'per_channel' else (HV,)}


def _kda_grads(c, inputs, with_h0=True):
    names = ['q', 'k', 'v', 'beta'] + (['g'] if (c.get('decay') or 'none') != 'none' else [])
    names = _with_state_grad(c, inputs, 'h0', names) if with_h0 else names
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


# SSM1 and its segment summary -----------------------------------------------------------

def _ssm1_optional(c):
    return {'h0': (_state_rows(c), c['D'], c['N']), 'D': (c['D'],), 'dt_bias': (c['D'],)}


def _ssm1_grads(c, inputs, with_h0=True):
    names = ['x', 'dt', 'A', 'B', 'C'] + [n for n in ('D', 'gate') if n in inputs]
    names = _with_state_grad(c, inputs, 'h0', names) if with_h0 else names
    return names + (['dt_bias'] if c.get('dt_softplus') else [])


def _ssm1_options(c, arrays, with_state=True):
    m = dict(dt_softplus=bool(c.get('dt_softplus')), gate_activation=c['gate_activation'],
             has_gate='gate' in arrays)
    if with_state:
        m.update(has_h0='h0' in arrays, has_dhT=bool(c['d_state']))
    m['varlen'] = 'cu' in c
    return m


# The standalone KDA gate and the causal conv1d ------------------------------------------

def _gate_optional(c):
    per_channel = c['decay'] == 'per_channel'
    return {'A_log': (c['H'],), 'dt_bias': (c['H'] * c['K'],) if per_channel else (c['H'],)}


def _conv_optional(c):
    return {'bias': (c['D'],), 'conv_state': (_state_rows(c), c['D'], c['W'] - 1)}


def _conv_grads(c, inputs):
    names = ['x', 'weight'] + (['bias'] if 'bias' in inputs else [])
    return _with_state_grad(c, inputs, 'conv_state', names)


def _conv_options(c, arrays):
    return dict(activation=c['activation'], has_bias='bias' in arrays,
                has_state='conv_state' in arrays, varlen='cu' in c)


# The EMA, the template op (forward-only) --------------------------------------------------

def _ema_options(c, arrays):
    return dict(has_h0='h0' in arrays)


OPS = {
    'kda': OpDef(draw.kda, ops.kda, ('o', 'ht'), _kda_optional, _kda_grads, _kda_options,
                 _kda_prepare),
    'kda_gate': OpDef(draw.kda_gate, ops.kda_gate, ('g',), _gate_optional,
                      lambda c, inputs: ['g_raw', 'A_log', 'dt_bias'],
                      lambda c, arrays: dict(decay=c['decay'], lower_bound=c.get('lower_bound'))),
    'ssm1': OpDef(draw.ssm1, ops.ssm1, ('y', 'hT'), _ssm1_optional, _ssm1_grads,
                  _ssm1_options),
    'causal_conv1d': OpDef(draw.causal_conv1d, ops.causal_conv1d, ('y', 'conv_state_out'),
                           _conv_optional, _conv_grads, _conv_options),
    # The summaries start from zeros: no h0 and no dh0 (the case has none to list).
    'kda_segment': OpDef(draw.kda, ops.kda_segment, ('P', 'R'), _kda_optional,
                         lambda c, inputs: _kda_grads(c, inputs, with_h0=False),
                         lambda c, arrays: _kda_options(c, arrays, with_state=False),
                         _kda_prepare),
    'ssm1_segment': OpDef(draw.ssm1, ops.ssm1_segment, ('P', 'R'), _ssm1_optional,
                          lambda c, inputs: _ssm1_grads(c, inputs, with_h0=False),
                          lambda c, arrays: _ssm1_options(c, arrays, with_state=False)),
    'ema': OpDef(draw.ema, ops.ema, ('y', 'hT'), lambda c: {'h0': (c['B'], c['D'])}, None,
                 _ema_options),
}
