"""The public functions, with the signatures of the APIs people already call.

- ejkernel (JAX): `kda` / `kernel_delta_attention` (kernel level: (output, final_state)),
  `kda_decay`, `state_space_v1`, `state_space_v2` (Mamba2, on the "ssd" op); ejkernel's
  module-level `kernel_delta_attention` (the output alone) is linseq.compat.ejkernel's, over
  the helpers here;
- fla-core (PyTorch): `chunk_kda`, `fused_recurrent_kda` (from _fla_signatures, the same
  functions linseq.compat.fla exports), `causal_conv1d`;
- `kda_decode`: one token for many requests against a pool of states;
- `run`: any op of the library's table by name, its arrays by the table's names and its
  options as keywords; the functions above are written over the same call.

Each function takes NumPy arrays, PyTorch CPU tensors or JAX arrays and answers in the same
framework: NumPy runs the kernels directly, PyTorch goes through torch.library custom ops
(linseq.torch) so `loss.backward()` reaches the C backward, JAX through jax.custom_vjp over
XLA FFI custom calls (linseq.jax; jax.pure_callback where the handlers were not built),
usable under jit, grad and vmap. A call is described once, as an op spec (_opspec), arrays
and frozen options (_options); each framework's backend runs it (backend.run). The functions
whose checks build ctypes structs (kda, kernel_delta_attention, kda_decode) are compilable
(_compile_blocks): under torch.compile they run as non-strict traced blocks.
"""

import numpy as np

from . import _opspec
from ._backends import backend_for
from ._compile_blocks import compilable
from ._fla_signatures import chunk_kda, fused_recurrent_kda
from ._options import ConvOptions, GateOptions, KdaOptions, Ssm1Options, kernel_activation

__all__ = ["run", "kda", "kernel_delta_attention", "kda_decay", "chunk_kda",
           "fused_recurrent_kda", "kda_decode", "state_space_v1", "state_space_v2",
           "causal_conv1d", "KdaOptions", "Ssm1Options", "ConvOptions", "GateOptions"]


def run(op, arrays, cu_seqlens=None, *, _framework=None, **options):
    """One op of the C library's table, forward, in the framework of the arrays given.

    op: "kda", "kda_gate", "ssm1" or "causal_conv1d"; arrays: a dict by the table's input
    names (_opspec.SPECS[op].arrays; a missing one is absent); cu_seqlens: packed sequences
    (B == 1), where the op takes them; options: the fields of the op's options class
    (KdaOptions, GateOptions, Ssm1Options, ConvOptions), checked as they are. Returns the
    op's outputs as a tuple, in the table's order (float32; KDA's first output bfloat16
    where its inputs are and no gradient is needed). Differentiable as the functions below.
    """
    spec = _opspec.by_name(op)
    unknown = set(arrays) - set(spec.arrays)
    if unknown:
        raise ValueError(f"arrays: {op} takes {list(spec.arrays)}, got {sorted(unknown)}")
    full = {n: arrays.get(n) for n in spec.arrays}
    backend = backend_for(list(full.values()) + [cu_seqlens], _framework)
    return backend.run(spec, full, cu_seqlens, spec.options(**options))


# ------------------------------------------------------------------------------------------
# ejkernel-style KDA
# ------------------------------------------------------------------------------------------

_EJKERNEL_PLATFORMS = ("triton", "pallas", "cuda", "tilelang", "xla", "auto", "cute")
_CHUNK_TILES = (16, 32, 64, 128)


def _ejkernel_platform(platform):
    """ejkernel's `platform` picks its GPU/TPU backend; linseq runs its CPU kernels whatever
    it says, so None or one of ejkernel's names is accepted (and changes nothing) and
    anything else is refused, as ejkernel refuses it."""
    if platform is not None and not (isinstance(platform, str)
                                     and platform in _EJKERNEL_PLATFORMS):
        raise ValueError(f"platform: expected None or one of {list(_EJKERNEL_PLATFORMS)}, got "
                         f"{platform!r}")


