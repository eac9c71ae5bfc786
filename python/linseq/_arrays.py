"""Array interchange: any DLPack or array-interface object in, NumPy views for the kernels.

A C-contiguous float32 array is passed to the kernels without a copy (NumPy arrays as they
are, PyTorch CPU tensors and JAX CPU arrays through DLPack); anything else real-valued is
converted once to C-contiguous float32. The dtype policy is the same for NumPy, PyTorch and
JAX: real floating-point (float16, bfloat16, float32, float64) and integer arrays are taken
(converted to float32); complex, boolean and non-numeric data are refused (TypeError), as
are arrays on another device. Offsets and state rows take integer dtypes only. The
exception: the KDA forward for inference and decode keep bfloat16 storage as it is (as_bf16,
see ops.KdaInputs), since the library reads it on the CPU. Shapes are checked here, before
any pointer reaches C: the library trusts the sizes in its problem structs, so an array of
the wrong shape must never get there.
"""

import math
import operator
import sys

import numpy as np

INT_MAX = 2**31 - 1   # a C int: what ctypes would otherwise truncate
INT64_MAX = 2**63 - 1


def framework_of(values):
    """"torch", "jax" or "numpy": the framework of the first tensor among `values`."""
    torch = sys.modules.get("torch")
    jax = sys.modules.get("jax")
    for value in values:
        if value is None:
            continue
        if torch is not None and isinstance(value, torch.Tensor):
            return "torch"
        if jax is not None and isinstance(value, (jax.Array, jax.core.Tracer)):
            return "jax"
    return "numpy"


def check_one_device(named, rename=None):
    """Refuses a call whose PyTorch tensors are on more than one device, naming the first
    argument that differs from the first tensor's device: named maps argument names to
    values (rename: {name: the name to show}); anything that is no tensor (None, NumPy
    arrays, numbers) is skipped. Made before dispatch: torch.library sends a call with a
    meta tensor among CPU ones to the op's fake implementation, which returns uninitialised
    CPU memory and writes no pool. A call with all its tensors on one device passes (all on
    meta: shapes only). O(arguments)."""
    if all(getattr(v, "is_cpu", True) for v in named.values()):
        return  # the common call: every tensor on the CPU (anything else has no is_cpu)
    torch = sys.modules.get("torch")
    tensors = [((rename or {}).get(n, n), v) for n, v in named.items()
               if torch is not None and isinstance(v, torch.Tensor)]
    if not tensors:
        return
    first_name, first = tensors[0]
    for name, value in tensors[1:]:
        if value.device != first.device:
            raise ValueError(f"{name}: a tensor on {value.device}, while {first_name} is on "
                             f"{first.device}; all tensors of a call must be on one device "
                             "(linseq computes on the CPU)")


def _to_numpy(value, name):
    if isinstance(value, np.ndarray):
        return value
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise ValueError(f"{name}: a tensor on {value.device} was given; linseq's "
                             "Python functions run on the CPU (move it with .cpu())")
        if value.is_complex() or value.dtype == torch.bool:
            refuse_dtype(name, value.dtype, value.is_complex())
        value = value.detach().resolve_conj().resolve_neg()
        if value.is_floating_point():
            if value.dtype not in (torch.float32, torch.float64):
                value = value.to(torch.float32)  # bf16/fp16 have no NumPy dtype: one conversion
            return np.from_dlpack(value)
        try:
            return np.from_dlpack(value)
        except (TypeError, BufferError, RuntimeError):
            return value.numpy()  # an integer dtype DLPack does not carry (uint64 ...)
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (TypeError, BufferError, RuntimeError):
            pass  # e.g. a dtype NumPy lacks (bfloat16): convert through the array interface
    try:
        return np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - any failure means "not an array"
        raise TypeError(f"{name}: expected an array (NumPy, PyTorch, JAX or anything with "
                        f"__dlpack__ / __array__), got {type(value).__name__}") from exc


def _is_real(arr):
    """Real floating-point or integer values: NumPy's kinds, and ml_dtypes' bfloat16 (a
    dtype of kind "V" that converts to float32 exactly)."""
    return arr.dtype.kind in "fiu" or arr.dtype.name == "bfloat16"


def refuse_dtype(name, dtype, is_complex):
    """The TypeError of every front end for a dtype outside the policy above."""
    raise TypeError(f"{name}: {'complex ' if is_complex else ''}dtype {dtype} is not "
                    "supported (expected real floating-point or integer values; complex, bool "
                    "and non-numeric arrays are refused)")


def as_f32(value, name, shape=None, what=None):
    """`value` as a C-contiguous float32 NumPy array (a view when possible).

    `shape` is the expected shape (a tuple); `what` describes it in the error message.
    """
    arr = _to_numpy(value, name)
    if not _is_real(arr):
        refuse_dtype(name, arr.dtype, arr.dtype.kind == "c")
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {what or list(shape)} = {list(shape)}, "
                         f"got {list(arr.shape)}")
    if arr.dtype != np.float32 or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
    return arr


