"""The JAX backend: an op of _opspec as jax.custom_vjp over the C forward and backward.

The kernels run as XLA FFI custom calls (_jax_ffi, over the handlers of _xla_ffi.c): XLA's
buffers reach the library where they lie, under jax.jit, jax.grad / jax.vjp and jax.vmap on
the CPU. Under vmap the mapped axis is folded into the kernels' batch axis (one call for the
whole batch) where the op allows it: every mapped array has the batch axis first, no shared
parameter (A_log, dt_bias, A, D, weight, bias) or float option is mapped, no cu_seqlens, and
for the backward no shared parameter is present (its gradient is wanted per element);
otherwise one call per element (jax.lax.map). Where the handler library is missing,
jax.pure_callback runs the same kernels through host callbacks (calls() says which path runs;
see _jax_ffi for how it is found and chosen). Floating inputs are cast to float32 inside the
traced function, so gradients come back in each input's own dtype. The backward recomputes
what it needs from the inputs (no residual but the inputs is kept between the two passes).

Every check of linseq.ops runs when the call is made (on stand-ins of the arrays' shapes and
dtypes when they are traced), so a refusal is the NumPy front end's ValueError or TypeError,
raised by the call itself before anything is compiled. One function is cached per op, set of
present arrays, path and the options that take few values; the float options (scale,
lower_bound) are operands of the calls, so a new value per call adds nothing to any cache. A
traced scale is refused by name (mark it static under jax.jit).

The registry (_backends) picks this backend for JAX arrays; linseq.jax binds the public
functions to it. An op without a backward (spec.has_backward False) still runs under
jax.custom_vjp: differentiating it raises _lib.NoBackward when the gradient is traced.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import _jax_batching, _jax_ffi, _lib, _opspec, ops
from ._arrays import as_row_indices

# "ffi" (custom calls) or "callback" (jax.pure_callback); tests switch it to run both paths.
# The handlers are registered for the CPU: where JAX computes on another platform, the
# callbacks move the arrays to the host and back, as before.
_CALLS = "ffi" if _jax_ffi.AVAILABLE and jax.default_backend() == "cpu" else "callback"


def calls():
    """How the kernels run: "ffi" (XLA custom calls) or "callback" (jax.pure_callback, where
    the FFI handler library is missing; _jax_ffi.WHY_NOT says why)."""
    return _CALLS


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
    return (_differentiable.cache_info().currsize + _decoder.cache_info().currsize
            + _ffi_decoder.cache_info().currsize)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _differentiable(spec, static, present, has_cu, floats, calls):
    """The custom_vjp function of (present arrays..., [cu_seqlens], float options...) for one
    op, set of present arrays (absent optional arrays are not arguments at all), options
    without their floats, names of the float options given, and path ("ffi", "callback")."""
    kernels = _ffi_kernels if calls == "ffi" else _callback_kernels
    forward, backward = kernels(spec, static, present, has_cu, floats)
    fn = jax.custom_vjp(forward)

    def fwd(*args):
        return forward(*args), args

    def bwd(args, cotangents):
        if not spec.has_backward:
            raise _lib.NoBackward(spec.table)
        grads = backward(*args, *cotangents)
        out = [g.astype(a.dtype) for g, a in zip(grads, args)]
        if has_cu:
            cu = args[len(present)]
            out.append(np.zeros(cu.shape, dtype=jax.dtypes.float0))
        # the float options are constants (a traced one is refused before): no gradient
        out.extend(jnp.zeros((), jnp.float32) for _ in floats)
        return tuple(out)

    fn.defvjp(fwd, bwd)
    # jit: an eager call is one cached dispatch, not a trace of the custom call per call
    return jax.jit(fn) if calls == "ffi" else fn


def _callback_kernels(spec, static, present, has_cu, floats):
    """(forward, backward) over jax.pure_callback: forward(args...) -> outputs, backward(args...,
    cotangents...) -> the gradients of the present arrays."""
    n_arrays = len(present) + has_cu

    def unpack(values):
        arrays = dict.fromkeys(spec.arrays)
        arrays.update(zip(present, values[:len(present)]))
        cu = values[len(present)] if has_cu else None
        return arrays, cu, _with_floats(static, floats, values[n_arrays:])

    def forward_host(*values):
        arrays, cu, opts = unpack(values)
        outputs, _ = spec.forward(spec.inputs(arrays, cu, opts), opts, False)
        return tuple(outputs)

    def forward(*args):
        shapes, n_seqs = _shapes_of(spec, present, has_cu, args)
        result = tuple(_f32(s) for s in spec.out_shapes(shapes, n_seqs, static))
        return _callback(forward_host, result, *args)

    def backward(*operands):
        n_args = n_arrays + len(floats)

        def backward_host(*values):
            arrays, cu, opts = unpack(values[:n_args])
            inputs = spec.inputs(arrays, cu, opts)
            wanted = {spec.grad_of[n] for n in present}
            grads = spec.backward(inputs, opts, list(values[n_args:]), None, wanted)
            return tuple(grads[spec.grad_of[n]] for n in present)

        result = tuple(_f32(a.shape) for a in operands[:len(present)])
        return _callback(backward_host, result, *operands)

    return forward, backward


def _shapes_of(spec, present, has_cu, args):
    shapes = dict.fromkeys(spec.arrays)
    shapes.update((n, tuple(a.shape)) for n, a in zip(present, args))
    n_seqs = args[len(present)].shape[0] - 1 if has_cu else None
    return shapes, n_seqs


def _ffi_kernels(spec, static, present, has_cu, floats):
    """(forward, backward) as XLA FFI custom calls, each with its vmap rule (_jax_batching)."""
    table = spec.table
    n_args = len(present) + has_cu + len(floats)

    def describe(args):
        """The call over stand-ins of args' shapes (the checks of ops run again: vmap may have
        changed the batch) and the inputs object it was built from."""
        arrays = dict.fromkeys(spec.arrays)
        arrays.update((n, _stand_in(a)) for n, a in zip(present, args))
        cu = _offsets_stand_in(args[len(present)], args[0].shape[1]) if has_cu else None
        inputs = spec.inputs(arrays, cu, static)
        call = _jax_ffi.Call(table, inputs, _jax_ffi.exec_of(static))
        for n in present:
            call.array(n)
        if has_cu:
            call.offsets()
        for name in floats:
            call.value(name)
        return call, inputs

    def forward(*args):
        call, _ = describe(args)
        shapes, n_seqs = _shapes_of(spec, present, has_cu, args)
        result = [_f32(s) for s in spec.out_shapes(shapes, n_seqs, static)]
        return tuple(_jax_ffi.ffi_call("forward", result, args, call.attributes(len(result))))

    def backward(*operands):
        args = operands[:n_args]
        call, inputs = describe(args)
        for _ in operands[n_args:]:
            call.entry_arg()
        grads = [spec.grad_of[n] for n in present]
        result = [_f32(call.grad_shape(g)) for g in grads]
        out = _jax_ffi.ffi_call("backward", result, operands, call.attributes(grads=grads))
        return tuple(_given_form(spec, inputs, n, g, a) for n, g, a in zip(present, out, args))

    roles = _jax_batching.roles(spec, present, has_cu, floats)
    return (_jax_batching.folding(forward, roles, fold_parameters=True),
            _jax_batching.folding(backward, roles, fold_parameters=False))


def _given_form(spec, inputs, name, grad, arg):
    """A gradient as the library wrote it, in the shape its input was given in: dt_bias
    [HV,K], nn.Conv1d's weight [D,1,W], SSM1's B and C in their forms (ops.Ssm1Inputs.
    proj_grad does the same for NumPy)."""
    if spec is _opspec.SSM1 and name in ("B", "C"):
        form = inputs.B_form if name == "B" else inputs.C_form
        if grad.ndim == 3:  # one group: [B,T,N] -> [B,T,1,N]
            grad = grad[:, :, None]
        if form == "constant":  # [D,N]: the share of every token of every sequence
            grad = grad.sum(axis=(0, 1))
        elif form == "shared":  # one group, read by all the problem's groups
            grad = grad.sum(axis=2)
    return grad.reshape(arg.shape)


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


def _as_f32(value):
    """A float32 JAX array (as it is when it already is one: a call's cost is mostly Python)."""
    if _is_jax(value) and value.dtype == jnp.float32:
        return value
    return jnp.asarray(value, dtype=jnp.float32)


def _run(spec, arrays, cu_seqlens, opts):
    _check_now(spec, arrays, cu_seqlens, opts)
    present = tuple(n for n in spec.arrays if arrays.get(n) is not None)
    args = [_as_f32(arrays[n]) for n in present]
    if cu_seqlens is not None:
        args.append(jnp.asarray(cu_seqlens))
    static, floats, values = _split_options(opts)
    fn = _differentiable(spec, static, present, cu_seqlens is not None, floats, _CALLS)
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


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _ffi_decoder(static, names, has_rows, floats):
    """One decode step as a custom call, jitted, with its vmap rule: (arrays..., pool, [rows],
    float options...) -> (o, new pool), the new pool in the old one's buffer where XLA can."""

    def decode(*operands):
        arrays = dict.fromkeys(_opspec.KDA.arrays)
        arrays.update((n, _stand_in(a)) for n, a in zip(names, operands))
        inputs = _opspec.KDA.inputs(arrays, None, static)
        call = _jax_ffi.Call("kda", inputs, _jax_ffi.exec_of(static))
        for n in names:
            call.array(n)
        call.entry_arg()  # the pool
        if has_rows:
            call.entry_arg()
        for name in floats:
            call.value(name)
        pool = operands[len(names)]
        result = [_f32((inputs.B, 1, inputs.HV, inputs.V)), _f32(pool.shape)]
        return tuple(_jax_ffi.ffi_call("decode", result, operands,
                                       call.attributes(len(result), decode=True),
                                       aliases={len(names): 1}))

    with_rows = None if has_rows else _ffi_decoder(static, names, True, floats)
    roles = _jax_batching.decode_roles(names, has_rows, floats)
    return jax.jit(_jax_batching.folding_decode(decode, roles, with_rows))


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
    if isinstance(state_rows, jax.Array) and state_rows.dtype == jnp.int32:
        return state_rows  # nothing to canonicalize: passed as it is
    return jnp.asarray(np.where(rows < 0, -1, rows).astype(np.int32))


class JaxBackend:
    @staticmethod
    def run(spec, arrays, cu_seqlens, opts):
        """The op's outputs (a tuple) for arrays by the spec's input names (any missing one
        is absent)."""
        return _run(spec, arrays, cu_seqlens, opts)

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
        args = [_as_f32(arrays[n]) for n in names]
        state = _as_f32(state)
        static, floats, values = _split_options(opts)
        extra = [state] + ([rows] if rows is not None else [])
        if _CALLS == "ffi":
            return _ffi_decoder(static, names, rows is not None, floats)(*args, *extra, *values)
        host = _decoder(static, names, rows is not None, floats)
        result = (_f32((inputs.B, 1, inputs.HV, inputs.V)), _f32(state.shape))
        return _callback(host, result, *args, *extra, *values)

    @staticmethod
    def silu(value):
        return jax.nn.silu(value)

    @staticmethod
    def cast(value, like):
        dtype = getattr(like, "dtype", None)
        if value is None or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            return value
        return value.astype(dtype)