def _ejkernel_chunk_tile(chunk_size, cfg=None):
    """The chunk tile linseq runs for ejkernel's chunk_size: ejkernel takes any positive
    size (it pads the sequence) and reads cfg.chunk_size in its place when a config is
    given. The chunked algorithm is exact, so the tile changes the speed, not the result:
    the largest of 16, 32, 64, 128 that does not exceed the size (16 below 16)."""
    name = "chunk_size"
    if getattr(cfg, "chunk_size", None) is not None:
        chunk_size, name = cfg.chunk_size, "cfg.chunk_size"
    if (isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer))
            or chunk_size <= 0):
        raise ValueError(f"{name}: expected a positive integer, got {chunk_size!r}")
    fitting = [c for c in _CHUNK_TILES if c <= chunk_size]
    return fitting[-1] if fitting else _CHUNK_TILES[0]


def _ejkernel_kda(query, key, value, beta, decay, initial_state, softmax_scale, tile,
                  use_qk_l2norm, use_chunked, framework):
    arrays = dict(q=query, k=key, v=value, beta=beta, g=decay, h0=initial_state,
                  A_log=None, dt_bias=None)
    opts = KdaOptions(scale=softmax_scale, qk_l2norm=use_qk_l2norm,
                      mode="chunked" if use_chunked else "recurrent", chunk_size=tile)
    backend = backend_for(arrays.values(), framework)
    return backend.run(_opspec.KDA, arrays, None, opts)


@compilable
def kda(query, key, value, beta, decay=None, initial_state=None, *, softmax_scale=None,
        chunk_size=64, use_qk_l2norm=True, use_chunked=True, _framework=None):
    """KDA (gated delta rule), the signature of ejkernel's kernel-level `kda`: always
    returns (output, final_state).

    query, key [B,T,H,K]; value [B,T,H,V] (or [B,T,HV,V], HV a multiple of H); beta
    [B,T,HV]; decay [B,T,HV] (per head), [B,T,HV,K] (per channel) or None (no decay), as
    log decays <= 0; initial_state [B,HV,K,V] (keyword, or the 6th positional argument).
    softmax_scale defaults to K**-0.5 and multiplies q after the L2 norm (x / sqrt(|x|^2 +
    1e-6), with use_qk_l2norm). use_chunked picks the chunked algorithm or the
    token-by-token recurrence: both are exact. chunk_size is any positive integer, as in
    ejkernel; it picks the tile (the largest of 16, 32, 64, 128 not above it), not the
    result.
    Returns (output [B,T,HV,V] float32, final_state [B,HV,K,V] float32).

    bfloat16 (NumPy and PyTorch): when query, key, value, beta and decay (if given) are all
    bfloat16 (torch.bfloat16 tensors, NumPy arrays of ml_dtypes.bfloat16) and no gradient is
    needed, the kernels read them where they lie (no copy) and the output is bfloat16: the
    float32 result on the same values, rounded once to nearest even. The final state stays
    float32 (initial_state is read as float32). When a gradient is needed (PyTorch: grad
    mode on and some input requires_grad) the float32 path runs, because the backward takes
    float32; so does any other mix of dtypes (no input is rounded to bfloat16 on the way
    in), and the output is then float32. The same holds for chunk_kda, fused_recurrent_kda
    and kda_decode (which answer in the caller's dtype as fla does).
    """
    return _ejkernel_kda(query, key, value, beta, decay, initial_state, softmax_scale,
                         _ejkernel_chunk_tile(chunk_size), use_qk_l2norm, use_chunked,
                         _framework)


