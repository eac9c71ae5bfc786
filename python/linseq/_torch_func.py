"""torch.func (functorch) transforms over linseq's ops: torch.func.grad, vjp, vmap, and
vmap of grad (per-sample gradients).

torch.library custom ops with a registered autograd (_torch_ops) and the eager
torch.autograd.Function without setup_context (_torch_backend._LinseqOp) are refused by
torch.func; and the kernels read a tensor's memory, which a transform's wrapped tensor does
not expose. A call whose tensors torch.func has wrapped runs through FuncOp instead: a
torch.autograd.Function with a separate setup_context (so that torch.func runs its forward
on the plain tensors beneath), whose backward is another such function over linseq's C
backward (BackwardOp), and each has a vmap rule that runs it once per index of the mapped
dimension and stacks the results. A second derivative and forward mode (jvp, jacfwd) are
refused with a linseq error: linseq's backward has no backward, its ops no forward-mode rule.
"""

import torch

from . import _lib, _torch_ops

_is_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor",
                      None)


def _compiling():
    compiler = getattr(torch, "compiler", None)
    return bool(compiler and hasattr(compiler, "is_compiling") and compiler.is_compiling())


def wrapped(values):
    """True when a tensor among values is one of torch.func's (a vmap's batched tensor, a
    grad transform's tracking tensor). Under torch.compile, False without asking (Dynamo
    cannot trace the question; the traced graph holds the custom ops)."""
    return _is_wrapped is not None and not _compiling() and any(
        isinstance(v, torch.Tensor) and _is_wrapped(v) for v in values)


def _per_index(fn, info, in_dims, head, args):
    """vmap rule: fn(*head, *args at index i) for every index i of the mapped dimension
    (the arguments with an in_dim of None are shared), each output stacked along dim 0."""
    dims = in_dims[len(head):]
    rows = [fn(*head, *(a if d is None else a.select(d, i) for a, d in zip(args, dims)))
            for i in range(info.batch_size)]
    outputs = tuple(torch.stack(column) for column in zip(*rows))
    return outputs, (0,) * len(outputs)


class FuncOp(torch.autograd.Function):
    """apply(spec, opts, cu_seqlens, *tensors in spec.arrays order) -> the op's outputs
    (float32), differentiable through linseq's backward, under torch.func's transforms."""

    @staticmethod
    def forward(spec, opts, cu_seqlens, *tensors):
        arrays = dict(zip(spec.arrays, tensors))
        inputs = _torch_ops.spec_inputs(spec, arrays, cu_seqlens, opts, True)
        outputs, _ = spec.forward(inputs, opts, False)
        return tuple(_torch_ops.tensor_of(o) for o in outputs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)
        ctx.spec, ctx.opts, ctx.cu_seqlens = inputs[:3]
        ctx.save_for_backward(*inputs[3:])

    @staticmethod
    def backward(ctx, *upstream):
        spec = ctx.spec
        if not spec.has_backward:
            raise _lib.NoBackward(spec.table)
        wanted = tuple(bool(n) for n in ctx.needs_input_grad[3:])
        grads = BackwardOp.apply(spec, ctx.opts, wanted, ctx.cu_seqlens, *ctx.saved_tensors,
                                 *upstream)
        return (None, None, None) + tuple(g if w else None for g, w in zip(grads, wanted))

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError("linseq: forward-mode differentiation (torch.func.jvp, "
                                  "jacfwd) of a linseq op is not available; use reverse mode "
                                  "(torch.func.grad, vjp, jacrev)")

    @staticmethod
    def vmap(info, in_dims, spec, opts, cu_seqlens, *tensors):
        return _per_index(FuncOp.apply, info, in_dims, (spec, opts), (cu_seqlens,) + tensors)


class BackwardOp(torch.autograd.Function):
    """apply(spec, opts, wanted (one bool per array), cu_seqlens, *tensors, *upstream) ->
    one gradient per array (an empty tensor where not wanted)."""

    @staticmethod
    def forward(spec, opts, wanted, cu_seqlens, *rest):
        n = len(spec.arrays)
        arrays, upstream = dict(zip(spec.arrays, rest[:n])), list(rest[n:])
        keys = {spec.grad_of[a] for a, w in zip(spec.arrays, wanted) if w}
        grads = spec.backward(spec.inputs(arrays, cu_seqlens, opts), opts, upstream, None,
                              keys)
        return tuple(torch.from_numpy(grads[spec.grad_of[a]]) if w else torch.zeros(0)
                     for a, w in zip(spec.arrays, wanted))

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("linseq: a second derivative (grad of grad, hessian) of a linseq "
                           "op is not available: its backward has no backward")

    @staticmethod
    def vmap(info, in_dims, spec, opts, wanted, cu_seqlens, *rest):
        return _per_index(BackwardOp.apply, info, in_dims, (spec, opts, wanted),
                          (cu_seqlens,) + rest)
