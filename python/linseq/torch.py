"""PyTorch front end: the public functions with torch.autograd and torch.compile support.

Every op is a torch.library custom op (linseq::kda, kda_gate, ssm1, conv1d, their _backward,
and kda_decode; see _torch_ops) with a fake implementation and its autograd registered:
`loss.backward()` fills the gradients of every tensor that requires them, through linseq's
backward (KDA keeps the chunk states of its forward, so the backward does not run the
forward again), and torch.compile(fullgraph=True) traces the public functions without a
graph break. With a PyTorch that lacks torch.library.custom_op (before 2.4) the same ops run
as one torch.autograd.Function each, eagerly. Tensors must be on the CPU; contiguous float32
tensors reach the kernels without a copy, others are converted once. bfloat16 tensors reach
KDA's forward and decode without a copy when no gradient is needed (see api.kda). Outputs
share their memory with the NumPy arrays the kernels wrote.
"""

import functools
import sys

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from . import _lib, _opspec, _torch_ops, api
from ._backends import bind_framework
from ._options import kernel_activation


class _LinseqOp(torch.autograd.Function):
    """forward(spec, opts, train, cu_seqlens, *tensors in spec.arrays order) -> the op's
    outputs. `train` (grad mode on and some input requiring grad, decided by the caller since
    forward runs with grad mode off) lets KDA keep what its backward needs."""

    @staticmethod
    def forward(ctx, spec, opts, train, cu_seqlens, *tensors):
        ctx.set_materialize_grads(False)
        arrays = dict(zip(spec.arrays, tensors))
        inputs = _torch_ops.spec_inputs(spec, arrays, cu_seqlens, opts, train)
        outputs, saved = spec.forward(inputs, opts, train and spec.saved)
        ctx.spec, ctx.opts, ctx.cu_seqlens, ctx.saved_block = spec, opts, cu_seqlens, saved
        ctx.save_for_backward(*tensors)
        return tuple(_torch_ops.tensor_of(o) for o in outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *upstream):
        spec = ctx.spec
        if not spec.has_backward:
            raise _lib.NoBackward(spec.table)
        tensors = ctx.saved_tensors
        arrays = dict(zip(spec.arrays, tensors))
        needs = ctx.needs_input_grad[4:]
        wanted = {spec.grad_of[n] for n, need in zip(spec.arrays, needs) if need}
        inputs = spec.inputs(arrays, ctx.cu_seqlens, ctx.opts)
        grads = spec.backward(inputs, ctx.opts, list(upstream), ctx.saved_block, wanted)
        ctx.saved_block = None
        out = [None, None, None, None]
        for name, need in zip(spec.arrays, needs):
            out.append(torch.from_numpy(grads[spec.grad_of[name]]) if need else None)
        return tuple(out)


def _run(spec, arrays, cu_seqlens, opts):
    tensors = [arrays[n] for n in spec.arrays]
    train = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)
    cu = _index_tensor(cu_seqlens)
    if _torch_ops.AVAILABLE and all(_is_tensor_or_none(t) for t in tensors + [cu]):
        return _torch_ops.OPS[spec](arrays, cu, opts, train)
    # without torch.library.custom_op (PyTorch < 2.4), or with an argument that is no
    # tensor (refused by name by the checks of ops): the eager autograd.Function
    return _LinseqOp.apply(spec, opts, train, cu_seqlens, *tensors)


def _is_tensor_or_none(value):
    return value is None or isinstance(value, torch.Tensor)


def _index_tensor(value):
    """cu_seqlens / state rows as a tensor (the custom ops take tensors); values that are not
    integer arrays are passed on for the checks of ops to refuse by name."""
    if value is None or isinstance(value, torch.Tensor):
        return value
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        return value
    return torch.from_numpy(np.ascontiguousarray(arr)) if arr.dtype.kind in "iu" else value


def _float_tensor(value):
    """Turns array-likes that are not tensors (NumPy arrays, lists) into tensors so that
    mixing them with tensors works as in PyTorch; None stays None."""
    if value is None or isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, RuntimeError, ValueError):
        return value  # not numeric: the checks of ops refuse it by its argument's name