@compilable
def kernel_delta_attention(query, key, value, beta, decay=None, initial_state=None, *,
                           softmax_scale=None, chunk_size=64, use_qk_l2norm=True,
                           use_chunked=True, _framework=None, **kwargs):
    """KDA under its other name, with the kernel-level contract linseq has had from the
    start: the arguments of `kda`, and it always returns (output, final_state):

        output, state = kernel_delta_attention(q, k, v, beta, decay, chunk_size=16)

    ejkernel's module-level function of the same name (ejkernel.modules: the output alone
    unless return_state=True; platform, cfg) is linseq.compat.ejkernel.kernel_delta_attention;
    its keywords are refused here with a TypeError that says so.
    """
    for name in kwargs:
        if name in _MODULE_LEVEL_KEYWORDS:
            raise TypeError(
                f"kernel_delta_attention: {name} is an argument of ejkernel.modules' "
                "kernel_delta_attention, which is linseq.compat.ejkernel.kernel_delta_attention"
                "; linseq.kernel_delta_attention is the kernel-level function (always "
                "(output, final_state))")
        raise TypeError(f"kernel_delta_attention() got an unexpected keyword argument {name!r}")
    return kda(query, key, value, beta, decay, initial_state, softmax_scale=softmax_scale,
               chunk_size=chunk_size, use_qk_l2norm=use_qk_l2norm, use_chunked=use_chunked,
               _framework=_framework)


_MODULE_LEVEL_KEYWORDS = ("return_state", "platform", "cfg")


def kda_decay(gate, A_log, dt_bias, *, lower_bound=None, _framework=None):
    """The KDA / Gated DeltaNet decay from the raw gate: -exp(A_log) * softplus(gate +
    dt_bias), or lower_bound * sigmoid(exp(A_log) * (gate + dt_bias)) with lower_bound < 0.

    Per head: gate [B,T,H], A_log [H], dt_bias [H]. Per channel: gate [B,T,H,K], dt_bias
    [H*K] or [H,K]. Returns the log decay in gate's shape, float32.
    """
    arrays = dict(g_raw=gate, A_log=A_log, dt_bias=dt_bias)
    backend = backend_for(arrays.values(), _framework)
    return backend.run(_opspec.KDA_GATE, arrays, None, GateOptions(lower_bound=lower_bound))[0]


# ------------------------------------------------------------------------------------------
# Decode
# ------------------------------------------------------------------------------------------

@compilable
def kda_decode(q, k, v, g, beta, state, state_indices=None, *, scale=None,
               use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None,
               dt_bias=None, lower_bound=None, use_beta_sigmoid_in_kernel=False,
               state_v_first=False, inplace=False, _framework=None):
    """One decode step for B requests, each with its state in a pool.

    q, k [B,1,H,K] (or [B,H,K]); v [B,1,HV,V]; g [B,1,HV,K] or [B,1,HV]; beta [B,1,HV];
    state: the pool [R,HV,K,V] ([R,HV,V,K] with state_v_first); state_indices [B] maps each
    request to its row (default: request b uses row b); a negative index is a padding request
    whose output is 0. With inplace=True the pool is updated where it is (a float32
    C-contiguous NumPy array or PyTorch tensor) and returned; otherwise a new pool is
    returned and the given one is untouched (JAX arrays are immutable: inplace=False only).
    Returns (o [B,1,HV,V] float32, state). With q, k, v, g and beta all bfloat16 (NumPy and
    PyTorch; decode has no backward) they are read without a copy and o is bfloat16, the
    float32 result rounded once; the pool is float32 either way (see kda).
    """
    if state is None:
        raise ValueError("state: a state is required: the pool [R,HV,K,V] ([R,HV,V,K] with "
                         "state_v_first) that each request's row is read from and written to "
                         "(zeros for a request that starts fresh)")

    def token(x):
        shape = np.shape(x)
        return x if x is None or len(shape) != 3 else x[:, None]
    arrays = dict(q=token(q), k=token(k), v=token(v), beta=beta, g=g, h0=None,
                  A_log=A_log, dt_bias=dt_bias)
    if arrays["beta"] is not None and len(np.shape(arrays["beta"])) == 2:
        arrays["beta"] = arrays["beta"][:, None]
    if g is not None and len(np.shape(q)) == 3:
        arrays["g"] = g[:, None]
    opts = KdaOptions(scale=scale, qk_l2norm=use_qk_l2norm_in_kernel,
                      beta_is_logit=use_beta_sigmoid_in_kernel, state_v_first=state_v_first,
                      gate_in_kernel=use_gate_in_kernel, lower_bound=lower_bound,
                      mode="recurrent")
    backend = backend_for(list(arrays.values()) + [state], _framework)
    return backend.kda_decode(arrays, state, state_indices, opts, bool(inplace))


