"""JAX front end: the public functions as jax.custom_vjp over the C forward and backward.

The kernels run through jax.pure_callback, so the functions work eagerly, under jax.jit and
under jax.grad / jax.vjp on the CPU (and under vmap, one call per mapped element). Floating
inputs are cast to float32 inside the traced function, so gradients come back in each
input's own dtype. The backward recomputes what it needs from the inputs (no residual but
the inputs is kept between the two passes).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import _opspec, api, ops
from ._backends import bind_framework


def _callback(fn, result_shapes, *args):
    return jax.pure_callback(fn, result_shapes, *args, vmap_method="sequential")


def _f32(shape):
    return jax.ShapeDtypeStruct(tuple(shape), jnp.float32)


@functools.lru_cache(maxsize=None)
def _differentiable(spec, opts, present, has_cu):
    """The custom_vjp function of (present arrays..., [cu_seqlens]) for one op, option set
    and set of present arrays (absent optional arrays are not arguments at all)."""

    def unpack(values):
        arrays = dict.fromkeys(spec.arrays)
        arrays.update(zip(present, values[:len(present)]))
        cu = values[len(present)] if has_cu else None
        return arrays, cu

    def shapes_of(args):
        shapes = dict.fromkeys(spec.arrays)
        shapes.update((n, tuple(a.shape)) for n, a in zip(present, args))
        n_seqs = args[len(present)].shape[0] - 1 if has_cu else None
        return shapes, n_seqs

    def forward_host(*values):
        arrays, cu = unpack(values)
        outputs, _ = spec.forward(spec.inputs(arrays, cu, opts), opts, False)
        return tuple(outputs)

    def primal(*args):
        shapes, n_seqs = shapes_of(args)
        result = tuple(_f32(s) for s in spec.out_shapes(shapes, n_seqs, opts))
        return _callback(forward_host, result, *args)

    fn = jax.custom_vjp(primal)

    def fwd(*args):
        return primal(*args), args

    def bwd(args, cotangents):
        n_out = len(cotangents)

        def backward_host(*values):
            arrays, cu = unpack(values[:len(values) - n_out])
            inputs = spec.inputs(arrays, cu, opts)
            wanted = {spec.grad_of[n] for n in present}
            grads = spec.backward(inputs, opts, list(values[len(values) - n_out:]), None,
                                  wanted)
            return tuple(grads[spec.grad_of[n]] for n in present)

        result = tuple(_f32(a.shape) for a in args[:len(present)])
        grads = _callback(backward_host, result, *args, *cotangents)
        out = [g.astype(a.dtype) for g, a in zip(grads, args)]
        if has_cu:
            cu = args[len(present)]
            out.append(np.zeros(cu.shape, dtype=jax.dtypes.float0))
        return tuple(out)

    fn.defvjp(fwd, bwd)
    return fn


def _run(spec, arrays, cu_seqlens, opts):
    present = tuple(n for n in spec.arrays if arrays.get(n) is not None)
    args = [jnp.asarray(arrays[n], dtype=jnp.float32) for n in present]
    if cu_seqlens is not None:
        args.append(jnp.asarray(cu_seqlens))
        if not jnp.issubdtype(args[-1].dtype, jnp.integer):
            raise TypeError(f"cu_seqlens: expected integer offsets, got dtype {args[-1].dtype}")
    fn = _differentiable(spec, opts, present, cu_seqlens is not None)
    return fn(*args)


class JaxBackend:
    @staticmethod
    def kda(arrays, cu_seqlens, opts):
        return _run(_opspec.KDA, arrays, cu_seqlens, opts)

    @staticmethod
    def kda_gate(arrays, opts):
        return _run(_opspec.KDA_GATE, arrays, None, opts)[0]

    @staticmethod
    def ssm1(arrays, cu_seqlens, opts):
        return _run(_opspec.SSM1, arrays, cu_seqlens, opts)

    @staticmethod
    def conv1d(arrays, cu_seqlens, opts):
        return _run(_opspec.CONV1D, arrays, cu_seqlens, opts)

    @staticmethod
    def kda_decode(arrays, state, state_rows, opts, inplace):
        if inplace:
            raise TypeError("state: JAX arrays are immutable; call kda_decode with "
                            "inplace=False and use the returned pool")
        names = tuple(n for n in _opspec.KDA.arrays if arrays.get(n) is not None)
        args = [jnp.asarray(arrays[n], dtype=jnp.float32) for n in names]
        state = jnp.asarray(state, dtype=jnp.float32)
        rows = None if state_rows is None else jnp.asarray(state_rows)

        def host(*values):
            given = dict.fromkeys(_opspec.KDA.arrays)
            given.update(zip(names, values[:len(names)]))
            pool = np.array(values[len(names)], dtype=np.float32, copy=True)
            r = values[len(names) + 1] if rows is not None else None
            o = ops.kda_decode(opts.inputs(given, None), pool, r)
            return o, pool

        q = args[names.index("q")]
        v = args[names.index("v")]
        result = (_f32((q.shape[0], 1, v.shape[2], v.shape[3])), _f32(state.shape))
        extra = [state] + ([rows] if rows is not None else [])
        return _callback(host, result, *args, *extra)

    @staticmethod
    def cast(value, like):
        dtype = getattr(like, "dtype", None)
        if value is None or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            return value
        return value.astype(dtype)


kda = bind_framework("jax", api.kda)
kernel_delta_attention = kda
kda_decay = bind_framework("jax", api.kda_decay)
chunk_kda = bind_framework("jax", api.chunk_kda)
fused_recurrent_kda = bind_framework("jax", api.fused_recurrent_kda)
kda_decode = bind_framework("jax", api.kda_decode)
state_space_v1 = bind_framework("jax", api.state_space_v1)
causal_conv1d = bind_framework("jax", api.causal_conv1d)
