"""Calls from PyTorch tensors straight into the C library: the problem struct filled from the
tensors' data pointers and strides, one C call, no NumPy views, no torch.library dispatch.

A decode step of a model calls each kernel once per layer with one token, where the kernel
takes a few microseconds; the general path (NumPy views through DLPack, the option and
shape checks of ops, the op table's shape look-ups) costs ten times that, and made a
model's decode step slower than transformers' PyTorch fallback. These functions take the
common form of such a call and return None for anything else, which then goes the general
way with its full checks and messages:

- ssm1_decode, conv1d_decode: one decode step into a float32 C-contiguous pool, with int64
  row indices (mamba-ssm's and causal-conv1d's state updates);
- kda_forward: KDA's inference forward over float32 CPU tensors (what the recurrent T = 1
  entries of fla make, one token per call, and any other call of the common form);
- kda_token_step: fla's recurrent entries at T = 1 without gradients (a model's decode
  step), on the decode op's C++ kernel over a copy of the initial state.

Every size that sets how far the library reads a pointer is checked here against the tensor
behind it (the library trusts its struct's sizes); what the library validates itself (row
values, option values) it reports with a message naming the argument.

direct_call tells when a custom op's eager body may run without torch.library's dispatch
(tens of microseconds a call): not while torch.compile traces, nor for fake, functional,
meta or other tensor subclasses, nor under a dispatch or function mode (a torch.device
context, a FlopCounter ...), which must all see the op.
"""

import ctypes

import torch

from . import _lib, ops
from ._arrays import read_as_dense

_EXEC = ops.make_exec()  # read-only in the library (const linseq_exec *): one for all calls
_F32 = torch.float32
_I64 = torch.int64
_PLAIN = (torch.Tensor, torch.nn.Parameter)
# torch's own state: None (then every call goes through the op) where a release lacks it
_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None)
_DISPATCH_MODES = getattr(torch._C, "_len_torch_dispatch_stack", None)
_FUNCTION_MODES = getattr(torch._C, "_is_torch_function_mode_enabled", None)
if _DISPATCH_MODES is None or _FUNCTION_MODES is None:
    _IS_COMPILING = None
_ELEMENT = 4  # bytes of a float32: a pointer the kernels read must be aligned to it


def direct_call(*tensors):
    """True when the given tensors (or None) are plain CPU tensors or parameters, outside any
    tracing or mode, so that calling an op's eager body is what the op's dispatch would do."""
    if (_IS_COMPILING is None or _IS_COMPILING() or _DISPATCH_MODES() or _FUNCTION_MODES()):
        return False
    return all(t is None or (type(t) in _PLAIN and t.is_cpu) for t in tensors)


_IDENTITY_ROWS = {}  # batch -> torch.arange(batch)


def identity_rows(batch):
    """torch.arange(batch) (request b in pool row b), one tensor per batch size, for the eager
    decode calls: a model makes one per layer and token, and the ops only read their rows."""
    rows = _IDENTITY_ROWS.get(batch)
    if rows is None:
        rows = _IDENTITY_ROWS[batch] = torch.arange(batch)
    return rows


def _f32(t):
    """Whether an optional tensor is a float32 CPU tensor with an aligned data pointer."""
    return t is None or (t.dtype is _F32 and t.is_cpu and t.data_ptr() % _ELEMENT == 0)


def _f32_view(t):
    """_f32, for a tensor passed with its strides: not a fully broadcast one, whose all-zero
    strides the kernels would read as dense (read_as_dense; tested only when the tensor is
    not contiguous, which is cheaper to ask)."""
    return t is None or (t.dtype is _F32 and t.is_cpu and t.data_ptr() % _ELEMENT == 0
                         and (t.is_contiguous() or not read_as_dense(t.shape, t.stride())))


def _f32_dense(t, shape):
    """Whether an optional tensor is a C-contiguous float32 CPU tensor of exactly `shape`."""
    return t is None or (_f32(t) and t.shape == shape and t.is_contiguous())