# ------------------------------------------------------------------------------------------
# SSM1 and conv
# ------------------------------------------------------------------------------------------

def state_space_v1(hidden_states, A, B, C, D, dt, gate=None, initial_state=None,
                   conv_state=None, act_fn=None, *, platform=None, cfg=None, block_d=64,
                   block_e=128, dt_softplus=False, dt_bias=None, cu_seqlens=None,
                   _framework=None):
    """The Mamba1 selective scan, ejkernel's `state_space_v1` signature (its module-level
    arguments and its kernel-level block_d, block_e).

    hidden_states, dt [B,T,D] (dt already after softplus, unless dt_softplus); A [D,N]; B, C
    [B,T,N] (or [B,T,G,N] with G groups dividing D); D [D] or None; gate [B,T,D] or None;
    initial_state [B,D,N]. With a gate the output is y * act_fn(gate); act_fn None means
    silu; silu, sigmoid, relu and tanh-gelu (names, or the framework's own functions) run in
    the kernel, any other callable is applied here in the caller's framework (and
    differentiated by it). conv_state is returned unchanged, as ejkernel does (the conv and
    its cache update belong to the caller; see causal_conv1d). dt_softplus=True takes dt
    raw and runs softplus(dt + dt_bias) in the kernel (dt_bias [D], optional).

    platform (None or one of ejkernel's names), cfg (ejkernel's StateSpaceV1Config),
    block_d and block_e (positive integers) choose ejkernel's backend and GPU tile sizes:
    they are checked and ignored, linseq runs its CPU kernel.
    Returns (y [B,T,D], ssm_state [B,D,N], conv_state), y and ssm_state in hidden_states'
    dtype as ejkernel returns them (float32 for integer inputs).
    """
    _ejkernel_platform(platform)
    for name, value in (("block_d", block_d), ("block_e", block_e)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name}: expected a positive integer (a GPU tile size, "
                             f"ignored on the CPU), got {value!r}")
    kernel_act = kernel_activation(act_fn) if gate is not None else None
    in_kernel_gate = gate if (gate is None or kernel_act is not None) else None
    arrays = dict(x=hidden_states, dt=dt, A=A, B=B, C=C, D=D, gate=in_kernel_gate,
                  h0=initial_state, dt_bias=dt_bias)
    backend = backend_for(list(arrays.values()) + [gate, cu_seqlens], _framework)
    y, h = backend.run(_opspec.SSM1, arrays, cu_seqlens,
                       Ssm1Options(activation=kernel_act, dt_softplus=bool(dt_softplus)))
    if gate is not None and kernel_act is None:
        y = y * act_fn(gate)  # the caller's framework differentiates this product
    return backend.cast(y, hidden_states), backend.cast(h, hidden_states), conv_state


def causal_conv1d(x, weight, bias=None, activation=None, conv_state=None, *, cu_seqlens=None,
                  _framework=None):
    """Causal depthwise conv1d: y[t,d] = act(bias[d] + sum_j weight[d,j] x[t-W+1+j,d]).

    x [B,T,D]; weight [D,W] (or nn.Conv1d's [D,1,W]); bias [D]; activation None /
    "identity" or "silu" / "swish" (also "sigmoid", "relu", "gelu_tanh"); conv_state
    [N,D,W-1], the W-1 inputs before the sequence, oldest first (zeros when None);
    cu_seqlens: packed sequences (B == 1). Returns (y [B,T,D] in x's dtype, final conv state
    [N,D,W-1] float32), the state to pass to the next call of the same sequences.
    """
    arrays = dict(x=x, weight=weight, bias=bias, conv_state=conv_state)
    backend = backend_for(list(arrays.values()) + [cu_seqlens], _framework)
    y, state = backend.run(_opspec.CONV1D, arrays, cu_seqlens, ConvOptions(activation=activation))
    return backend.cast(y, x), state


