"""Array interchange: any DLPack or array-interface object in, NumPy views for the kernels.

A C-contiguous float32 array is passed to the kernels without a copy (NumPy arrays as they
are, PyTorch CPU tensors and JAX CPU arrays through DLPack); anything else real-valued is
converted once to C-contiguous float32. Complex, boolean and non-numeric data are refused,
as are arrays on another device. Shapes are checked here, before any pointer reaches C: the
library trusts the sizes in its problem structs, so an array of the wrong shape must never
get there.
"""

import sys

import numpy as np


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


def _to_numpy(value, name):
    if isinstance(value, np.ndarray):
        return value
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise ValueError(f"{name}: a tensor on {value.device} was given; linseq's "
                             "Python functions run on the CPU (move it with .cpu())")
        if value.is_complex():
            raise TypeError(f"{name}: complex dtype {value.dtype} is not supported "
                            "(expected a real floating-point tensor)")
        value = value.detach()
        if value.dtype not in (torch.float32, torch.float64, torch.int64, torch.int32):
            value = value.to(torch.float32)  # bf16/fp16 have no NumPy dtype: one conversion
        return np.from_dlpack(value.resolve_conj().resolve_neg())
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


def as_f32(value, name, shape=None, what=None):
    """`value` as a C-contiguous float32 NumPy array (a view when possible).

    `shape` is the expected shape (a tuple); `what` describes it in the error message.
    """
    arr = _to_numpy(value, name)
    if arr.dtype.kind == "c":
        raise TypeError(f"{name}: complex dtype {arr.dtype} is not supported "
                        "(expected real floating-point values)")
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name}: dtype {arr.dtype} is not supported "
                        "(expected real floating-point values)")
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {what or list(shape)} = {list(shape)}, "
                         f"got {list(arr.shape)}")
    if arr.dtype != np.float32 or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
    return arr


def as_f32_ndim(value, name, ndims, what):
    """as_f32 with a rank check only (ndims: the accepted ranks), for the array that fixes
    the sizes of a problem."""
    arr = _to_numpy(value, name)
    if arr.ndim not in ndims:
        raise ValueError(f"{name}: expected {what}, got shape {list(arr.shape)}")
    if any(s == 0 for s in arr.shape):
        raise ValueError(f"{name}: expected {what} with every size >= 1, got shape "
                         f"{list(arr.shape)}")
    return as_f32(arr, name)


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
