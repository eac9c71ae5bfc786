"""linseq: exact linear-time sequence-mixing kernels (KDA, Mamba1 and Mamba2 scans, causal
conv1d).

The functions take NumPy arrays, PyTorch CPU tensors or JAX arrays and answer in the same
framework; with PyTorch and JAX they are differentiable through linseq's C backward.

    kda / kernel_delta_attention, kda_decay,                    ejkernel's signatures
    state_space_v1 (Mamba1), state_space_v2 (Mamba2)
        (kernel level: kda and kernel_delta_attention return (output, final_state);
        ejkernel.modules' output-only kernel_delta_attention is linseq.compat.ejkernel's)
    chunk_kda, fused_recurrent_kda, causal_conv1d               fla-core's signatures
    kda_decode                                                  one token, a pool of states

linseq.torch and linseq.jax hold the same functions bound to one framework; linseq.ops has
the kernels on NumPy arrays with every option of the C API, forward and backward.
"""

from . import ops
from ._arrays import data_pointer
from ._lib import LinseqError, get_num_threads, isa, set_num_threads, version
from .api import (causal_conv1d, chunk_kda, fused_recurrent_kda, kda, kda_decay, kda_decode,
                  kernel_delta_attention, run, state_space_v1, state_space_v2)

__version__ = version()

__all__ = ["kda", "kernel_delta_attention", "kda_decay", "chunk_kda", "fused_recurrent_kda",
           "kda_decode", "state_space_v1", "state_space_v2", "causal_conv1d", "run", "ops",
           "LinseqError", "set_num_threads", "get_num_threads", "isa", "version", "data_pointer"]
