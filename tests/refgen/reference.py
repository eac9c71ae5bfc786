"""One case's outputs and gradients in float64: the op's definition (its op_*.py) on the tape,
the loss sum(out * d_out) over the upstream gradients given, and the tape's gradients of
that loss."""
import defs
from tape import Value, grad
import numpy as np


def forward(c, arrays):
    """(outputs {name: Value}, differentiable inputs {name: Value}) from float arrays; an
    absent optional input is zeros, so that its gradient "at zeros" exists too."""
    op = defs.op_def(c['op'])
    values = {n: Value(a) for n, a in arrays.items() if n != 'cu_seqlens'}
    for name, shape in op.optional(c).items():
        values.setdefault(name, Value(np.zeros(shape)))
    return op.forward(values, c), values


def loss_of(outputs, upstream):
    total = None
    for name, out in outputs.items():
        d = upstream.get('d_' + name)
        if d is not None:
            term = (out * d).sum()
            total = term if total is None else total + term
    return total


def upstream_names(c):
    """The upstream gradients a case gives: its first output's, and its state's on request;
    none for a forward-only op."""
    op = defs.op_def(c['op'])
    return ['d_' + n for n in op.outputs[:1 + bool(c.get('d_state'))]] if op.grads else []


def grad_names(c, arrays):
    """The inputs whose gradient files a case lists (none for a forward-only op)."""
    op = defs.op_def(c['op'])
    return op.grads(c, arrays) if op.grads else []


def evaluate(c, arrays, upstream):
    """({output: float64 array}, {grad file: float64 array}) of one case."""
    outputs, values = forward(c, arrays)
    names = grad_names(c, arrays)
    grads = grad(loss_of(outputs, upstream), [values[n] for n in names]) if names else []
    return ({n: outputs[n].data for n in defs.op_def(c['op']).outputs},
            {'d' + n: g for n, g in zip(names, grads)})
