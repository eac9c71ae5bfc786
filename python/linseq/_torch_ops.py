"""linseq's PyTorch entries as torch.library custom ops, so torch.compile traces them.

One forward op and one backward op per op spec (linseq::kda, kda_backward, kda_gate, ssm1,
conv1d and their _backward; an op without a backward has its forward op only), and
linseq::kda_decode, which updates its state pool in place (declared as a mutated argument).
The drop-ins (linseq.compat) call the same ops, in their layouts (channel_first), and add
ops only where none of these fits: their decode steps into pools and causal-conv1d's
seq_idx (compat_op, pool_update_op below). Every op has a fake implementation that gives
its outputs' shapes from the input shapes alone (the specs' out_shapes), and the forward ops
have their autograd registered to call the backward op: torch.compile(..., fullgraph=True)
and AOT autograd see two opaque ops instead of a Python function they cannot trace.

The options become op arguments of schema types (bool, int, str, float?, str?); every array
is a `Tensor?` (the checks of ops refuse a missing required one by its name), and so is
cu_seqlens. A training forward (KDA's, SSM1's) keeps a block for the backward: here it is
a last output of the forward op, a float32 tensor (empty unless `train`) that the backward
op takes back, sized from the library's saved_size query (saved_floats).

KDA's forward without `train` and kda_decode keep bfloat16 inputs as bfloat16 (the rule of
ops.kda_bf16_storage) and return o as torch.bfloat16; the fake implementations declare the
same dtype from the same rule. With `train` the forward runs in float32, as the backward
needs.

The decode ops (kda_decode and the pool updates) may also have C++ CPU kernels
(_torch_native), which the dispatcher then prefers to the Python bodies defined here;
eager_entry gives the drop-ins those kernels without torch's dispatch through Python.

Needs torch.library.custom_op (PyTorch 2.4 and later); AVAILABLE says whether it is there.
"""

import dataclasses
import typing

import numpy as np
import torch

from . import _lib, _opspec, _torch_direct, _torch_native, ops

AVAILABLE = all(hasattr(torch.library, n)
                for n in ("custom_op", "register_fake", "register_autograd"))

NAMESPACE = "linseq"

_SCHEMA_TYPES = {bool: "bool", int: "int", str: "str", typing.Optional[float]: "float?",
                 typing.Optional[str]: "str?"}


def wanted_grads(names, wanted, backward):
    """The gradients a backward op returns: backward(set of the wanted names) gives NumPy
    arrays by name; one tensor per name, an empty one where not wanted (the ops' schema)."""
    grads = backward({g for g, w in zip(names, wanted) if w})
    return [torch.from_numpy(grads[g]) if w else torch.empty(0) for g, w in zip(names, wanted)]


def _option_fields(options_class):
    return [f.name for f in dataclasses.fields(options_class)]


# Names torch's own dispatch wrappers take as keywords (a `mode` argument clashes with the
# dispatch mode of functionalization): renamed in the schemas. The ops take their arguments
# by position, so a schema name is a label only.
_SCHEMA_NAMES = {"mode": "exec_mode"}


def _option_schema(options_class):
    """The schema arguments of an options class's fields (a list: an op may have none)."""
    return [f"{_SCHEMA_TYPES[f.type]} {_SCHEMA_NAMES.get(f.name, f.name)}"
            for f in dataclasses.fields(options_class)]


