"""JAX front end: the public functions as jax.custom_vjp over the C forward and backward.

The kernels run through jax.pure_callback, so the functions work eagerly, under jax.jit and
under jax.grad / jax.vjp on the CPU (and under vmap, one call per mapped element). Floating
inputs are cast to float32 inside the traced function, so gradients come back in each
input's own dtype. The backward recomputes what it needs from the inputs (no residual but
the inputs is kept between the two passes).

Every check of linseq.ops runs when the call is made (on stand-ins of the arrays' shapes and
dtypes when they are traced), so a refusal names its argument here rather than failing inside
a host callback. One custom_vjp function is cached per op, set of present arrays and the
options that take few values; the float options (scale, lower_bound) are operands of the
callbacks, so a new value per call adds nothing to any cache. A traced scale is refused by
name (mark it static under jax.jit).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import _opspec, api, ops
from ._arrays import as_row_indices
from ._backends import bind_framework


def _callback(fn, result_shapes, *args):
    return jax.pure_callback(fn, result_shapes, *args, vmap_method="sequential")


def _f32(shape):
    return jax.ShapeDtypeStruct(tuple(shape), jnp.float32)


_FLOAT_OPTIONS = ("scale", "lower_bound")
_CACHE_SIZE = 256  # the keys take few values; the bound is a second line of defence


def _split_options(opts):
    """(opts without its float options, a cache key of few values; the names of the float
    options given; their values as float32 operands)."""
    names = tuple(n for n in _FLOAT_OPTIONS if getattr(opts, n, None) is not None)
    static = dataclasses.replace(opts, **{n: None for n in names})
    return static, names, [np.float32(getattr(opts, n)) for n in names]


def _with_floats(static, names, values):
    return dataclasses.replace(static, **{n: float(v) for n, v in zip(names, values)})


def cached_functions():
    """How many functions the caches of this module hold (bounded; tests watch it)."""
    return _differentiable.cache_info().currsize + _decoder.cache_info().currsize


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _differentiable(spec, static, present, has_cu, floats):
    """The custom_vjp function of (present arrays..., [cu_seqlens], float options...) for one
    op, set of present arrays (absent optional arrays are not arguments at all), options
    without their floats, and names of the float options given."""
    n_arrays = len(present) + has_cu

    def unpack(values):
        arrays = dict.fromkeys(spec.arrays)
        arrays.update(zip(present, values[:len(present)]))
        cu = values[len(present)] if has_cu else None
        return arrays, cu, _with_floats(static, floats, values[n_arrays:])

    def shapes_of(args):
        shapes = dict.fromkeys(spec.arrays)
        shapes.update((n, tuple(a.shape)) for n, a in zip(present, args))
        n_seqs = args[len(present)].shape[0] - 1 if has_cu else None
        return shapes, n_seqs

    def forward_host(*values):
        arrays, cu, opts = unpack(values)
        outputs, _ = spec.forward(spec.inputs(arrays, cu, opts), opts, False)
        return tuple(outputs)

    def primal(*args):
        shapes, n_seqs = shapes_of(args)
        result = tuple(_f32(s) for s in spec.out_shapes(shapes, n_seqs, static))
        return _callback(forward_host, result, *args)

    fn = jax.custom_vjp(primal)

    def fwd(*args):
        return primal(*args), args

    def bwd(args, cotangents):
        n_out = len(cotangents)

        def backward_host(*values):
            arrays, cu, opts = unpack(values[:len(values) - n_out])
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
        # the float options are constants (a traced one is refused before): no gradient
        out.extend(jnp.zeros((), jnp.float32) for _ in floats)
        return tuple(out)

    fn.defvjp(fwd, bwd)
    return fn


def _is_jax(value):
    return isinstance(value, (jax.Array, jax.core.Tracer))


def _stand_in(value):
    """For the checks of ops: a JAX array as an untouched NumPy array (np.empty) of its shape
    and dtype class, a traced one included; anything else as it is."""
    if value is None or not _is_jax(value):
        return value
    floating = jnp.issubdtype(value.dtype, jnp.floating)
    return np.empty(value.shape, np.float32 if floating else value.dtype)


def _offsets_stand_in(cu, n_tokens):
    """cu_seqlens for the checks of ops: its values when known, else valid offsets of its
    shape and dtype (the library checks the traced values in the callback)."""
    if cu is None or not isinstance(cu, jax.core.Tracer):
        return None if cu is None else np.asarray(cu)
    offsets = np.zeros(cu.shape, cu.dtype)
    if offsets.ndim == 1 and offsets.size and offsets.dtype.kind in "iu":
        offsets[-1] = n_tokens
    return offsets


def _check_now(spec, arrays, cu_seqlens, opts):
    """Runs the checks of ops on stand-ins, so that a refusal is raised by the call itself."""
    stand_ins = {n: _stand_in(a) for n, a in arrays.items()}
    first = stand_ins[spec.arrays[0]]
    n_tokens = np.shape(first)[1] if np.ndim(first) >= 2 else 0
    return spec.inputs(stand_ins, _offsets_stand_in(cu_seqlens, n_tokens), opts)


def _run(spec, arrays, cu_seqlens, opts):
    _check_now(spec, arrays, cu_seqlens, opts)
    present = tuple(n for n in spec.arrays if arrays.get(n) is not None)
    args = [jnp.asarray(arrays[n], dtype=jnp.float32) for n in present]
    if cu_seqlens is not None:
        args.append(jnp.asarray(cu_seqlens))
    static, floats, values = _split_options(opts)
    fn = _differentiable(spec, static, present, cu_seqlens is not None, floats)
    return fn(*args, *values)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _decoder(static, names, has_rows, floats):
    """The host function of one decode step for one option set (without its floats) and set
    of present arrays: (arrays..., pool, [rows], float options...) -> (o, new pool)."""

    def host(*values):
        given = dict.fromkeys(_opspec.KDA.arrays)
        given.update(zip(names, values[:len(names)]))
        pool = np.array(values[len(names)], dtype=np.float32, copy=True)
        rows = values[len(names) + 1] if has_rows else None
        opts = _with_floats(static, floats, values[len(names) + 1 + has_rows:])
        o = ops.kda_decode(opts.inputs(given, None), pool, rows)
        return o, pool

    return host


def _host_rows(state_rows, n_pool_rows, n_requests):
    """state_rows checked as ops checks them (integers [B]); known values are also checked
    against the pool and every padding row becomes -1, so that JAX's int32 canonicalization
    cannot turn a row into another."""
    if isinstance(state_rows, jax.core.Tracer):
        as_row_indices(np.zeros(state_rows.shape, state_rows.dtype), n_requests)
        return state_rows
    rows = as_row_indices(np.asarray(state_rows), n_requests)
    if rows.size and rows.max() >= n_pool_rows:
        raise ValueError(f"state_indices: row {int(rows.max())} is beyond the pool's "
                         f"{n_pool_rows} rows")
    return jnp.asarray(np.where(rows < 0, -1, rows).astype(np.int32))


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
        inputs = _check_now(_opspec.KDA, arrays, None, opts)
        pool = _stand_in(state)
        if not isinstance(pool, np.ndarray) or pool.dtype != np.float32:
            pool = ops.as_f32(pool, "state")
        ops.check_decode(inputs, np.empty(pool.shape, np.float32), None)
        rows = None if state_rows is None else _host_rows(state_rows, pool.shape[0], inputs.B)
        names = tuple(n for n in _opspec.KDA.arrays if arrays.get(n) is not None)
        args = [jnp.asarray(arrays[n], dtype=jnp.float32) for n in names]
        state = jnp.asarray(state, dtype=jnp.float32)
        static, floats, values = _split_options(opts)
        host = _decoder(static, names, rows is not None, floats)
        result = (_f32((inputs.B, 1, inputs.HV, inputs.V)), _f32(state.shape))
        extra = [state] + ([rows] if rows is not None else [])
        return _callback(host, result, *args, *extra, *values)

    @staticmethod
    def cast(value, like):
        dtype = getattr(like, "dtype", None)
        if value is None or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            return value
        return value.astype(dtype)


kda = bind_framework("jax", api.kda)
kernel_delta_attention = bind_framework("jax", api.kernel_delta_attention)
kda_decay = bind_framework("jax", api.kda_decay)
chunk_kda = bind_framework("jax", api.chunk_kda)
fused_recurrent_kda = bind_framework("jax", api.fused_recurrent_kda)
kda_decode = bind_framework("jax", api.kda_decode)
state_space_v1 = bind_framework("jax", api.state_space_v1)
causal_conv1d = bind_framework("jax", api.causal_conv1d)