# ------------------------------------------------------------------------------------------
# SSD (Mamba2)
# ------------------------------------------------------------------------------------------

_SSD = _opspec.by_name("ssd")


def state_space_v2(x, A, B, C, D, dt, gate=None, initial_state=None, conv_state=None,
                   n_groups=1, act_fn=None, use_gated_rmsnorm=False, rmsnorm_eps=1e-5,
                   precision=None, *, platform=None, cfg=None, _framework=None):
    """Mamba2's scan (SSD), ejkernel's `state_space_v2` signature (its kernel level's
    positional order, and its module level's platform and cfg).

    x [batch, seq_len, num_heads, head_dim]; A [num_heads], real (exp(dt A) is the decay),
    each <= 0 (a positive A is refused: the C kernel's contract); B, C [batch, seq_len,
    n_groups, ssm_state_size], head h reading group h // (num_heads // n_groups) (ejkernel
    repeats each group over its consecutive heads); D [num_heads] or None (no skip); dt
    [batch, seq_len, num_heads], already after softplus; gate [batch, seq_len, num_heads *
    head_dim] or None; initial_state [batch, num_heads, head_dim, ssm_state_size] (zeros
    when None), the layout of linseq's "ssd" op, so nothing is transposed. Per head, from S =
    initial_state:
        S = exp(dt_t A) S + dt_t x_t B_t^T,   y_t = S C_t + D x_t.
    With a gate (act_fn None means silu; a name may only be "silu"): y * act_fn(gate), or
    with use_gated_rmsnorm rmsnorm(y) * act_fn(gate), the mean square over all num_heads *
    head_dim channels of a token, plus rmsnorm_eps (>= 0), and no weight; both in float32.
    Without a gate use_gated_rmsnorm changes nothing, as in ejkernel. The silu gate without
    the norm runs in the kernel (its z); the norm and any other act_fn run in the caller's
    framework, which differentiates them. conv_state is returned unchanged (the conv and its
    cache belong to the caller; see causal_conv1d).

    precision (a matmul precision), platform (None or one of ejkernel's names) and cfg
    choose ejkernel's backend: checked where they can be and ignored, linseq runs its CPU
    kernel. Returns (y [batch, seq_len, num_heads * head_dim], ssm_state [batch, num_heads,
    head_dim, ssm_state_size], conv_state), y and ssm_state in x's dtype as ejkernel
    returns them (float32 for integer inputs).
    """
    _ssv2_check_options(platform, rmsnorm_eps)
    act = _ssv2_activation(act_fn)
    in_kernel = gate is not None and act == "silu" and not use_gated_rmsnorm
    backend = backend_for([x, A, B, C, D, dt, gate, initial_state], _framework)
    y, h = _ssv2_scan(x, A, B, C, D, dt, gate, initial_state, n_groups, in_kernel,
                      _framework=_framework)
    if gate is not None and not in_kernel:
        y = _ssv2_gate(y, gate, backend.silu if act == "silu" else act, use_gated_rmsnorm,
                       rmsnorm_eps, backend)
    return backend.cast(y, x), backend.cast(h, x), conv_state


def _ssv2_check_options(platform, rmsnorm_eps):
    _ejkernel_platform(platform)
    if (isinstance(rmsnorm_eps, bool) or not isinstance(rmsnorm_eps, (int, float, np.floating))
            or not rmsnorm_eps >= 0):
        raise ValueError(f"rmsnorm_eps: expected a number >= 0, got {rmsnorm_eps!r}")


