"""A small reverse-mode differentiation tape over NumPy float64 arrays.

The reference definitions (ops.py) are written token by token with these values, so that
their gradients come from the same lines as their outputs instead of from hand-written
adjoints. Each Value remembers its parents and, per parent, how to carry a gradient back
to it; grad() walks the values in reverse creation order. NumPy broadcasting is allowed:
a gradient is summed back to the shape of the operand it belongs to.
"""
import itertools

import numpy as np

_ids = itertools.count()


def _unbroadcast(grad, shape):
    """Sums grad down to shape, undoing NumPy broadcasting."""
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, n in enumerate(shape):
        if n == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return grad


class Value:
    """An array on the tape. parents: (Value, function from this gradient to the parent's)."""

    __array_priority__ = 1000  # ndarray (op) Value defers to Value's reflected operators

    def __init__(self, data, parents=()):
        self.data = np.asarray(data, dtype=np.float64)
        self.parents = parents
        self.order = next(_ids)

    shape = property(lambda self: self.data.shape)

    def __add__(self, other):
        other = lift(other)
        return Value(self.data + other.data,
                     ((self, lambda g: _unbroadcast(g, self.shape)),
                      (other, lambda g: _unbroadcast(g, other.shape))))

    __radd__ = __add__

    def __neg__(self):
        return Value(-self.data, ((self, lambda g: -g),))

    def __sub__(self, other):
        return self + (-lift(other))

    def __rsub__(self, other):
        return lift(other) + (-self)

    def __mul__(self, other):
        other = lift(other)
        return Value(self.data * other.data,
                     ((self, lambda g: _unbroadcast(g * other.data, self.shape)),
                      (other, lambda g: _unbroadcast(g * self.data, other.shape))))

    __rmul__ = __mul__

    def __truediv__(self, other):
        return self * reciprocal(lift(other))

    def __rtruediv__(self, other):
        return lift(other) * reciprocal(self)

    def __getitem__(self, index):
        def back(g):
            full = np.zeros(self.shape)
            np.add.at(full, index, g)
            return full
        return Value(self.data[index], ((self, back),))

    def reshape(self, *shape):
        return Value(self.data.reshape(*shape), ((self, lambda g: g.reshape(self.shape)),))

    def transpose(self, *axes):
        inverse = np.argsort(axes)
        return Value(self.data.transpose(*axes), ((self, lambda g: g.transpose(*inverse)),))

    def sum(self, axis=None, keepdims=False):
        def back(g):
            if axis is not None and not keepdims:
                g = np.expand_dims(g, axis)
            return np.broadcast_to(g, self.shape).copy()
        return Value(self.data.sum(axis=axis, keepdims=keepdims), ((self, back),))


def lift(x):
    """A constant (array or number) as a Value with no parents."""
    return x if isinstance(x, Value) else Value(x)


def _unary(x, value, slope):
    """f(x) with f'(x) = slope, elementwise."""
    return Value(value, ((x, lambda g: g * slope),))


def reciprocal(x):
    return _unary(x, 1.0 / x.data, -1.0 / x.data ** 2)


def exp(x):
    e = np.exp(x.data)
    return _unary(x, e, e)


def sqrt(x):
    r = np.sqrt(x.data)
    return _unary(x, r, 0.5 / r)


def sigmoid(x):
    s = 1.0 / (1.0 + np.exp(-x.data))
    return _unary(x, s, s * (1.0 - s))


def tanh(x):
    t = np.tanh(x.data)
    return _unary(x, t, 1.0 - t * t)


def relu(x):
    return _unary(x, np.maximum(x.data, 0.0), (x.data > 0).astype(np.float64))


SOFTPLUS_THRESHOLD = 20.0


def softplus(x):
    """log(1 + e^x), and x itself above the threshold 20 (slope 1 there)."""
    big = x.data > SOFTPLUS_THRESHOLD
    safe = np.where(big, 0.0, x.data)
    value = np.where(big, x.data, np.log1p(np.exp(safe)))
    slope = np.where(big, 1.0, 1.0 / (1.0 + np.exp(-safe)))
    return _unary(x, value, slope)


def einsum(spec, a, b):
    """Two-operand einsum without repeated indices inside one operand."""
    ins, out = spec.split('->')
    sa, sb = ins.split(',')
    return Value(np.einsum(spec, a.data, b.data),
                 ((a, lambda g: np.einsum(f'{out},{sb}->{sa}', g, b.data)),
                  (b, lambda g: np.einsum(f'{out},{sa}->{sb}', g, a.data))))


def stack(values, axis=0):
    def back_for(i):
        return lambda g: np.take(g, i, axis=axis)
    return Value(np.stack([v.data for v in values], axis=axis),
                 tuple((v, back_for(i)) for i, v in enumerate(values)))


def concat(values, axis=0):
    bounds = np.cumsum([0] + [v.shape[axis] for v in values])

    def back_for(i):
        return lambda g: np.take(g, range(bounds[i], bounds[i + 1]), axis=axis)
    return Value(np.concatenate([v.data for v in values], axis=axis),
                 tuple((v, back_for(i)) for i, v in enumerate(values)))


def grad(loss, wrt):
    """d loss / d w for every Value w in wrt (loss: a scalar Value)."""
    grads = {id(loss): np.ones(loss.shape)}
    seen, todo, order = set(), [loss], []
    while todo:  # every value loss depends on
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        order.append(v)
        todo.extend(p for p, _ in v.parents)
    for v in sorted(order, key=lambda v: v.order, reverse=True):
        g = grads.get(id(v))
        if g is None:
            continue
        for parent, back in v.parents:
            contribution = back(g)
            prev = grads.get(id(parent))
            grads[id(parent)] = contribution if prev is None else prev + contribution
    return [grads.get(id(w), np.zeros(w.shape)) for w in wrt]
