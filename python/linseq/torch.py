"""PyTorch front end: the public functions with torch.autograd support.

Every op is one torch.autograd.Function over the C forward and backward: `loss.backward()`
fills the gradients of every tensor that requires them, through linseq's backward (KDA keeps
the chunk states of its forward, so the backward does not run the forward again). Tensors
must be on the CPU; contiguous float32 tensors reach the kernels without a copy, others are
converted once. Outputs share their memory with the NumPy arrays the kernels wrote.
"""

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from . import _opspec, api
from ._backends import bind_framework


class _LinseqOp(torch.autograd.Function):
    """forward(spec, opts, train, cu_seqlens, *tensors in spec.arrays order) -> the op's
    outputs. `train` (grad mode on and some input requiring grad, decided by the caller since
    forward runs with grad mode off) lets KDA keep what its backward needs."""

    @staticmethod
    def forward(ctx, spec, opts, train, cu_seqlens, *tensors):
        ctx.set_materialize_grads(False)
        arrays = dict(zip(spec.arrays, tensors))
        inputs = spec.inputs(arrays, cu_seqlens, opts)
        outputs, saved = spec.forward(inputs, opts, train)
        ctx.spec, ctx.opts, ctx.cu_seqlens, ctx.saved_block = spec, opts, cu_seqlens, saved
        ctx.save_for_backward(*tensors)
        return tuple(torch.from_numpy(o) for o in outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *upstream):
        spec = ctx.spec
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
    return _LinseqOp.apply(spec, opts, train, cu_seqlens, *tensors)


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
            pool = state.detach().numpy()
        else:
            pool = np.array(ops.as_f32(state, "state"), copy=True)
        inputs = opts.inputs(arrays, None)
        o = ops.kda_decode(inputs, pool, state_rows)
        if inplace:
            # written through a NumPy view: tell autograd, as a torch in-place op would, so a
            # backward that saved the old pool is refused instead of using the new values
            torch.autograd.graph.increment_version(state)
        return torch.from_numpy(o), (state if inplace else torch.from_numpy(pool))

    @staticmethod
    def cast(value, like):
        if value is None or not isinstance(like, torch.Tensor) or not like.is_floating_point():
            return value
        return value.to(like.dtype)


def _check_inplace(state):
    """Decode has no backward, so with grad mode on a pool that requires grad is refused (as
    torch refuses an in-place op on a leaf that requires grad); under torch.no_grad() it is
    updated, as torch allows there."""
    if state.requires_grad and torch.is_grad_enabled():
        raise RuntimeError("state: in-place decode of a pool that requires grad; decode has "
                           "no backward: run it under torch.no_grad() or pass a detached pool")


kda = bind_framework("torch", api.kda)
kernel_delta_attention = bind_framework("torch", api.kernel_delta_attention)
kda_decay = bind_framework("torch", api.kda_decay)
chunk_kda = bind_framework("torch", api.chunk_kda)
fused_recurrent_kda = bind_framework("torch", api.fused_recurrent_kda)
kda_decode = bind_framework("torch", api.kda_decode)
state_space_v1 = bind_framework("torch", api.state_space_v1)
causal_conv1d = bind_framework("torch", api.causal_conv1d)
