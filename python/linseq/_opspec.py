"""One description per op, shared by the NumPy, PyTorch and JAX front ends.

Each spec holds what the C library's op table says of the op (its input arrays in a fixed
order, how many outputs it has, the gradient each input receives, whether it has a backward
and a training forward that keeps a block for it) and what Python adds: its options class,
its outputs' shapes from the input shapes alone (which JAX and torch's fake tensors need),
the problem sizes a training block's size depends on, and the forward and backward over
NumPy arrays. A framework front end only moves tensors in and out; what is computed lives
here once.

An op the library describes as forward-only ("grads": null) gets a spec without a backward:
has_backward is False, grad_of is empty, and calling its backward raises _lib.NoBackward.
"""

import dataclasses
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from . import _lib, ops
from ._options import ConvOptions, GateOptions, KdaOptions, Ssm1Options


# eq=False: specs are singletons, hashed by identity (JAX caches one function per spec, the
# PyTorch backend keeps one custom op per spec). Not frozen: torch.compile's Dynamo hashes a
# frozen dataclass by its fields (a dict is among them), an ordinary object by identity.
@dataclasses.dataclass(eq=False)
class OpSpec:
    table: str                       # its name in the library's op table, and its custom
                                     # ops': linseq::<table>, linseq::<table>_backward
    options: type                    # the frozen options class (_options)
    arrays: Tuple[str, ...]          # the input arrays, in the table's order
    n_outputs: int
    grad_of: Dict[str, str]          # input array -> key of its gradient in the backward dict
    has_backward: bool
    saved: bool                      # a training forward keeps a block for the backward
    out_shapes: Callable             # (shapes: dict name -> tuple|None, n_seqs|None, opts)
    forward: Callable                # (inputs, opts, train) -> (list of outputs, saved)
    backward: Callable               # (inputs, opts, upstream list, saved, wanted) -> dict
    sizes: Optional[Callable]        # (shapes, opts) -> the problem's sizes, where saved

    def inputs(self, arrays, cu_seqlens, opts, bf16=False):
        return opts.inputs(arrays, cu_seqlens, bf16=bf16)


def from_table(desc, options, out_shapes, forward, backward=None, sizes=None):
    """The spec of the op table entry `desc`: its arrays, outputs and gradients from the
    table, the rest as given. `backward` None, or an entry without a backward (a forward-only
    op), makes a spec whose backward raises _lib.NoBackward."""
    tensors = desc["tensors"]
    has_backward = backward is not None and _lib.has_backward(desc)
    if not has_backward:
        def backward(*args, _op=desc["name"]):
            raise _lib.NoBackward(_op)
    grads = ({t["grad_of"]: t["name"] for t in tensors if t["role"] == "grad"}
             if has_backward else {})
    saved = bool(desc.get("training")) and has_backward
    if saved and sizes is None:
        raise ValueError(f"{desc['name']}: a training forward needs the spec's sizes")
    return OpSpec(desc["name"], options,
                  tuple(t["name"] for t in tensors if t["role"] == "input"),
                  sum(t["role"] == "output" for t in tensors), grads, has_backward, saved,
                  out_shapes, forward, backward, sizes)


def _spec(table_name, *args, **kwargs):
    return from_table(_lib.op_desc(table_name), *args, **kwargs)


def _zeros_if_none(value, shape):
    return np.zeros(shape, np.float32) if value is None else value


# KDA ---------------------------------------------------------------------------------------

def _kda_out_shapes(shapes, n_seqs, opts):
    B, T, H, K = shapes["q"]
    _, _, HV, V = shapes["v"]
    N = B if n_seqs is None else n_seqs
    state = (N, HV, V, K) if opts.state_v_first else (N, HV, K, V)
    return [(B, T, HV, V), state]


def _kda_sizes(shapes, opts):
    B, T, H, K = shapes["q"]
    return dict(B=B, T=T, H=H, HV=shapes["v"][2], K=K, V=shapes["v"][3])


def _kda_forward(inputs, opts, train):
    if train:
        o, ht, saved = ops.kda_forward_train(inputs, **opts.exec_settings())
        return [o, ht], saved
    o, ht = ops.kda_forward(inputs, **opts.exec_settings())
    return [o, ht], None


def _kda_backward(inputs, opts, upstream, saved, wanted):
    d_o = _zeros_if_none(upstream[0], (inputs.B, inputs.T, inputs.HV, inputs.V))
    return ops.kda_backward(inputs, d_o, upstream[1], saved=saved, wanted=wanted,
                            **opts.exec_settings())


KDA = _spec("kda", KdaOptions, _kda_out_shapes, _kda_forward, _kda_backward,
            _kda_sizes)


# KDA gate ----------------------------------------------------------------------------------

def _gate_forward(inputs, opts, train):
    return [ops.kda_gate_forward(inputs)], None


def _gate_backward(inputs, opts, upstream, saved, wanted):
    d_g = _zeros_if_none(upstream[0], inputs.g_raw.shape)
    return ops.kda_gate_backward(inputs, d_g, wanted=wanted)


KDA_GATE = _spec("kda_gate", GateOptions,
                 lambda shapes, n_seqs, opts: [shapes["g_raw"]], _gate_forward, _gate_backward)


# SSM1 --------------------------------------------------------------------------------------

def _token_sizes(shape, channel_first):
    """(B, T, D) of a per-token array [B,T,D] ([B,D,T] channel first)."""
    B, second, third = shape
    return (B, third, second) if channel_first else (B, second, third)


