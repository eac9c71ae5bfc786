"""One description per differentiable op, shared by the PyTorch and JAX front ends.

Each spec names the op's input arrays (in a fixed order), the gradient each one receives,
the shapes of its outputs (from the input shapes alone, which JAX needs while tracing), and
the forward and backward over NumPy arrays. A framework front end only moves tensors in and
out; what is computed lives here once.
"""

import dataclasses
from typing import Callable, Dict, Tuple

import numpy as np

from . import ops


# eq=False: specs are singletons, hashed by identity (JAX caches one function per spec)
@dataclasses.dataclass(frozen=True, eq=False)
class OpSpec:
    name: str
    arrays: Tuple[str, ...]
    grad_of: Dict[str, str]          # input array -> key of its gradient in the backward dict
    out_shapes: Callable             # (shapes: dict name -> tuple|None, n_seqs|None, opts)
    forward: Callable                # (inputs, opts, train) -> (list of outputs, saved)
    backward: Callable               # (inputs, opts, upstream list, saved, wanted) -> dict

    def inputs(self, arrays, cu_seqlens, opts):
        if self.name == "kda_gate":
            return opts.inputs(arrays)
        return opts.inputs(arrays, cu_seqlens)


def _zeros_if_none(value, shape):
    return np.zeros(shape, np.float32) if value is None else value


# KDA ---------------------------------------------------------------------------------------

def _kda_out_shapes(shapes, n_seqs, opts):
    B, T, H, K = shapes["q"]
    _, _, HV, V = shapes["v"]
    N = B if n_seqs is None else n_seqs
    state = (N, HV, V, K) if opts.state_v_first else (N, HV, K, V)
    return [(B, T, HV, V), state]


def _kda_forward(inputs, opts, train):
    if train:
        o, ht, saved = ops.kda_forward_train(inputs, **opts.run())
        return [o, ht], saved
    o, ht = ops.kda_forward(inputs, **opts.run())
    return [o, ht], None


def _kda_backward(inputs, opts, upstream, saved, wanted):
    d_o = _zeros_if_none(upstream[0], (inputs.B, inputs.T, inputs.HV, inputs.V))
    return ops.kda_backward(inputs, d_o, upstream[1], saved=saved, wanted=wanted, **opts.run())


KDA = OpSpec(
    "kda", ("q", "k", "v", "beta", "g", "h0", "A_log", "dt_bias"),
    {"q": "dq", "k": "dk", "v": "dv", "beta": "dbeta", "g": "dg", "h0": "dh0",
     "A_log": "dA_log", "dt_bias": "ddt_bias"},
    _kda_out_shapes, _kda_forward, _kda_backward)


# KDA gate ----------------------------------------------------------------------------------

def _gate_forward(inputs, opts, train):
    return [ops.kda_gate_forward(inputs)], None


def _gate_backward(inputs, opts, upstream, saved, wanted):
    d_g = _zeros_if_none(upstream[0], inputs.g_raw.shape)
    return ops.kda_gate_backward(inputs, d_g, wanted=wanted)


KDA_GATE = OpSpec(
    "kda_gate", ("g_raw", "A_log", "dt_bias"),
    {"g_raw": "dg_raw", "A_log": "dA_log", "dt_bias": "ddt_bias"},
    lambda shapes, n_seqs, opts: [shapes["g_raw"]], _gate_forward, _gate_backward)


# SSM1 --------------------------------------------------------------------------------------

def _ssm1_out_shapes(shapes, n_seqs, opts):
    B, T, D = shapes["x"]
    N = shapes["A"][1]
    return [(B, T, D), (B if n_seqs is None else n_seqs, D, N)]


def _ssm1_forward(inputs, opts, train):
    return list(ops.ssm1_forward(inputs)), None


def _ssm1_backward(inputs, opts, upstream, saved, wanted):
    d_y = _zeros_if_none(upstream[0], inputs.x.shape)
    return ops.ssm1_backward(inputs, d_y, upstream[1], wanted=wanted)


SSM1 = OpSpec(
    "ssm1", ("x", "dt", "A", "B", "C", "D", "gate", "h0", "dt_bias"),
    {"x": "dx", "dt": "ddt", "A": "dA", "B": "dB", "C": "dC", "D": "dD", "gate": "dgate",
     "h0": "dh0", "dt_bias": "ddt_bias"},
    _ssm1_out_shapes, _ssm1_forward, _ssm1_backward)


# causal conv1d -----------------------------------------------------------------------------

def _conv_out_shapes(shapes, n_seqs, opts):
    B, T, D = shapes["x"]
    W = shapes["weight"][-1]
    return [(B, T, D), (B if n_seqs is None else n_seqs, D, W - 1)]


def _conv_forward(inputs, opts, train):
    return list(ops.conv1d_forward(inputs)), None


def _conv_backward(inputs, opts, upstream, saved, wanted):
    d_y = _zeros_if_none(upstream[0], inputs.x.shape)
    return ops.conv1d_backward(inputs, d_y, upstream[1], wanted=wanted)


CONV1D = OpSpec(
    "conv1d", ("x", "weight", "bias", "conv_state"),
    {"x": "dx", "weight": "dweight", "bias": "dbias", "conv_state": "dconv_state"},
    _conv_out_shapes, _conv_forward, _conv_backward)
