"""The PyTorch backend: an op of _opspec run on tensors, with autograd through linseq's C
backward.

Every op is a torch.library custom op (linseq::kda, kda_gate, ssm1, conv1d, their _backward,
and kda_decode; see _torch_ops) with a fake implementation and its autograd registered:
`loss.backward()` fills the gradients of every tensor that requires them, through linseq's
backward (KDA and SSM1 keep a block of their forward, so the backward does not run the
forward again), and torch.compile(fullgraph=True) traces the calls without a graph break.
With a PyTorch that lacks torch.library.custom_op (before 2.4) the same ops run as one
torch.autograd.Function each, eagerly. Tensors must be on the CPU; contiguous float32
tensors reach the kernels without a copy, others are converted once. bfloat16 tensors reach
KDA's forward and decode without a copy when no gradient is needed (see api.kda). Outputs
share their memory with the NumPy arrays the kernels wrote.

The registry (_backends) picks this backend for PyTorch tensors; linseq.torch binds the
public functions to it, and linseq.distributed calls it directly.
"""

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from . import _lib, _torch_func, _torch_ops, ops
from ._arrays import check_one_device, check_pool


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


# the specs' array names as the public functions call them, where they differ
_PUBLIC = {"h0": "initial_state"}


def _is_tensor_or_none(value):
    return value is None or isinstance(value, torch.Tensor)


def index_tensor(value):
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
    def run(spec, arrays, cu_seqlens, opts):
        """The op's outputs (a tuple) for arrays by the spec's input names (any missing one
        is absent)."""
        arrays = {n: _float_tensor(arrays.get(n)) for n in spec.arrays}
        tensors = list(arrays.values())
        train = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False)
                                                for t in tensors)
        cu = index_tensor(cu_seqlens)
        check_one_device(dict(arrays, cu_seqlens=cu), _PUBLIC)
        if _torch_func.wrapped(tensors + [cu]):   # under torch.func.grad / vmap
            return _torch_func.FuncOp.apply(spec, opts, cu, *tensors)
        if _torch_ops.AVAILABLE and all(_is_tensor_or_none(t) for t in tensors + [cu]):
            return _torch_ops.OPS[spec](arrays, cu, opts, train)
        # without torch.library.custom_op (PyTorch < 2.4), or with an argument that is no
        # tensor (refused by name by the checks of ops): the eager autograd.Function
        return _LinseqOp.apply(spec, opts, train, cu_seqlens, *tensors)

    @staticmethod
    def kda_decode(arrays, state, state_rows, opts, inplace):
        if not isinstance(state, torch.Tensor):
            state = torch.as_tensor(np.asarray(state))
        rows = index_tensor(state_rows)
        check_one_device(dict(arrays, state=state, state_indices=rows), _PUBLIC)
        if inplace:
            check_pool(state, "state")
            if state.dtype != torch.float32 or not state.is_contiguous() or state.is_cuda:
                raise TypeError("state: inplace=True needs a C-contiguous float32 CPU tensor "
                                f"(got {state.dtype}, contiguous={state.is_contiguous()}); "
                                "pass inplace=False for a new pool")
            _check_inplace(state)
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
    def silu(value):
        return torch.nn.functional.silu(value)

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
