"""The KDA / Gated DeltaNet gate on NumPy arrays: the problem (GateInputs), forward and
backward."""

import ctypes

from .. import _lib
from .._arrays import as_f32_ndim, ptr
from ._common import (check_inputs, gate_bias, grads, lower_bound_option, make_exec,
                      optional, outputs, upstream)


class GateInputs:
    """g_raw [B,T,H,K] with dt_bias [H*K] or [H,K] (per channel), or g_raw [B,T,H] with
    dt_bias [H] (per head); A_log [H]. lower_bound None = the default form."""

    def __init__(self, g_raw, A_log=None, dt_bias=None, lower_bound=None):
        self.g_raw = as_f32_ndim(g_raw, "gate", (3, 4), "gate of shape [B,T,H,K] or [B,T,H]")
        per_channel = self.g_raw.ndim == 4
        B, T, H = self.g_raw.shape[:3]
        K = self.g_raw.shape[3] if per_channel else 0
        self.A_log = optional(A_log, "A_log", (H,), "[H]")
        self.dt_bias, self.dt_bias_shape = gate_bias(dt_bias, per_channel, H, K, "H")
        lower_bound = lower_bound_option(lower_bound)
        self.problem = _lib.KdaGateProblem(
            B=B, T=T, H=H, K=K,
            decay=_lib.DECAY_PER_CHANNEL if per_channel else _lib.DECAY_PER_HEAD,
            g_raw=ptr(self.g_raw), A_log=ptr(self.A_log), dt_bias=ptr(self.dt_bias),
            lower_bound=0.0 if lower_bound is None else float(lower_bound))
        check_inputs("kda_gate", self)


def kda_gate_forward(inputs, *, threads=0):
    ex = make_exec(threads=threads)
    (g,), out = outputs("kda_gate", inputs, final_state=False)
    _lib.check(_lib.lib.linseq_kda_gate_forward(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                                *out))
    return g


def kda_gate_backward(inputs, d_g, *, threads=0, wanted=None):
    """dict of dg_raw, dA_log, ddt_bias (the gradients of sum(g * d_g))."""
    ex = make_exec(threads=threads)
    (d_g,) = upstream("kda_gate", inputs, (d_g,))
    out, grads_struct = grads("kda_gate", inputs, wanted)
    _lib.check(_lib.lib.linseq_kda_gate_backward(ctypes.byref(inputs.problem),
                                                 ctypes.byref(ex), ptr(d_g),
                                                 ctypes.byref(grads_struct)))
    if "ddt_bias" in out and inputs.dt_bias_shape is not None:
        out["ddt_bias"] = out["ddt_bias"].reshape(inputs.dt_bias_shape)
    return out