def _rows(t, batch):
    return t.dtype is _I64 and t.is_cpu and t.shape == (batch,) and t.is_contiguous()


def _ptr(t):
    return None if t is None else t.data_ptr()


def _token_strides(t):
    """(batch, token, channel, state) element strides of a [b, d] tensor read as [b, 1, d]."""
    s0, s1 = t.stride()
    return _lib.Strides(s0, s1 * t.shape[1], s1, 0)


def _group_strides(t):
    """Strides of B or C [b, G, N] read as [b, 1, G, N]: one group is read by every group of
    the problem through a zero group stride."""
    s0, s1, s2 = t.stride()
    return _lib.Strides(s0, s1 * t.shape[1], s1 if t.shape[1] > 1 else 0, s2)


def ssm1_decode(pool, rows, x, dt, A, B, C, D, z, dt_bias, dt_softplus):
    """One SSM1 token per request into a float32 C-contiguous pool [R, H, P, N] (d = H*P
    channels), updated in place: rows [b] int64; x, dt, z [b, d]; A [d, N]; B, C [b, G, N];
    D, dt_bias [d]. Returns y [b, d] float32, or None where the tensors are not in this form
    (the general path then takes the call)."""
    if x.dim() != 2 or pool.dim() != 4 or B.dim() != 3 or C.dim() != 3:
        return None
    b, d = x.shape
    R, H, P, N = pool.shape
    gb, gc = B.shape[1], C.shape[1]
    G = max(gb, gc)
    if (min(b, d, N, R) < 1 or H * P != d or (gb != gc and min(gb, gc) != 1) or d % G
            or not (_f32_dense(pool, pool.shape) and _f32_dense(A, (d, N))
                    and _f32_dense(D, (d,)) and _f32_dense(dt_bias, (d,))
                    and all(_f32_view(t) and t.shape == (b, d) for t in (x, dt, z)
                            if t is not None)
                    and all(_f32_view(t) and t.shape == (b, t.shape[1], N) for t in (B, C))
                    and _rows(rows, b))):
        return None
    if dt_bias is not None and not dt_softplus:
        dt, dt_bias = dt + dt_bias, None  # the kernel adds dt_bias with softplus only
    y = torch.empty((b, d), dtype=_F32)
    problem = ssm1_problem(b, d, N, G, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _lib.check(_lib.lib.linseq_ssm1_decode(ctypes.byref(problem), ctypes.byref(_EXEC),
                                           pool.data_ptr(), R, rows.data_ptr(), y.data_ptr()))
    return y


def ssm1_problem(b, d, N, G, x, dt, A, B, C, D, z, dt_bias, dt_softplus):
    """The linseq_ssm1_problem of one token per request over the tensors' memory."""
    return _lib.Ssm1Problem(
        B=b, T=1, D=d, N=N, G=G if G > 1 else 0, x=x.data_ptr(), dt=dt.data_ptr(),
        A=A.data_ptr(), B_proj=B.data_ptr(), C_proj=C.data_ptr(), D_skip=_ptr(D),
        gate=_ptr(z), dt_softplus=bool(dt_softplus), dt_bias=_ptr(dt_bias),
        gate_activation=_lib.ACT_SILU, x_strides=_token_strides(x),
        dt_strides=_token_strides(dt),
        gate_strides=_lib.Strides() if z is None else _token_strides(z),
        B_strides=_group_strides(B), C_strides=_group_strides(C))


def conv1d_decode(x, pool, weight, bias, activation, cache_seqlens, rows):
    """causal_conv1d_update's call into a float32 C-contiguous pool [R, d, state_len]
    (state_len >= 1), updated in place: x [b, d, l] float32 with any strides; weight [d, W];
    bias [d]; activation None or "silu"; cache_seqlens None or [b] int64; rows [b] int64.
    Returns y [b, d, l] float32 in x's memory order (channel first or last), or None where
    the tensors are not in this form."""
    if x.dim() != 3 or pool.dim() != 3 or weight.dim() != 2:
        return None
    b, d, l = x.shape
    R, _, state_len = pool.shape
    W = weight.shape[1]
    if (min(b, d, l, R, W, state_len) < 1 or state_len < W - 1
            or not (_f32_view(x) and _f32_dense(pool, (R, d, state_len))
                    and _f32_dense(weight, (d, W)) and _f32_dense(bias, (d,))
                    and _rows(rows, b)
                    and (cache_seqlens is None or _rows(cache_seqlens, b)))):
        return None
    s0, s1, s2 = x.stride()
    channel_first = s1 >= s2  # else a transposed [b, l, d] tensor: y comes back so too
    y = torch.empty((b, d, l) if channel_first else (b, l, d), dtype=_F32)
    problem = conv1d_problem(b, d, l, W, x, weight, bias, activation, channel_first)
    _lib.check(_lib.lib.linseq_conv1d_decode(
        ctypes.byref(problem), ctypes.byref(_EXEC), pool.data_ptr(), R, state_len,
        rows.data_ptr(), _ptr(cache_seqlens), y.data_ptr()))
    return y if channel_first else y.transpose(1, 2)


def conv1d_problem(b, d, l, W, x, weight, bias, activation, channel_first):
    """The linseq_conv1d_problem of a decode call over the tensors' memory."""
    s0, s1, s2 = x.stride()
    return _lib.Conv1dProblem(
        B=b, T=l, D=d, W=W, x=x.data_ptr(), weight=weight.data_ptr(), bias=_ptr(bias),
        activation=ops.activation_code(activation, _lib.ACT_IDENTITY),
        channel_first=channel_first, x_strides=_lib.Strides(s0, s2, s1, 0))


_KDA_EXECS = {}  # KdaOptions.exec_settings() items -> its linseq_exec, float32 storage


def _dense_f32(t, shape):
    """A float32 CPU tensor of exactly `shape` as C-contiguous memory (itself when it is),
    or None when it is of another dtype or shape."""
    if t.dtype is not _F32 or not t.is_cpu or t.shape != shape:
        return None
    t = t.contiguous()
    return t if t.data_ptr() % _ELEMENT == 0 else None


def kda_forward(arrays, opts):
    """KDA's forward for inference (no saved block) over float32 CPU tensors, without
    packed sequences or the gate in the kernel: (o [B,T,HV,V], ht) float32, as the general
    path gives them; None for anything else (bfloat16 storage, other dtypes, a malformed
    shape: the general path converts or refuses it by name)."""
    q, k, v, beta, g, h0 = (arrays.get(n) for n in ("q", "k", "v", "beta", "g", "h0"))
    if (opts.gate_in_kernel or opts.lower_bound is not None or q is None or v is None
            or k is None or beta is None or q.dim() != 4 or v.dim() != 4
            or arrays.get("A_log") is not None or arrays.get("dt_bias") is not None):
        return None
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if min(B, T, H, K, HV, V) < 1 or HV % H or v.shape[:2] != (B, T):
        return None
    state = (B, HV, V, K) if opts.state_v_first else (B, HV, K, V)
    decay = _lib.DECAY_NONE if g is None else (
        _lib.DECAY_PER_CHANNEL if g.dim() == 4 else _lib.DECAY_PER_HEAD)
    g_shape = (B, T, HV, K) if decay == _lib.DECAY_PER_CHANNEL else (B, T, HV)
    dense = [_dense_f32(q, (B, T, H, K)), _dense_f32(k, (B, T, H, K)), _dense_f32(v, v.shape),
             _dense_f32(beta, (B, T, HV)), None if g is None else _dense_f32(g, g_shape),
             None if h0 is None else _dense_f32(h0, state)]
    if any(d is None and t is not None for d, t in zip(dense, (q, k, v, beta, g, h0))):
        return None
    q, k, v, beta, g, h0 = dense
    settings = opts.exec_settings()
    key = tuple(settings.items())
    ex = _KDA_EXECS.get(key)
    if ex is None:
        ex = _KDA_EXECS[key] = ops.make_exec(**settings)
    o, ht = torch.empty((B, T, HV, V), dtype=_F32), torch.empty(state, dtype=_F32)
    problem = _lib.KdaProblem(
        B=B, T=T, H=H, HV=HV, K=K, V=V, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(),
        beta=beta.data_ptr(), g=_ptr(g), h0=_ptr(h0), decay=decay,
        scale=0.0 if opts.scale is None else float(opts.scale), qk_l2norm=bool(opts.qk_l2norm),
        beta_is_logit=bool(opts.beta_is_logit), state_v_first=bool(opts.state_v_first))
    _lib.check(_lib.lib.linseq_kda_forward(ctypes.byref(problem), ctypes.byref(ex),
                                           o.data_ptr(), ht.data_ptr()))
    return o, ht


def _token_step_shapes(q, k, v, beta, g):
    """(B, HV, K, V) when q, k, v, beta and g are one token per sequence of consistent
    shapes, else None (the general path refuses them by name)."""
    if q.dim() != 4 or v.dim() != 4 or q.shape[1] != 1 or k.shape != q.shape:
        return None
    B, _, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if v.shape[:2] != (B, 1) or min(B, H, K, HV, V) < 1 or HV % H or \
            beta.shape != (B, 1, HV):
        return None
    if g is not None and g.shape != (B, 1, HV) and g.shape != (B, 1, HV, K):
        return None
    return B, HV, K, V


def kda_token_step(step, q, k, v, beta, g, h0, *, scale, qk_l2norm, beta_is_logit,
                   state_v_first, one_step=None):
    """fla's recurrent call at T = 1 for inference (no tensor needing a gradient, plain CPU
    tensors, eager): (o [B,1,HV,V], ht) where ht is a new float32 state (h0, if given, is
    left as it was), by the decode op's C++ kernel on a copy of h0 (zeros without it); None
    for anything else. The C++ kernel passes dtypes and layouts it does not take to the
    op's Python body, which converts them. States [K,V]-first only: there the decode
    kernel gives the recurrent forward's bits; on V-first states it sums in another order
    (equal within rounding), and a call should not change its bits with requires_grad.
    step: the decode op's eager entry (_torch_ops.eager_entry("kda_decode")), None without
    the C++ kernels; one_step: linseq::kda_token_step's C++ kernel, which takes a float32
    call with h0 from h0 into a new state, without the copy of h0."""
    if step is None or k is None or v is None or beta is None or state_v_first:
        return None
    if scale is not None and (not isinstance(scale, (int, float)) or scale != scale
                              or scale == 0 or abs(scale) == float("inf")):
        return None
    tensors = (q, k, v, beta, g, h0)
    if not direct_call(*tensors) or (torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in tensors)):
        return None
    if h0 is not None and one_step is not None:  # checks its shapes itself
        taken = one_step(q, k, v, beta, g, h0, None if scale is None else float(scale),
                         bool(qk_l2norm), bool(beta_is_logit))
        if taken:
            return taken[0], taken[1]
    dims = _token_step_shapes(q, k, v, beta, g)
    if dims is None:
        return None
    B, HV, K, V = dims
    shape = (B, HV, K, V)
    if h0 is None:
        state = torch.zeros(shape, dtype=_F32)
    elif _f32_dense(h0, shape):
        state = h0.clone()
    else:
        return None
    o = step(q, k, v, beta, g, None, None, None, state, None,
             None if scale is None else float(scale), bool(qk_l2norm), bool(beta_is_logit),
             False, False, None, "recurrent", 64, False)
    return o, state
