"""The standalone KDA gate (g from g_raw, A_log and dt_bias: docs/semantics.md): how a case
draws its inputs, its float64 definition on the tape, its entry (OPS) and its cases."""
import numpy as np

from opdef import OpDef
from ops import kda_decay_from_gate


def draw(rng, c):
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


def forward(x, m):
    A_log = x['A_log'].reshape(m['H'], 1) if m['decay'] == 'per_channel' else x['A_log']
    shape = (m['H'], m['K']) if m['decay'] == 'per_channel' else (m['H'],)
    g = kda_decay_from_gate(x['g_raw'], A_log, x['dt_bias'].reshape(*shape),
                            m.get('lower_bound') or 0.0)
    return {'g': g}


def _gate_optional(c):
    per_channel = c['decay'] == 'per_channel'
    return {'A_log': (c['H'],), 'dt_bias': (c['H'] * c['K'],) if per_channel else (c['H'],)}


OPS = {
    'kda_gate': OpDef(draw, forward, ('g',), _gate_optional,
                      lambda c, inputs: ['g_raw', 'A_log', 'dt_bias'],
                      lambda c, arrays: dict(decay=c['decay'], lower_bound=c.get('lower_bound'))),
}


def gate(name, seed, B, T, H, K, decay, **more):
    return dict(op='kda_gate', name=name, seed=seed, B=B, T=T, H=H, K=K, decay=decay, **more)


CASES = [
    gate('kda_gate_pc_B2_T8_H3_K8', 1101, 2, 8, 3, 8, 'per_channel'),
    gate('kda_gate_ph_B2_T8_H4_over20', 1102, 2, 8, 4, None, 'per_head', over_threshold=True),
    gate('kda_gate_pc_B1_T5_H2_K4_lb-5', 1103, 1, 5, 2, 4, 'per_channel', lower_bound=-5.0),
    gate('kda_gate_ph_B1_T6_H2_lb-2_noparams', 1104, 1, 6, 2, None, 'per_head',
         lower_bound=-2.0, has_params=False),
    gate('kda_gate_pc_B1_T4_H2_K3_over20_noparams', 1105, 1, 4, 2, 3, 'per_channel',
         over_threshold=True, has_params=False),
]

# Tiny versions of every option for the gradient self-check (finite differences).
CHECKS = [
    gate('gate_pc', 7, 1, 2, 2, 3, 'per_channel'),
    gate('gate_ph_lb', 8, 2, 2, 2, None, 'per_head', lower_bound=-4.0),
]