def is_bf16(value):
    """Whether `value` holds bfloat16 storage: a PyTorch tensor of torch.bfloat16 (a fake
    tensor too, under torch.compile) or an array whose dtype is ml_dtypes' bfloat16 (NumPy,
    and JAX on the CPU)."""
    dtype = getattr(value, "dtype", None)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return dtype == torch.bfloat16
    return isinstance(dtype, np.dtype) and dtype.name == "bfloat16"


def as_bf16(value, name, shape=None, what=None):
    """bfloat16 storage (is_bf16) as a C-contiguous uint16 NumPy array of its bits: a view of
    the caller's memory when it is C-contiguous, else one contiguous copy (still bfloat16,
    no rounding). Shapes are checked as by as_f32."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise ValueError(f"{name}: a tensor on {value.device} was given; linseq's "
                             "Python functions run on the CPU (move it with .cpu())")
        # NumPy has no bfloat16 of its own: the same bytes as int16 go through DLPack
        arr = np.from_dlpack(value.detach().contiguous().view(torch.int16))
    else:
        arr = np.ascontiguousarray(np.asarray(value))
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {what or list(shape)} = {list(shape)}, "
                         f"got {list(arr.shape)}")
    return arr.view(np.uint16)


def as_bf16_ndim(value, name, ndims, what):
    """as_bf16 with the rank check of as_f32_ndim."""
    return _check_rank(as_bf16(value, name), name, ndims, what)


def bf16_result(bits):
    """A uint16 array of bfloat16 bits the kernels wrote, as ml_dtypes' bfloat16 (a view)
    when ml_dtypes is installed, else as the uint16 bits themselves."""
    try:
        import ml_dtypes
    except ImportError:
        return bits
    return bits.view(ml_dtypes.bfloat16)


def as_f32_strided(value, name, ndims, what):
    """`value` as a float32 NumPy array the kernels can read through element strides, and
    those strides: the caller's memory itself (no copy) when it already is float32 with
    non-negative strides that are whole elements and a 4-byte aligned pointer (a transposed
    or sliced view, a broadcast with zero strides), else one C-contiguous float32 copy. A
    fully broadcast array (read_as_dense) is copied too: the kernels would read its all-zero
    strides as dense.
    ndims: the accepted ranks; what describes them in the error message."""
    arr = _to_numpy(value, name)
    if not _is_real(arr):
        refuse_dtype(name, arr.dtype, arr.dtype.kind == "c")
    if arr.ndim not in ndims:
        raise ValueError(f"{name}: expected {what}, got shape {list(arr.shape)}")
    if any(s == 0 for s in arr.shape):
        raise ValueError(f"{name}: expected {what} with every size >= 1, got shape "
                         f"{list(arr.shape)}")
    itemsize = np.dtype(np.float32).itemsize
    if (arr.dtype != np.float32 or arr.ctypes.data % itemsize
            or any(s < 0 or s % itemsize for s in arr.strides)
            or read_as_dense(arr.shape, arr.strides)):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
    return arr, tuple(s // itemsize for s in arr.strides)


def read_as_dense(shape, strides):
    """Whether the kernels would misread an array of this shape and these strides (bytes or
    elements: only zero matters) if they were passed on: the C API reads element strides
    that are all zero as "dense", so an array whose every dimension of size > 1 has stride
    0 (one value repeated: a broadcast scalar, np.broadcast_to, torch's expand) must be
    materialised first. A zero stride beside a non-zero one is a broadcast the library
    reads as such (linseq_strides). O(ndim): no pass over the data."""
    repeated = [s for n, s in zip(shape, strides) if n > 1]
    return bool(repeated) and not any(repeated)


def check_pool(pool, name):
    """Refuses a state pool updated in place whose elements share memory (ValueError naming
    it): a row stride of 0 (torch's expand, np.broadcast_to: every request would read and
    write the one row, and the last write would win) or rows, or elements of a row, that
    overlap. pool: a NumPy array or PyTorch tensor. O(ndim): the dimensions of size > 1
    sorted by stride, each stride must step over everything the smaller ones span (a
    dense, sliced or transposed pool passes). Anything else is returned as it is."""
    if isinstance(pool, np.ndarray):
        if pool.flags.c_contiguous:
            return pool
        strides, unit = pool.strides, pool.itemsize
    elif hasattr(pool, "stride"):
        if pool.is_contiguous():
            return pool
        strides, unit = tuple(pool.stride()), 1
    else:
        return pool  # not an array: refused by the caller's own type check
    span = unit
    for step, n in sorted((abs(s), n) for n, s in zip(pool.shape, strides) if n > 1):
        if step < span:
            raise ValueError(f"{name}: a pool whose rows share memory (shape "
                             f"{list(pool.shape)}, strides {list(strides)}: an expanded or "
                             "overlapping view); each row is updated in place and needs "
                             "memory of its own (pass a .clone() / .copy())")
        span = step * (n - 1) + span
    return pool


def as_f32_ndim(value, name, ndims, what):
    """as_f32 with a rank check only (ndims: the accepted ranks), for the array that fixes
    the sizes of a problem."""
    return as_f32(_check_rank(_to_numpy(value, name), name, ndims, what), name)


def _check_rank(arr, name, ndims, what):
    """arr, if its rank is one of ndims and no size is 0 (the array that fixes a problem's
    sizes); else a ValueError naming it."""
    if arr.ndim not in ndims:
        raise ValueError(f"{name}: expected {what}, got shape {list(arr.shape)}")
    if any(s == 0 for s in arr.shape):
        raise ValueError(f"{name}: expected {what} with every size >= 1, got shape "
                         f"{list(arr.shape)}")
    return arr


def as_cu_seqlens(value, n_tokens, name="cu_seqlens"):
    """cu_seqlens as a contiguous int64 array, with its values checked (the library checks
    them again; this gives the Python error first)."""
    arr = _to_numpy(value, name)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer offsets, got dtype {arr.dtype}")
    if arr.ndim != 1 or arr.shape[0] < 2:
        raise ValueError(f"{name}: expected a 1-D array of n_seqs + 1 >= 2 offsets, got shape "
                         f"{list(arr.shape)}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr[0] != 0 or arr[-1] != n_tokens or np.any(np.diff(arr) < 0):
        raise ValueError(f"{name}: expected non-decreasing offsets from 0 to T = {n_tokens}, "
                         f"got {arr.tolist() if arr.size <= 16 else arr}")
    return arr


def as_row_indices(value, n_rows, name="state_indices"):
    """Pool rows as a contiguous int64 [n_rows] array: integer dtypes only (a float, NaN or
    bool row would be rounded into a real row or padding), every value within int64."""
    arr = _to_numpy(value, name)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer rows, got dtype {arr.dtype}")
    if arr.shape != (n_rows,):
        raise ValueError(f"{name}: expected shape [B] = [{n_rows}], got {list(arr.shape)}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > INT64_MAX:
        raise ValueError(f"{name}: row {int(arr.max())} is beyond int64")
    return np.ascontiguousarray(arr, dtype=np.int64)


def as_c_int(value, name, low=0):
    """An integer option as the C int the library reads: refused, not truncated, outside
    [low, INT_MAX]; bools and floats are refused."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__} "
                        f"{value!r}") from None
    if not low <= n <= INT_MAX:
        raise ValueError(f"{name}: expected {low} <= {name} <= {INT_MAX}, got {n}")
    return n