def saved_floats(spec, shapes, n_seqs, opts):
    """Floats of the tensor that keeps a training forward's block for its backward, from the
    shapes alone, as the fake implementation must give it (a fake tensor has no data; with
    cu_seqlens the sequences' lengths are data; under torch.compile's dynamic shapes B and T
    are symbols). The library's own size query (linseq_<op>_saved_size) gives the block of
    one sequence of u tokens, u the exec's chunk size; the block is laid out per sequence,
    each piece of at most u tokens needing at most that much (linseq.h), so the tensor is
    that size times the number of such pieces: B ceil(T/u) without cu_seqlens, T // u + N
    with them (a sequence adds at most one partial piece). That is the library's size
    rounded up to whole pieces (the real forward checks it fits). The sizes other than B
    and T are read as integers: under dynamic shapes a model's head and state sizes are
    specialized, B and T stay symbolic."""
    sizes = spec.sizes(shapes, opts)
    B, T = sizes.pop("B"), sizes.pop("T")
    ex = ops.make_exec(**opts.exec_settings())
    unit = ex.chunk_size
    fixed = {k: int(v) for k, v in sizes.items()}
    problem = _lib.problem_class(spec.table)(B=1, T=unit, **fixed)
    per_piece = ops.saved_bytes(spec.table, problem, ex)
    pieces = B * ((T + unit - 1) // unit) if n_seqs is None else (B * T) // unit + n_seqs
    return pieces * (-(-per_piece // 4))


def tensor_of(arr):
    """A NumPy result as a tensor sharing its memory: bfloat16 results (ml_dtypes' bfloat16,
    or the uint16 bits ops hands back without ml_dtypes; no result is an integer array)
    become torch.bfloat16 through an int16 view, as torch.from_numpy knows neither."""
    if arr.dtype == np.uint16 or arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def kda_output_dtype(arrays, train):
    """The dtype of KDA's o, from the inputs' dtypes alone (fake tensors have no data)."""
    keep = not train and ops.kda_bf16_storage(*(arrays.get(n)
                                                for n in ("q", "k", "v", "beta", "g")))
    return torch.bfloat16 if keep else torch.float32


def spec_inputs(spec, arrays, cu, opts, train):
    """spec.inputs, with bfloat16 storage kept (KDA's rule) where the forward is not for
    training: the library's training forward and backward take float32."""
    return spec.inputs(arrays, cu, opts, bf16=not train)


_EAGER = {}  # decode op name -> its eager entry (_torch_native.provide), or None


def eager_entry(name):
    """The C++ CPU kernel of the decode op `name` (kda_decode or a pool_update_op), called
    without its dispatch through Python (for plain CPU tensors outside tracing:
    _torch_direct.direct_call), or None where the C++ kernels are not loaded."""
    return _EAGER.get(name)


class _Layout:
    """Packs and unpacks the arguments of one spec's ops: the arrays in spec order,
    cu_seqlens, the option fields, then per op its own tail."""

    def __init__(self, spec):
        self.spec = spec
        self.options_class = spec.options
        self.fields = _option_fields(self.options_class)
        self.n_arrays = len(spec.arrays)
        self.n_outputs = spec.n_outputs
        self.has_saved = spec.saved
        self.head = self.n_arrays + 1 + len(self.fields)

    def schema_head(self):
        return ", ".join([f"Tensor? {n}" for n in self.spec.arrays] + ["Tensor? cu_seqlens"]
                         + _option_schema(self.options_class))

    def pack(self, arrays, cu_seqlens, opts):
        return ([arrays.get(n) for n in self.spec.arrays] + [cu_seqlens]
                + [getattr(opts, f) for f in self.fields])

    def unpack(self, args):
        arrays = dict(zip(self.spec.arrays, args[:self.n_arrays]))
        cu = args[self.n_arrays]
        opts = self.options_class(**dict(zip(self.fields, args[self.n_arrays + 1:self.head])))
        return arrays, cu, opts, args[self.head:]

    def shapes(self, arrays, cu):
        shapes = {n: (None if a is None else tuple(a.shape)) for n, a in arrays.items()}
        return shapes, (None if cu is None else cu.shape[0] - 1)

    def first(self, arrays):
        return arrays[self.spec.arrays[0]]


def _define_forward(layout):
    spec = layout.spec
    outs = ", ".join(["Tensor"] * (layout.n_outputs + layout.has_saved))
    schema = f"({layout.schema_head()}, bool train) -> ({outs})"

    def forward(*args):
        arrays, cu, opts, (train,) = layout.unpack(args)
        if spec is _opspec.KDA and not train and cu is None:
            direct = _torch_direct.kda_forward(arrays, opts)  # the common form, no NumPy
            if direct is not None:
                return direct + (torch.zeros(0),)
        inputs = spec_inputs(spec, arrays, cu, opts, train)
        if layout.has_saved and train:
            n_floats = saved_floats(spec, *layout.shapes(arrays, cu), opts)
            outputs, saved = ops.forward_train(spec.table, inputs,
                                               ops.make_exec(**opts.exec_settings()),
                                               n_floats=n_floats)
        else:
            outputs, _ = spec.forward(inputs, opts, False)
            saved = np.zeros(0, np.float32)
        result = [tensor_of(o) for o in outputs]
        if layout.has_saved:
            result.append(torch.from_numpy(saved))
        return tuple(result) if len(result) > 1 else result[0]

    op = torch.library.custom_op(f"{NAMESPACE}::{spec.table}", forward, mutates_args=(),
                                 schema=schema)
    layout.eager_forward = forward

    @op.register_fake
    def _(*args):
        arrays, cu, opts, (train,) = layout.unpack(args)
        shapes, n_seqs = layout.shapes(arrays, cu)
        like = layout.first(arrays)
        first = kda_output_dtype(arrays, train) if spec is _opspec.KDA else torch.float32
        result = [like.new_empty(s, dtype=first if i == 0 else torch.float32)
                  for i, s in enumerate(spec.out_shapes(shapes, n_seqs, opts))]
        if layout.has_saved:
            n = saved_floats(spec, shapes, n_seqs, opts) if train else 0
            result.append(like.new_empty((n,), dtype=torch.float32))
        return tuple(result) if len(result) > 1 else result[0]

    return op


def _define_backward(layout):
    """(arrays, cu_seqlens, options, one upstream gradient per output, [saved], wanted: one
    bool per array) -> one gradient per array, an empty tensor where not wanted."""
    spec = layout.spec
    upstream = ", ".join(f"Tensor? d_out{i}" for i in range(layout.n_outputs))
    saved = ", Tensor? saved" if layout.has_saved else ""
    schema = f"({layout.schema_head()}, {upstream}{saved}, bool[] wanted) -> Tensor[]"

    def split(tail):
        up = list(tail[:layout.n_outputs])
        saved = tail[layout.n_outputs] if layout.has_saved else None
        return up, saved, tail[-1]

    def backward(*args):
        arrays, cu, opts, tail = layout.unpack(args)
        up, saved, wanted = split(tail)
        block = saved.detach().numpy() if saved is not None and saved.numel() else None
        return wanted_grads([spec.grad_of[n] for n in spec.arrays], wanted,
                            lambda keys: spec.backward(spec.inputs(arrays, cu, opts), opts,
                                                       up, block, keys))

    op = torch.library.custom_op(f"{NAMESPACE}::{spec.table}_backward", backward,
                                 mutates_args=(), schema=schema)

    @op.register_fake
    def _(*args):
        arrays, _, _, tail = layout.unpack(args)
        wanted = tail[-1]
        like = layout.first(arrays)
        return [like.new_empty(a.shape if w else (0,), dtype=torch.float32)
                for a, w in zip(arrays.values(), wanted)]

    return op


def _register_autograd(layout, forward_op, backward_op):
    def setup_context(ctx, inputs, output):
        arrays = inputs[:layout.n_arrays + 1]
        saved = output[-1] if layout.has_saved else None
        ctx.save_for_backward(*arrays, saved)
        ctx.rest = inputs[layout.n_arrays + 1:layout.head]

    def backward(ctx, *grads):
        tensors = ctx.saved_tensors
        arrays, saved = tensors[:layout.n_arrays + 1], tensors[-1]
        needs = ctx.needs_input_grad[:layout.n_arrays]
        wanted = [bool(need and a is not None) for need, a in zip(needs, arrays)]
        tail = list(grads[:layout.n_outputs]) + ([saved] if layout.has_saved else [])
        result = backward_op(*arrays, *ctx.rest, *tail, wanted)
        n_args = layout.head + 1  # + train
        out = [g if w else None for g, w in zip(result, wanted)]
        return tuple(out + [None] * (n_args - len(out)))

    forward_op.register_autograd(backward, setup_context=setup_context)


class _DifferentiableOp:
    """One spec's forward op with its autograd, and how TorchBackend calls it. An op without
    a backward (spec.has_backward False) gets no backward op and no autograd registered:
    torch then refuses a backward through it."""

    def __init__(self, spec):
        self.layout = _Layout(spec)
        self.forward = _define_forward(self.layout)
        self.backward = None
        if spec.has_backward:
            self.backward = _define_backward(self.layout)
            _register_autograd(self.layout, self.forward, self.backward)

    def __call__(self, arrays, cu_seqlens, opts, train):
        args = self.layout.pack(arrays, cu_seqlens, opts)
        # no gradient to record, plain tensors, eager: the op's body without torch.library's
        # dispatch (tens of microseconds, as long as a decode step's kernel)
        direct = not train and _torch_direct.direct_call(*args[:self.layout.n_arrays + 1])
        result = (self.layout.eager_forward if direct else self.forward)(*args, train)
        if not isinstance(result, tuple):
            result = (result,)
        return result[:self.layout.n_outputs]


def _define_decode():
    """linseq::kda_decode(KDA's arrays, state (updated in place), state_rows, KDA's options)
    -> o [B,1,HV,V]."""
    layout = _Layout(_opspec.KDA)
    arguments = ([f"Tensor? {n}" for n in layout.spec.arrays]
                 + ["Tensor(a!) state", "Tensor? state_rows"]
                 + _option_schema(layout.options_class))
    schema = f"({', '.join(arguments)}) -> Tensor"
    n = layout.n_arrays

    def unpack(args):
        given = dict(zip(layout.spec.arrays, args[:n]))
        opts = layout.options_class(**dict(zip(layout.fields, args[n + 2:])))
        return given, args[n], args[n + 1], opts

    def decode(*args):
        given, state, rows, opts = unpack(args)
        # detach: a view of the same memory, for a pool that requires grad (under no_grad)
        o = ops.kda_decode(opts.inputs(given, None, bf16=True), state.detach().numpy(), rows)
        return tensor_of(o)

    op = torch.library.custom_op(f"{NAMESPACE}::kda_decode", decode, mutates_args=("state",),
                                 schema=schema)
    _EAGER["kda_decode"] = _torch_native.provide(op, decode)

    @op.register_fake
    def _(*args):
        given, _, _, _ = unpack(args)
        q, v = given["q"], given["v"]
        return q.new_empty((q.shape[0], 1, v.shape[2], v.shape[3]),
                           dtype=kda_output_dtype(given, train=False))

    def call(arrays, state, state_rows, opts):
        tensors = [arrays.get(k) for k in layout.spec.arrays]
        options = [getattr(opts, f) for f in layout.fields]
        eager = _EAGER["kda_decode"]
        if eager is None or not _torch_direct.direct_call(*tensors, state, state_rows):
            return op(*tensors, state, state_rows, *options)
        o = eager(*tensors, state, state_rows, *options)
        torch.autograd.graph.increment_version(state)  # what the op's dispatch does
        return o

    return call


def _define_alias(old, new):
    """linseq::<old> as another name of linseq::<new>: same schema, and an implementation
    that calls it (CompositeImplicitAutograd: autograd, fake tensors and torch.compile go
    through the op it names)."""
    target = getattr(getattr(torch.ops, NAMESPACE), new).default
    schema = str(target._schema)
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    library.define(old + schema[schema.index("("):])
    library.impl(old, lambda *args: target(*args), "CompositeImplicitAutograd")
    return library


if AVAILABLE:
    OPS = {spec: _DifferentiableOp(spec) for spec in _opspec.SPECS.values()}
    kda_decode = _define_decode()
    # The conv's custom op was linseq::conv1d before every surface took the table's name;
    # the old name stays for one release (docs/developer-guide.md, Names).
    _ALIASES = [_define_alias("conv1d", "causal_conv1d")]
else:
    OPS, kda_decode = {}, None


def compat_op(name, head, tensors, forward, fake, backward):
    """A custom op for a drop-in's kernel seam that no op spec fits (causal-conv1d's seq_idx
    conv, whose offsets are read from seq_idx inside the op), with its backward op and
    autograd. `head`: the schema of the leading arguments that get no gradient (flags, index
    tensors), e.g. "str? activation, Tensor seq_idx"; `tensors`: those that may, e.g.
    ["Tensor x", "Tensor? bias"]. forward(*head, *tensors) -> (y, state); fake(*head,
    *tensors) -> the same shapes; backward(*head, *tensors, d_y, d_state, wanted) -> one
    gradient per tensor (an empty tensor where not wanted)."""
    n_head = head.count(",") + 1
    args = f"{head}, {', '.join(tensors)}"
    forward_op = torch.library.custom_op(f"{NAMESPACE}::{name}", forward, mutates_args=(),
                                         schema=f"({args}) -> (Tensor, Tensor)")
    forward_op.register_fake(fake)
    backward_op = torch.library.custom_op(
        f"{NAMESPACE}::{name}_backward", backward, mutates_args=(),
        schema=f"({args}, Tensor? d_y, Tensor? d_state, bool[] wanted) -> Tensor[]")

    @backward_op.register_fake
    def _(*args):
        given, wanted = args[n_head:-3], args[-1]
        like = next(t for t in given if t is not None)
        return [like.new_empty(t.shape if w else (0,), dtype=torch.float32)
                for t, w in zip(given, wanted)]

    def setup_context(ctx, inputs, output):
        ctx.head = inputs[:n_head]
        ctx.save_for_backward(*inputs[n_head:])

    def grad(ctx, d_y, d_state):
        given = ctx.saved_tensors
        wanted = [bool(need and t is not None)
                  for need, t in zip(ctx.needs_input_grad[n_head:], given)]
        grads = backward_op(*ctx.head, *given, d_y, d_state, wanted)
        return (None,) * n_head + tuple(g if w else None for g, w in zip(grads, wanted))

    forward_op.register_autograd(grad, setup_context=setup_context)
    return forward_op


def pool_update_op(name, schema, decode, fake):
    """A custom op for a drop-in's decode step that updates its state pool in place: the
    schema names the pool `Tensor(a!) state` (declared mutated, so torch.compile keeps the
    write, as eager does); no autograd."""
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", decode, mutates_args=("state",),
                                 schema=schema)
    op.register_fake(fake)
    _EAGER[name] = _torch_native.provide(op, decode)
    return op
