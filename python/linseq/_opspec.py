"""One description per differentiable op, shared by the PyTorch and JAX front ends.

Each spec names the op's input arrays (in a fixed order), the gradient each one receives,
the shapes of its outputs (from the input shapes alone, which JAX needs while tracing), and
the forward and backward over NumPy arrays. A framework front end only moves tensors in and
out; what is computed lives here once.
"""

import dataclasses
from typing import Callable, Dict, Tuple

import numpy as np

from . import _lib, ops


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


def _table_arrays(table_name):
    """The op's inputs in the C library's table order, and the gradient each receives (the
    table's grads name their input): one description, not a copy per front end."""
    op = next(o for o in _lib.op_table["ops"] if o["name"] == table_name)
    arrays = tuple(t["name"] for t in op["tensors"] if t["role"] == "input")
    grads = {t["grad_of"]: t["name"] for t in op["tensors"] if t["role"] == "grad"}
    return arrays, grads


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


KDA = OpSpec("kda", *_table_arrays("kda"), _kda_out_shapes, _kda_forward, _kda_backward)


# KDA gate ----------------------------------------------------------------------------------

def _gate_forward(inputs, opts, train):
    return [ops.kda_gate_forward(inputs)], None


def _gate_backward(inputs, opts, upstream, saved, wanted):
    d_g = _zeros_if_none(upstream[0], inputs.g_raw.shape)
    return ops.kda_gate_backward(inputs, d_g, wanted=wanted)


KDA_GATE = OpSpec(
    "kda_gate", *_table_arrays("kda_gate"),
    lambda shapes, n_seqs, opts: [shapes["g_raw"]], _gate_forward, _gate_backward)


# SSM1 --------------------------------------------------------------------------------------

def _ssm1_out_shapes(shapes, n_seqs, opts):
    B, T, D = shapes["x"]
    N = shapes["A"][1]
    return [(B, T, D), (B if n_seqs is None else n_seqs, D, N)]


def _ssm1_forward(inputs, opts, train):
    if train:
        y, hT, saved = ops.ssm1_forward_train(inputs)
        return [y, hT], saved
    return list(ops.ssm1_forward(inputs)), None


def _ssm1_backward(inputs, opts, upstream, saved, wanted):
    d_y = _zeros_if_none(upstream[0], inputs.x.shape)
    return ops.ssm1_backward(inputs, d_y, upstream[1], wanted=wanted, saved=saved)


SSM1 = OpSpec("ssm1", *_table_arrays("ssm1"), _ssm1_out_shapes, _ssm1_forward, _ssm1_backward)


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


CONV1D = OpSpec("conv1d", *_table_arrays("causal_conv1d"), _conv_out_shapes, _conv_forward,
                _conv_backward)
