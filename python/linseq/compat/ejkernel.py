"""ejkernel's functions by their names, with ejkernel's argument order, defaults and return
values, on linseq's kernels (NumPy arrays, PyTorch CPU tensors or JAX arrays; with PyTorch
and JAX they are differentiable).

    from ejkernel.modules import kernel_delta_attention, state_space_v1, state_space_v2
    ->  from linseq.compat.ejkernel import kernel_delta_attention, state_space_v1, \
                                           state_space_v2

Only this module's kernel_delta_attention follows ejkernel.modules (the output alone):
linseq.kernel_delta_attention (and linseq.torch's and linseq.jax's) keeps the kernel-level
contract, (output, final_state), as `kda` here.

Module level (ejkernel.modules / ejkernel.modules.operations):
    kernel_delta_attention(query, key, value, beta, decay=None, initial_state=None, *,
        softmax_scale=None, chunk_size=64, use_qk_l2norm=True, use_chunked=True,
        return_state=False, platform=None, cfg=None)
        -> output, or (output, final_state) with return_state=True
    kda_attention: the same function (ejkernel's alias)
    state_space_v1(hidden_states, A, B, C, D, dt, gate=None, initial_state=None,
        conv_state=None, *, act_fn=None, platform=None, cfg=None)
        -> (output, ssm_state, conv_state)
    state_space_v2(x, A, B, C, D, dt, gate=None, initial_state=None, conv_state=None, *,
        n_groups=1, act_fn=None, use_gated_rmsnorm=False, rmsnorm_eps=1e-5,
        precision=None, platform=None, cfg=None)
        -> (output, ssm_state, conv_state)

Kernel level (ejkernel.kernels._xla):
    kda(query, key, value, beta, decay=None, *, softmax_scale=None, chunk_size=64,
        initial_state=None, use_qk_l2norm=True, use_chunked=True) -> (output, final_state)
    kda_decay(gate, A_log, dt_bias) -> decay
    state_space_v1 also takes the kernel level's act_fn as 10th positional argument and
    block_d, block_e; state_space_v2 takes n_groups to precision positionally (the kernel
    level's order).

What differs from ejkernel, every difference a superset:
- Arguments ejkernel makes positional-only may also be passed by keyword, and
  initial_state may be passed positionally to `kda` as well.
- platform: None or one of ejkernel's names ("triton", "pallas", "cuda", "tilelang",
  "xla", "auto", "cute") is accepted and ignored: linseq runs its CPU kernels; another
  value is refused (ValueError naming platform).
- cfg: accepted; for KDA its chunk_size replaces the chunk_size argument as in ejkernel,
  everything else in it (platform, backend, block sizes) is ignored.
- chunk_size: any positive integer, as in ejkernel; linseq's chunked algorithm is exact, so
  it only picks the tile (the largest of 16, 32, 64, 128 not above it).
- block_d, block_e: positive integers, checked and ignored (GPU tile sizes); precision
  (state_space_v2's matmul precision) is ignored: the CPU kernels compute in float32.
- KDA also takes a per-channel decay [B,T,HV,K] and grouped value heads (value, beta,
  decay and the state with HV heads, HV a multiple of H); kda_decay also takes a
  per-channel gate and lower_bound; state_space_v1 also takes grouped B, C [B,T,G,N],
  D=None, dt_softplus / dt_bias and cu_seqlens (packed sequences); state_space_v2 also
  takes D=None.
- state_space_v2 refuses a positive A (ejkernel takes any real A) and B, C whose group axis
  is not n_groups (ejkernel repeats whatever it is given).
- Output dtypes are ejkernel's XLA ones: KDA output and state float32; state_space_v1's
  and state_space_v2's output and state in the input's dtype; kda_decay float32.
"""

from .._compile_blocks import compilable
from ..api import (_ejkernel_chunk_tile, _ejkernel_kda, _ejkernel_platform, kda, kda_decay,
                   state_space_v1, state_space_v2)


@compilable
def kernel_delta_attention(query, key, value, beta, decay=None, initial_state=None, *,
                           softmax_scale=None, chunk_size=64, use_qk_l2norm=True,
                           use_chunked=True, return_state=False, platform=None, cfg=None,
                           _framework=None):
    """KDA with the signature of ejkernel's module-level `kernel_delta_attention`
    (ejkernel.modules): the arguments of `kda`, initial_state the 6th positional argument,
    and it returns the output alone unless return_state=True, then (output, final_state).
    (linseq.kernel_delta_attention, the kernel-level name, always returns the pair.)

    platform: None or one of ejkernel's platform names, accepted and ignored (linseq runs
    its CPU kernels); anything else is refused. cfg: ejkernel's KernelDeltaAttentionConfig
    (or any object); as in ejkernel its chunk_size replaces the chunk_size argument, its
    platform and backend are ignored. Unlike ejkernel's, query to initial_state may also
    be passed by keyword.
    """
    _ejkernel_platform(platform)
    out, state = _ejkernel_kda(query, key, value, beta, decay, initial_state, softmax_scale,
                               _ejkernel_chunk_tile(chunk_size, cfg), use_qk_l2norm,
                               use_chunked, _framework)
    return (out, state) if return_state else out


kda_attention = kernel_delta_attention

__all__ = ["kernel_delta_attention", "kda_attention", "kda", "kda_decay", "state_space_v1",
           "state_space_v2"]