class TorchBackend:
    @staticmethod
    def kda(arrays, cu_seqlens, opts):
        arrays = {n: _float_tensor(a) for n, a in arrays.items()}
        return _run(_opspec.KDA, arrays, cu_seqlens, opts)

    @staticmethod
    def kda_gate(arrays, opts):
        arrays = {n: _float_tensor(a) for n, a in arrays.items()}
        return _run(_opspec.KDA_GATE, arrays, None, opts)[0]

    @staticmethod
    def ssm1(arrays, cu_seqlens, opts):
        arrays = {n: _float_tensor(a) for n, a in arrays.items()}
        return _run(_opspec.SSM1, arrays, cu_seqlens, opts)

    @staticmethod
    def conv1d(arrays, cu_seqlens, opts):
        arrays = {n: _float_tensor(a) for n, a in arrays.items()}
        return _run(_opspec.CONV1D, arrays, cu_seqlens, opts)

    @staticmethod
    def kda_decode(arrays, state, state_rows, opts, inplace):
        from . import ops
        if not isinstance(state, torch.Tensor):
            state = torch.as_tensor(np.asarray(state))
        if inplace:
            if state.dtype != torch.float32 or not state.is_contiguous() or state.is_cuda:
                raise TypeError("state: inplace=True needs a C-contiguous float32 CPU tensor "
                                f"(got {state.dtype}, contiguous={state.is_contiguous()}); "
                                "pass inplace=False for a new pool")
            _check_inplace(state)
        rows = _index_tensor(state_rows)
        if (_torch_ops.AVAILABLE and state.is_floating_point() and state.device.type == "cpu"
                and all(_is_tensor_or_none(t) for t in list(arrays.values()) + [rows])):
            pool = state if inplace else _new_pool(state)
            # decode has no backward: its output carries no graph, as on the path below
            given = {n: (a.detach() if isinstance(a, torch.Tensor) else a)
                     for n, a in arrays.items()}
            # the custom op declares the pool as mutated: torch bumps its version itself
            return _torch_ops.kda_decode(given, pool, rows, opts), pool
        if inplace:
            pool = state.detach().numpy()
        else:
            pool = np.array(ops.as_f32(state, "state"), copy=True)
        inputs = opts.inputs(arrays, None, bf16=True)
        o = ops.kda_decode(inputs, pool, state_rows)
        if inplace:
            # written through a NumPy view: tell autograd, as a torch in-place op would, so a
            # backward that saved the old pool is refused instead of using the new values
            torch.autograd.graph.increment_version(state)
        return _torch_ops.tensor_of(o), (state if inplace else torch.from_numpy(pool))

    @staticmethod
    def cast(value, like):
        if value is None or not isinstance(like, torch.Tensor) or not like.is_floating_point():
            return value
        return value.to(like.dtype)


def _new_pool(state):
    """A float32 C-contiguous copy of a floating CPU pool, for inplace=False."""
    pool = torch.empty(state.shape, dtype=torch.float32)
    return pool.copy_(state.detach())


def _check_inplace(state):
    """Decode has no backward, so with grad mode on a pool that requires grad is refused (as
    torch refuses an in-place op on a leaf that requires grad); under torch.no_grad() it is
    updated, as torch allows there."""
    if state.requires_grad and torch.is_grad_enabled():
        raise RuntimeError("state: in-place decode of a pool that requires grad; decode has "
                           "no backward: run it under torch.no_grad() or pass a detached pool")


_NONSTRICT_TRACE = (getattr(getattr(torch, "compiler", None), "nonstrict_trace", None)
                    or getattr(getattr(torch, "_dynamo", None), "nonstrict_trace", None))


def _public(fn):
    """A public function of api bound to this backend. Under torch.compile, Dynamo does not
    trace its Python (the checks of the options build ctypes structs, the backend is
    imported by name): it runs as a non-strict traced block, where the custom ops are what
    lands in the graph, so there is no graph break."""
    bound = bind_framework("torch", fn)
    return _NONSTRICT_TRACE(bound) if _NONSTRICT_TRACE and _torch_ops.AVAILABLE else bound


kda = _public(api.kda)
kernel_delta_attention = _public(api.kernel_delta_attention)
kda_decay = _public(api.kda_decay)
chunk_kda = _public(api.chunk_kda)
fused_recurrent_kda = _public(api.fused_recurrent_kda)
kda_decode = _public(api.kda_decode)
causal_conv1d = _public(api.causal_conv1d)
_state_space_v1 = _public(api.state_space_v1)


@functools.wraps(api.state_space_v1)
def state_space_v1(hidden_states, A, B, C, D, dt, gate=None, initial_state=None,
                   conv_state=None, act_fn=None, **kwargs):
    args = (hidden_states, A, B, C, D, dt)
    if act_fn is None or isinstance(act_fn, str) or not _compiling():
        return _state_space_v1(*args, gate, initial_state, conv_state, act_fn, **kwargs)
    # under torch.compile a callable cannot enter the non-strict block: a function the
    # kernel knows goes in by its name, any other is applied here, in the traced graph
    # (without a gate act_fn is not used)
    name = kernel_activation(act_fn) if gate is not None else "silu"
    if name is not None:
        return _state_space_v1(*args, gate, initial_state, conv_state, name, **kwargs)
    y, h, conv_state = _state_space_v1(*args, None, initial_state, conv_state, None, **kwargs)
    y = y * act_fn(gate)
    return TorchBackend.cast(y, hidden_states), h, conv_state


def _compiling():
    compiler = getattr(torch, "compiler", None)
    return bool(compiler and hasattr(compiler, "is_compiling") and compiler.is_compiling())


# linseq.compat.fla's functions (linseq.chunk_kda, ... too) take arrays of any framework:
# imported before torch, they become compilable blocks here (or at their first call)
if "linseq.compat.fla" in sys.modules and not sys.modules["linseq.compat.fla"]._TORCH_BLOCKS:
    sys.modules["linseq.compat.fla"]._bind_torch(torch)
