"""The NumPy backend: the C kernels on NumPy arrays, forward only (NumPy has no autodiff;
linseq.ops has the backward functions). The registry (_backends) picks it for NumPy inputs
and anything that is neither a PyTorch tensor nor a JAX array."""

import numpy as np

from . import ops


class NumpyBackend:
    """Runs the forward only: NumPy has no autodiff (ops has the backward functions)."""

    @staticmethod
    def run(spec, arrays, cu_seqlens, opts):
        # NumPy has no autodiff: bfloat16 storage always stays bfloat16 (ops.kda_bf16_storage)
        outputs, _ = spec.forward(spec.inputs(arrays, cu_seqlens, opts, bf16=True), opts, False)
        return tuple(outputs)

    @staticmethod
    def kda_decode(arrays, state, state_rows, opts, inplace):
        if not inplace:
            state = np.array(ops.as_f32(state, "state"), dtype=np.float32, copy=True)
        elif not isinstance(state, np.ndarray):
            raise TypeError("state: inplace=True needs the pool as a NumPy array, PyTorch "
                            "tensor (float32, C-contiguous) it can write")
        o = ops.kda_decode(opts.inputs(arrays, None, bf16=True), state, state_rows)
        return o, state

    @staticmethod
    def silu(value):
        # sigmoid as 0.5 (1 + tanh(v / 2)): the same function, with no exp to overflow
        return value * (0.5 * (1.0 + np.tanh(0.5 * value)))

    @staticmethod
    def cast(value, like):
        dtype = getattr(like, "dtype", None)
        if value is None or dtype is None or not np.issubdtype(dtype, np.floating):
            return value
        return value.astype(dtype, copy=False)