def _ssv2_activation(act_fn):
    """"silu" for None, the name silu or a framework's silu; else act_fn, a callable."""
    if isinstance(act_fn, str) and kernel_activation(act_fn) != "silu":
        raise ValueError(f"act_fn: state_space_v2 takes a callable or 'silu' (by name), got "
                         f"{act_fn!r}")
    if act_fn is None or kernel_activation(act_fn) == "silu":
        return "silu"
    if not callable(act_fn):
        raise ValueError(f"act_fn: expected None, 'silu' or a callable, got {act_fn!r}")
    return act_fn


def _ssv2_scan(x, A, B, C, D, dt, gate, initial_state, n_groups, gate_in_kernel,
               _framework=None):
    """The scan on linseq's "ssd" op: (y [batch, seq_len, num_heads * head_dim], the final
    state), float32; gated by silu(gate) in the kernel when gate_in_kernel. The gate's shape
    is checked either way."""
    Bn, T, H, P = _ssv2_sizes(x, A, B, C, D, dt, gate, initial_state, n_groups)
    z = gate.reshape(Bn, T, H, P) if gate_in_kernel else None
    arrays = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, h0=initial_state, dt_bias=None)
    backend = backend_for(list(arrays.values()) + [gate], _framework)
    y, h = backend.run(_SSD, arrays, None, _SSD.options())
    return y.reshape(Bn, T, H * P), h


def _ssv2_sizes(x, A, B, C, D, dt, gate, initial_state, n_groups):
    """(batch, seq_len, num_heads, head_dim) after checking every shape against x's."""
    shape = tuple(np.shape(x))
    if len(shape) != 4:
        raise ValueError(f"x: expected [batch, seq_len, num_heads, head_dim], got "
                         f"{list(shape)}")
    Bn, T, H, P = shape
    if (isinstance(n_groups, bool) or not isinstance(n_groups, (int, np.integer))
            or n_groups <= 0 or H % n_groups):
        raise ValueError(f"n_groups: expected a positive integer dividing num_heads = {H}, "
                         f"got {n_groups!r}")
    per_token = "[batch, seq_len, n_groups, ssm_state_size]"
    N = _expect_shape("B", B, (Bn, T, n_groups, None), per_token)[3]
    _expect_shape("C", C, (Bn, T, n_groups, N), per_token)
    _expect_shape("A", A, (H,), "[num_heads]")
    if D is not None:
        _expect_shape("D", D, (H,), "[num_heads]")
    _expect_shape("dt", dt, (Bn, T, H), "[batch, seq_len, num_heads]")
    if gate is not None:
        _expect_shape("gate", gate, (Bn, T, H * P), "[batch, seq_len, num_heads * head_dim]")
    if initial_state is not None:
        _expect_shape("initial_state", initial_state, (Bn, H, P, N),
                      "[batch, num_heads, head_dim, ssm_state_size]")
    return Bn, T, H, P


def _expect_shape(name, value, want, layout):
    """value's shape, refused unless it is `want` (None: any size there)."""
    shape = tuple(np.shape(value))
    if len(shape) != len(want) or any(w is not None and s != w for s, w in zip(shape, want)):
        sizes = ", ".join("any" if w is None else str(w) for w in want)
        raise ValueError(f"{name}: expected {layout} = [{sizes}], got {list(shape)}")
    return shape


def _ssv2_gate(y, gate, act, use_gated_rmsnorm, eps, backend):
    """ejkernel's output gate on the float32 scan output y [batch, seq_len, channels], in
    float32: y * act(gate), or with use_gated_rmsnorm y / sqrt(mean(y^2) + eps) * act(gate),
    the mean over the channels of each token."""
    gate = backend.cast(gate, y)
    if use_gated_rmsnorm:
        y = y * ((y * y).mean(axis=-1, keepdims=True) + eps) ** -0.5
    return y * act(gate)