def _is_traced(value):
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(value, jax.core.Tracer)


def as_float32_option(value, name):
    """A real scalar option (a Python number or a 0-d array of any framework): (its value as
    a Python float, the float32 the library would read), so the caller can refuse a value that
    float32 turns into 0 or inf. Traced JAX values, bools, strings and arrays of more than
    one value are refused by name."""
    if _is_traced(value):
        raise TypeError(f"{name}: a traced JAX value was given; linseq needs the option's "
                        "value when the call is made (pass a Python number, and under jax.jit "
                        "mark the argument static)")
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a real number, got {value!r}")
    if isinstance(value, int):
        x = float(value) if abs(value) < 2**1000 else (math.inf if value > 0 else -math.inf)
    else:
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
        arr = _to_numpy(value, name)
        if arr.shape != () or arr.dtype.kind not in "fiu":
            raise TypeError(f"{name}: expected a real number, got an array of shape "
                            f"{list(arr.shape)} and dtype {arr.dtype}")
        x = float(arr)
    with np.errstate(over="ignore"):
        return x, float(np.float32(x))


def ptr(arr):
    """The data pointer of a NumPy array, or None (NULL) for None."""
    return None if arr is None else arr.ctypes.data


def data_pointer(value):
    """The address of the first element of a NumPy array, PyTorch tensor or JAX array; used
    to show that an input reached the kernels without a copy."""
    if isinstance(value, np.ndarray):
        return value.__array_interface__["data"][0]
    if hasattr(value, "data_ptr"):
        return value.data_ptr()
    if hasattr(value, "unsafe_buffer_pointer"):
        return value.unsafe_buffer_pointer()
    raise TypeError(f"no data pointer for {type(value).__name__}")


def wrap_like(framework, arr):
    """A NumPy result handed back in the caller's framework (PyTorch shares the memory)."""
    if arr is None or framework == "numpy":
        return arr
    if framework == "torch":
        import torch
        return torch.from_numpy(arr)
    import jax.numpy as jnp
    return jnp.asarray(arr)