def _ssm1_out_shapes(shapes, n_seqs, opts):
    B, _, D = _token_sizes(shapes["x"], opts.channel_first)
    N = shapes["A"][1]
    return [tuple(shapes["x"]), (B if n_seqs is None else n_seqs, D, N)]


def _ssm1_sizes(shapes, opts):
    # one group (G = 0): the saved block's size depends on B, T, D and N alone (linseq.h)
    B, T, D = _token_sizes(shapes["x"], opts.channel_first)
    return dict(B=B, T=T, D=D, N=shapes["A"][1], G=0)


def _ssm1_forward(inputs, opts, train):
    if train:
        y, hT, saved = ops.ssm1_forward_train(inputs)
        return [y, hT], saved
    return list(ops.ssm1_forward(inputs)), None


def _ssm1_backward(inputs, opts, upstream, saved, wanted):
    d_y = _zeros_if_none(upstream[0], inputs.x.shape)
    return ops.ssm1_backward(inputs, d_y, upstream[1], wanted=wanted, saved=saved)


SSM1 = _spec("ssm1", Ssm1Options, _ssm1_out_shapes, _ssm1_forward, _ssm1_backward,
             _ssm1_sizes)


# causal conv1d -----------------------------------------------------------------------------

def _conv_out_shapes(shapes, n_seqs, opts):
    B, _, D = _token_sizes(shapes["x"], opts.channel_first)
    W = shapes["weight"][-1]
    return [tuple(shapes["x"]), (B if n_seqs is None else n_seqs, D, W - 1)]


def _conv_forward(inputs, opts, train):
    return list(ops.conv1d_forward(inputs)), None


def _conv_backward(inputs, opts, upstream, saved, wanted):
    d_y = _zeros_if_none(upstream[0], inputs.x.shape)
    return ops.conv1d_backward(inputs, d_y, upstream[1], wanted=wanted)


CONV1D = _spec("causal_conv1d", ConvOptions, _conv_out_shapes, _conv_forward,
               _conv_backward)


# Any other op of the table --------------------------------------------------------------------

def _table_options(desc):
    """A frozen options class for an op from its table entry: each option by its key (a bool;
    a float32 as Optional[float], None for the struct's default; an enum as its value's name,
    None for the default), and mode, chunk_size and bf16_products (exec->products, which the
    chunked forward and backward take) where exec's modes apply."""
    name, modes = desc["name"], bool(desc.get("modes"))
    kinds = {"bool": (bool, False), "enum": (Optional[str], None)}
    fields = [(o["key"], *kinds.get(o["type"], (Optional[float], None)))
              for o in desc["options"]]
    if modes:
        fields += [("mode", str, "chunked"), ("chunk_size", int, 64),
                   ("bf16_products", bool, False)]
    keys = [o["key"] for o in desc["options"]]

    def __post_init__(self):
        ops.make_exec(**self.exec_settings())

    def inputs(self, arrays, cu_seqlens, bf16=False):
        return ops.TableInputs(name, arrays, cu_seqlens,
                               options={k: getattr(self, k) for k in keys})

    def exec_settings(self):
        if not modes:
            return {}
        return {"mode": self.mode, "chunk_size": self.chunk_size,
                "bf16_products": bool(self.bf16_products)}

    def table_options(self):
        return {k: getattr(self, k) for k in keys}

    title = "".join(part.capitalize() for part in name.split("_"))
    return dataclasses.make_dataclass(
        f"{title}Options", [(n, t, dataclasses.field(default=d)) for n, t, d in fields],
        frozen=True, namespace={"__post_init__": __post_init__, "inputs": inputs,
                                "exec_settings": exec_settings, "table_options": table_options,
                                "__module__": __name__})


_EMPTY = (0,)  # an output the op does not write under these options


def generic(desc):
    """The spec of any op of the table from its description alone (no Python written for
    it): its inputs by the table's names, options from _table_options, forward and backward
    through linseq_op_forward / _backward. An output the options leave out comes back empty."""
    name = desc["name"]
    outputs = [t["name"] for t in desc["tensors"] if t["role"] == "output"]
    grad_of_output = {t["grad_of"]: t["name"] for t in desc["tensors"] if t["role"] == "upstream"}

    def out_shapes(shapes, n_seqs, opts):
        s = ops.shapes_of(name, shapes, n_seqs, **opts.table_options())
        return [s[o] or _EMPTY for o in outputs]

    def forward(inputs, opts, train):
        outs = ops.table_forward(inputs, ops.make_exec(**opts.exec_settings()))
        return [np.zeros(_EMPTY, np.float32) if o is None else o for o in outs], None

    def backward(inputs, opts, upstream, saved, wanted):
        given = {}
        for out, up in zip(outputs, upstream):
            if out in grad_of_output:
                shape = inputs.shapes[out]
                first = out == outputs[0]  # the first output's gradient is required
                given[grad_of_output[out]] = (_zeros_if_none(up, shape) if first
                                              else None if up is None or not up.size else up)
        return ops.table_backward(inputs, ops.make_exec(**opts.exec_settings()), given, wanted)

    return from_table(desc, _table_options(desc), out_shapes, forward, backward)


_OWN = (KDA, KDA_GATE, SSM1, CONV1D)
SPECS = {spec.table: spec for spec in _OWN}
SPECS.update({d["name"]: generic(d) for d in _lib.op_table["ops"] if d["name"] not in SPECS})


def by_name(op):
    """The spec of an op by its table name (every op of the library's table: "kda", "ssm1",
    "ssd", ...)."""
    spec = SPECS.get(op)
    if spec is None:
        raise ValueError(f"op: expected one of {sorted(SPECS)}, got {op!r}")
    return spec
