"""What the ops' float64 definitions (op_*.py, docs/semantics.md) share: the activations by
their meta.json names, the KDA gate's decay, and the sequences of a case.

Each op takes its inputs as tape Values (an absent optional tensor is passed as zeros, so
that its gradient "at zeros" exists too) and the case's options (meta.json), and returns
its outputs as Values. Nothing there is tuned for speed: one loop step is one token of one
sequence, with the heads or channels of that token as array axes.
"""
import numpy as np

from tape import exp, relu, sigmoid, softplus, tanh

GELU_C = np.sqrt(2.0 / np.pi)


def activation(name, z):
    """The activations by their meta.json names; None is the caller's default."""
    if name == 'silu':
        return z * sigmoid(z)
    if name == 'sigmoid':
        return sigmoid(z)
    if name == 'gelu_tanh':
        return 0.5 * z * (1.0 + tanh(GELU_C * (z + 0.044715 * z * z * z)))
    if name == 'relu':
        return relu(z)
    if name in ('identity', 'none'):
        return z
    raise ValueError(f'unknown activation {name!r}')


def kda_decay_from_gate(g_raw, A_log, dt_bias, lower_bound):
    """The KDA gate: A_log broadcasts over what follows the head axis of g_raw."""
    a = exp(A_log)
    if lower_bound:
        return lower_bound * sigmoid(a * (g_raw + dt_bias))
    return -(a * softplus(g_raw + dt_bias))


def sequences(m, T):
    """(state row, first token, end token) of every sequence (varlen or batch rows)."""
    if 'cu' in m:
        cu = m['cu']
        return [(n, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]
    return None

