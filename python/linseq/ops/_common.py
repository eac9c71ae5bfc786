"""What the NumPy calls of every op share: the exec, the scalar options' checks, the small
input conversions, and the op table's part: every tensor's shape under a problem (one
linseq_op_shapes call per problem), from which the outputs and gradients are allocated and
the inputs checked one last time before their pointers reach C."""

import ctypes

import numpy as np

from .. import _lib
from .._arrays import as_c_int, as_cu_seqlens, as_f32, as_float32_option, ptr

_MODES = {"chunked": _lib.MODE_CHUNKED, "recurrent": _lib.MODE_RECURRENT,
          "default": _lib.MODE_DEFAULT}

ACTIVATIONS = {
    "identity": _lib.ACT_IDENTITY, "linear": _lib.ACT_IDENTITY, "none": _lib.ACT_IDENTITY,
    "silu": _lib.ACT_SILU, "swish": _lib.ACT_SILU, "sigmoid": _lib.ACT_SIGMOID,
    "gelu_tanh": _lib.ACT_GELU_TANH, "gelu_pytorch_tanh": _lib.ACT_GELU_TANH,
    "relu": _lib.ACT_RELU,
}


# linseq_dtype: what the per-token tensors of a call are stored as (include/linseq.h)
DTYPE_F32, DTYPE_BF16 = 0, 1
# linseq_products: the operands of the chunked KDA and SSD forwards' output products
# (include/linseq.h)
PRODUCTS_F32, PRODUCTS_BF16 = 0, 1


def make_exec(mode="chunked", chunk_size=64, threads=0, bf16=False, bf16_products=False):
    if mode not in _MODES:
        raise ValueError(f"mode: expected one of {sorted(_MODES)}, got {mode!r}")
    if chunk_size not in (16, 32, 64, 128):
        raise ValueError(f"chunk_size: expected 16, 32, 64 or 128, got {chunk_size!r}")
    ex = _lib.Exec(_MODES[mode], int(chunk_size), as_c_int(threads, "threads"))
    ex.dtype = DTYPE_BF16 if bf16 else DTYPE_F32
    ex.products = PRODUCTS_BF16 if bf16_products else PRODUCTS_F32
    return ex


def scale_option(scale):
    """None (K^-0.5), or the scale as the float32 the library reads; refused when float32
    makes it 0 (which the library would read as K^-0.5) or not finite."""
    if scale is None:
        return None
    given, f = as_float32_option(scale, "scale")
    if not (np.isfinite(f) and f != 0):
        raise ValueError(f"scale: expected None (K^-0.5) or a finite non-zero number that "
                         f"stays so in float32, got {given!r} (float32: {f!r})")
    return f


def lower_bound_option(lower_bound):
    """None (the default gate), or the bound as the float32 the library reads; refused when
    float32 makes it 0 (the library's default gate), or it is not finite and negative."""
    if lower_bound is None:
        return None
    given, f = as_float32_option(lower_bound, "lower_bound")
    if not (np.isfinite(f) and f < 0):
        raise ValueError(f"lower_bound: expected None (the default gate) or a finite negative "
                         f"number that stays negative in float32, got {given!r} "
                         f"(float32: {f!r})")
    return f


def activation_code(activation, default):
    if activation is None:
        return default
    if isinstance(activation, str) and activation.lower() in ACTIVATIONS:
        return ACTIVATIONS[activation.lower()]
    raise ValueError(f"activation: expected None or one of {sorted(ACTIVATIONS)}, got "
                     f"{activation!r}")


def strides(elems):
    """A linseq_strides from (batch, token, channel, state) element strides."""
    return _lib.Strides(*elems)


def empty(shape):
    return np.empty(shape, dtype=np.float32)


def optional(value, name, shape, what):
    return None if value is None else as_f32(value, name, shape, what)


def sequences(cu_seqlens, B, T):
    """(cu_seqlens as checked int64 or None, the number of state rows)."""
    if cu_seqlens is None:
        return None, B
    if B != 1:
        raise ValueError(f"cu_seqlens: packed sequences need B == 1, got B = {B}")
    cu = as_cu_seqlens(cu_seqlens, T)
    return cu, cu.shape[0] - 1


def gate_bias(dt_bias, per_channel, heads, K, letter):
    """(dt_bias flattened to [heads*K] or [heads], its shape as given), or (None, None).
    Per channel it may come as [heads*K] or exactly [heads,K] (a [K,heads] or other array of
    the same size is refused, not flattened); its gradient is handed back in that shape."""
    if dt_bias is None:
        return None, None
    if per_channel:
        shapes = {(heads * K,), (heads, K)}
        what = f"[{letter}*K] = [{heads * K}] or [{letter},K] = [{heads},{K}]"
    else:
        shapes, what = {(heads,)}, f"[{letter}] = [{heads}]"
    dt = as_f32(dt_bias, "dt_bias")
    if dt.shape not in shapes:
        raise ValueError(f"dt_bias: expected shape {what}, got {list(dt.shape)}")
    return dt.reshape(-1), dt.shape


# ------------------------------------------------------------------------------------------
# From the library's op table: the shapes of every op's tensors under a problem, and the last
# check of its inputs before their pointers reach C. An inputs object (KdaInputs, ...) asks
# for its problem's shapes once, in check_inputs, and keeps them as `shapes` for the call.
# ------------------------------------------------------------------------------------------

def pointer(arr):
    """NULL for an absent array, and for an empty one (a state with a zero dimension)."""
    return None if arr is None or arr.size == 0 else ptr(arr)


def check_inputs(op, inputs, strided=()):
    """Every input array the problem points at has exactly the shape the library's op table
    gives it under that problem: whatever a front end inferred from the arrays, no pointer
    reaches C with fewer elements than its shape needs. `strided`: the inputs passed with
    their own strides (checked by their front end; the library checks the span they reach).
    Sets inputs.shapes, the problem's shapes (_lib.Shapes) for the rest of the call."""
    shapes = inputs.shapes = _lib.Shapes(op, inputs.problem)
    for t in _lib.op_tensors(op, "input"):
        arr = getattr(inputs, t["field"])
        if arr is None or t["name"] in strided:
            continue
        want = shapes[t["name"]]
        if want != tuple(arr.shape):
            raise ValueError(f"{t['name']}: expected shape {t['dims']} = "
                             f"{list(want) if want else 'absent with these options'}, got "
                             f"{list(arr.shape)}")


def outputs(op, inputs, final_state, first_bf16=False):
    """New arrays for the forward's outputs (the first always, the state with final_state:
    None otherwise), and the pointers to pass. first_bf16: the first output (the per-token
    one) is bfloat16 storage, a uint16 array of its bits."""
    arrays = []
    for i, t in enumerate(_lib.op_tensors(op, "output")):
        shape = inputs.shapes[t["name"]]
        if shape is None or not (i == 0 or final_state):
            arrays.append(None)
        else:
            arrays.append(np.empty(shape, np.uint16) if i == 0 and first_bf16 else empty(shape))
    return arrays, [pointer(a) for a in arrays]


def upstream(op, inputs, values):
    """The upstream gradients as float32 arrays of their outputs' shapes (None stays None)."""
    out = []
    for t, value in zip(_lib.op_tensors(op, "upstream"), values):
        shape = inputs.shapes[t["name"]]
        out.append(None if value is None or shape is None else
                   as_f32(value, t["name"], shape, f"{t['dims']} like {t['grad_of']}"))
    return out


def grads(op, inputs, wanted):
    """New arrays for the gradients that exist with the problem's options (those named in
    `wanted`, or all), and the op's grads struct over them (_lib.NoBackward for an op
    without a backward)."""
    struct = _lib.grads_class(op)
    out, fields = {}, {}
    for t in _lib.op_tensors(op, "grad"):
        shape = inputs.shapes[t["name"]]
        if shape is None or (wanted is not None and t["name"] not in wanted):
            continue
        out[t["name"]] = empty(shape)
        fields[t["field"]] = pointer(out[t["name"]])
    return out, struct(**fields)


def saved_bytes(name, problem, ex):
    """The bytes of the block linseq_<name>_forward_train keeps for its backward ("kda",
    "ssm1") under `problem` and `ex`: the library's own size query, which reads only the
    problem's sizes and cu_seqlens."""
    size = ctypes.c_size_t(0)
    _lib.check(getattr(_lib.lib, f"linseq_{name}_saved_size")(
        ctypes.byref(problem), ctypes.byref(ex), ctypes.byref(size)))
    return size.value


def forward_train(name, inputs, ex, final_state=True, n_floats=None):
    """(outputs, saved) of linseq_<name>_forward_train ("kda", "ssm1"): the forward plus the
    block its backward_saved reads. The block is exactly the library's size, or with n_floats
    an array of that many floats (a size announced before the call, e.g. from the shapes alone:
    at least the library's), zero-filled, since the layout may leave bytes it never writes and
    an op's outputs must be a function of its inputs."""
    size = saved_bytes(name, inputs.problem, ex)
    # float32 storage keeps the block aligned for the floats the library writes into it
    if n_floats is None:
        saved = np.empty(-(-size // 4), dtype=np.float32)
    else:
        saved = np.zeros(n_floats, np.float32)
        if size > saved.nbytes:
            raise RuntimeError(f"linseq::{name}: the saved block needs {size} bytes, more "
                               f"than the {saved.nbytes} announced from the shapes")
    arrays, out = outputs(name, inputs, final_state)
    _lib.check(getattr(_lib.lib, f"linseq_{name}_forward_train")(
        ctypes.byref(inputs.problem), ctypes.byref(ex), *out, ptr(saved), saved.nbytes))
    return list(arrays), saved
