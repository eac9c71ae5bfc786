"""The kernels on NumPy arrays, forward and backward, with every option of the C API.

These are what the framework front ends (linseq.torch, linseq.jax and the seed-style
functions in linseq.api) call. Inputs may be any array (see _arrays); outputs are new
float32 NumPy arrays (KDA's o is bfloat16 where KdaInputs keeps bfloat16 storage). Every
shape is checked against the sizes the first array fixes before a pointer reaches the
library.

Modes: "chunked" (the default for KDA) or "recurrent"; chunk_size 16, 32, 64 or 128;
threads 0 = the library's default thread count.

Scalar options are honoured as given or refused, never reinterpreted: `scale` None means
K^-0.5, otherwise it must stay finite and non-zero in float32 (0.0 or 1e-50 is refused, not
read as the default); `lower_bound` None means the default gate, otherwise it must stay
finite and negative in float32 (0.0 or -1e-50 is refused, not read as the default gate).
"""

import ctypes

import numpy as np

from . import _lib
from ._arrays import (as_bf16, as_bf16_ndim, as_c_int, as_cu_seqlens, as_f32, as_f32_ndim,
                      as_f32_strided, as_float32_option, as_row_indices, bf16_result, is_bf16,
                      ptr)

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


def make_exec(mode="chunked", chunk_size=64, threads=0, bf16=False):
    if mode not in _MODES:
        raise ValueError(f"mode: expected one of {sorted(_MODES)}, got {mode!r}")
    if chunk_size not in (16, 32, 64, 128):
        raise ValueError(f"chunk_size: expected 16, 32, 64 or 128, got {chunk_size!r}")
    ex = _lib.Exec(_MODES[mode], int(chunk_size), as_c_int(threads, "threads"))
    ex.dtype = DTYPE_BF16 if bf16 else DTYPE_F32
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


def _empty(shape):
    return np.empty(shape, dtype=np.float32)


def _optional(value, name, shape, what):
    return None if value is None else as_f32(value, name, shape, what)


def _sequences(cu_seqlens, B, T):
    """(cu_seqlens as checked int64 or None, the number of state rows)."""
    if cu_seqlens is None:
        return None, B
    if B != 1:
        raise ValueError(f"cu_seqlens: packed sequences need B == 1, got B = {B}")
    cu = as_cu_seqlens(cu_seqlens, T)
    return cu, cu.shape[0] - 1


def _gate_bias(dt_bias, per_channel, heads, K, letter):
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
# From the library's op table: the shapes of every op's tensors under a problem (asked once per
# problem, in _check_inputs), and the last check of its inputs before their pointers reach C
# ------------------------------------------------------------------------------------------

def _pointer(arr):
    """NULL for an absent array, and for an empty one (a state with a zero dimension)."""
    return None if arr is None or arr.size == 0 else ptr(arr)


def _check_inputs(op, inputs, strided=()):
    """Every input array the problem points at has exactly the shape the library's op table
    gives it under that problem: whatever a front end inferred from the arrays, no pointer
    reaches C with fewer elements than its shape needs. `strided`: the inputs passed with
    their own strides (checked by their front end; the library checks the span they reach).
    Sets inputs.shapes, the problem's shapes (_lib.Shapes: one linseq_op_shapes call) for
    the rest of the call."""
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


def _outputs(op, inputs, final_state, first_bf16=False):
    """New arrays for the forward's outputs (the first always, the state with final_state:
    None otherwise), and the pointers to pass. first_bf16: the first output (the per-token
    one) is bfloat16 storage, a uint16 array of its bits."""
    arrays = []
    for i, t in enumerate(_lib.op_tensors(op, "output")):
        shape = inputs.shapes[t["name"]]
        if shape is None or not (i == 0 or final_state):
            arrays.append(None)
        else:
            arrays.append(np.empty(shape, np.uint16) if i == 0 and first_bf16 else _empty(shape))
    return arrays, [_pointer(a) for a in arrays]


def _upstream(op, inputs, values):
    """The upstream gradients as float32 arrays of their outputs' shapes (None stays None)."""
    out = []
    for t, value in zip(_lib.op_tensors(op, "upstream"), values):
        shape = inputs.shapes[t["name"]]
        out.append(None if value is None or shape is None else
                   as_f32(value, t["name"], shape, f"{t['dims']} like {t['grad_of']}"))
    return out


def _grads(op, inputs, wanted):
    """New arrays for the gradients that exist with the problem's options (those named in
    `wanted`, or all), and the op's grads struct over them (_lib.NoBackward for an op
    without a backward)."""
    struct = _lib.grads_class(op)
    out, fields = {}, {}
    for t in _lib.op_tensors(op, "grad"):
        shape = inputs.shapes[t["name"]]
        if shape is None or (wanted is not None and t["name"] not in wanted):
            continue
        out[t["name"]] = _empty(shape)
        fields[t["field"]] = _pointer(out[t["name"]])
    return out, struct(**fields)


# ------------------------------------------------------------------------------------------
# KDA
# ------------------------------------------------------------------------------------------

def kda_bf16_storage(q, k, v, beta, g):
    """Whether a KDA call keeps bfloat16 storage: q, k, v, beta and g (when given) are all
    bfloat16 (is_bf16). Any other mix of dtypes runs in float32, every input converted once,
    as with float16 or float64: an input is never rounded to bfloat16. The state, h0, A_log
    and dt_bias are float32 on either path (converted when given otherwise)."""
    return all(is_bf16(x) for x in (q, k, v, beta)) and (g is None or is_bf16(g))


class KdaInputs:
    """One KDA problem: the converted arrays (kept alive here) and the C struct over them.

    q, k [B,T,H,K]; v [B,T,HV,V]; beta [B,T,HV]; g [B,T,HV,K] (per channel), [B,T,HV]
    (per head) or None (no decay); h0 [N,HV,K,V] ([N,HV,V,K] with state_v_first), N = B or
    the number of sequences with cu_seqlens; A_log [HV]; dt_bias [HV*K] (or [HV,K]) per
    channel, [HV] per head.

    bf16=True allows bfloat16 storage (kda_bf16_storage decides; self.bf16 says what was
    chosen): the per-token arrays are then kept as uint16 views of the caller's bfloat16
    memory, for kda_forward and kda_decode only (the library's training forward and
    backward take float32). Default False: everything float32.
    """

    def __init__(self, q, k, v, beta, g=None, *, h0=None, cu_seqlens=None, scale=None,
                 qk_l2norm=False, beta_is_logit=False, state_v_first=False,
                 gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None, bf16=False):
        self.bf16 = bool(bf16) and kda_bf16_storage(q, k, v, beta, g)
        token, token_ndim = (as_bf16, as_bf16_ndim) if self.bf16 else (as_f32, as_f32_ndim)
        self.q = token_ndim(q, "q", (4,), "q of shape [B,T,H,K]")
        B, T, H, K = self.q.shape
        self.k = token(k, "k", (B, T, H, K), "[B,T,H,K] like q")
        vv = token_ndim(v, "v", (4,), "v of shape [B,T,HV,V]")
        HV, V = vv.shape[2], vv.shape[3]
        if vv.shape[:2] != (B, T):
            raise ValueError(f"v: expected shape [B,T,HV,V] with B,T = {B},{T} (from q), got "
                             f"{list(vv.shape)}")
        if HV % H:
            raise ValueError(f"v: the value heads HV = {HV} must be a multiple of the query "
                             f"heads H = {H}")
        self.v = vv
        self.beta = token(beta, "beta", (B, T, HV), "[B,T,HV]")
        decay = _lib.DECAY_NONE
        self.g = None
        if g is not None:
            ga = token_ndim(g, "g", (3, 4), "g of shape [B,T,HV,K] or [B,T,HV]")
            decay = _lib.DECAY_PER_CHANNEL if ga.ndim == 4 else _lib.DECAY_PER_HEAD
            want = (B, T, HV, K) if ga.ndim == 4 else (B, T, HV)
            self.g = token(ga, "g", want, "[B,T,HV,K]" if ga.ndim == 4 else "[B,T,HV]")
        self.cu_seqlens, N = _sequences(cu_seqlens, B, T)
        self.state_shape = (N, HV, V, K) if state_v_first else (N, HV, K, V)
        state_what = "[N,HV,V,K]" if state_v_first else "[N,HV,K,V]"
        self.h0 = _optional(h0, "initial_state", self.state_shape, state_what)
        if gate_in_kernel:
            if self.g is None:
                raise ValueError("g: the gate input is required with use_gate_in_kernel")
            self.A_log = _optional(A_log, "A_log", (HV,), "[HV]")
            self.dt_bias, self.dt_bias_shape = _gate_bias(
                dt_bias, decay == _lib.DECAY_PER_CHANNEL, HV, K, "HV")
        else:
            if A_log is not None or dt_bias is not None:
                raise ValueError("A_log, dt_bias: given without use_gate_in_kernel=True")
            self.A_log = self.dt_bias = None
            self.dt_bias_shape = None
        if lower_bound is not None and not gate_in_kernel:
            raise ValueError("lower_bound: given without use_gate_in_kernel=True")
        scale, lower_bound = scale_option(scale), lower_bound_option(lower_bound)
        self.B, self.T, self.H, self.HV, self.K, self.V, self.N = B, T, H, HV, K, V, N
        self.problem = _lib.KdaProblem(
            B=B, T=T, H=H, HV=HV, K=K, V=V,
            cu_seqlens=ptr(self.cu_seqlens), n_seqs=N if self.cu_seqlens is not None else 0,
            q=ptr(self.q), k=ptr(self.k), v=ptr(self.v), beta=ptr(self.beta), g=ptr(self.g),
            h0=ptr(self.h0), decay=decay, scale=0.0 if scale is None else float(scale),
            qk_l2norm=bool(qk_l2norm), beta_is_logit=bool(beta_is_logit),
            state_v_first=bool(state_v_first), gate_in_kernel=bool(gate_in_kernel),
            A_log=ptr(self.A_log), dt_bias=ptr(self.dt_bias),
            lower_bound=0.0 if lower_bound is None else float(lower_bound))
        _check_inputs("kda", self)


def kda_forward(inputs, *, mode="chunked", chunk_size=64, threads=0, final_state=True):
    """(o [B,T,HV,V], ht or None). o is bfloat16 when the inputs are (KdaInputs.bf16; see
    bf16_result), float32 otherwise; ht is float32."""
    ex = make_exec(mode, chunk_size, threads, bf16=inputs.bf16)
    (o, ht), out = _outputs("kda", inputs, final_state, first_bf16=inputs.bf16)
    _lib.check(_lib.lib.linseq_kda_forward(ctypes.byref(inputs.problem), ctypes.byref(ex), *out))
    return (bf16_result(o) if inputs.bf16 else o), ht


def _float32_only(inputs, what):
    """The library's training forward and backward read float32: bfloat16 storage must not
    reach them as if it were."""
    if inputs.bf16:
        raise ValueError(f"{what}: takes float32 inputs; build KdaInputs with bf16=False "
                         "(bfloat16 storage is for the inference forward and decode)")


def forward_train(name, inputs, ex, final_state=True, n_floats=None):
    """(outputs, saved) of linseq_<name>_forward_train ("kda", "ssm1"): the forward plus the
    block its backward_saved reads. The block is exactly the library's size, or with n_floats
    an array of that many floats (a size announced before the call, e.g. from the shapes alone:
    at least the library's), zero-filled, since the layout may leave bytes it never writes and
    an op's outputs must be a function of its inputs."""
    size = ctypes.c_size_t(0)
    _lib.check(getattr(_lib.lib, f"linseq_{name}_saved_size")(
        ctypes.byref(inputs.problem), ctypes.byref(ex), ctypes.byref(size)))
    # float32 storage keeps the block aligned for the floats the library writes into it
    if n_floats is None:
        saved = np.empty((size.value + 3) // 4, dtype=np.float32)
    else:
        saved = np.zeros(n_floats, np.float32)
        if size.value > saved.nbytes:
            raise RuntimeError(f"linseq::{name}: the saved block needs {size.value} bytes, more "
                               f"than the {saved.nbytes} announced from the shapes")
    outputs, out = _outputs(name, inputs, final_state)
    _lib.check(getattr(_lib.lib, f"linseq_{name}_forward_train")(
        ctypes.byref(inputs.problem), ctypes.byref(ex), *out, ptr(saved), saved.nbytes))
    return list(outputs), saved


def kda_forward_train(inputs, *, mode="chunked", chunk_size=64, threads=0, final_state=True):
    """(o, ht or None, saved): the forward plus what kda_backward(saved=...) needs."""
    _float32_only(inputs, "kda_forward_train")
    (o, ht), saved = forward_train("kda", inputs, make_exec(mode, chunk_size, threads),
                                   final_state)
    return o, ht, saved


def kda_backward(inputs, d_o, d_ht=None, *, mode="chunked", chunk_size=64, threads=0,
                 saved=None, wanted=None):
    """The gradients of sum(o * d_o) + sum(ht * d_ht), as a dict: dq, dk, dv, dbeta, dg,
    dh0 (and dA_log, ddt_bias with the gate in the kernel). `wanted` limits the set;
    `saved` is the block kda_forward_train returned for the same inputs and settings."""
    _float32_only(inputs, "kda_backward")
    ex = make_exec(mode, chunk_size, threads)
    d_o, d_ht = _upstream("kda", inputs, (d_o, d_ht))
    out, grads = _grads("kda", inputs, wanted)
    if saved is None:
        status = _lib.lib.linseq_kda_backward(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                              ptr(d_o), ptr(d_ht), ctypes.byref(grads))
    else:
        status = _lib.lib.linseq_kda_backward_saved(
            ctypes.byref(inputs.problem), ctypes.byref(ex), ptr(saved), saved.nbytes,
            ptr(d_o), ptr(d_ht), ctypes.byref(grads))
    _lib.check(status)
    if "ddt_bias" in out and inputs.dt_bias_shape is not None:
        out["ddt_bias"] = out["ddt_bias"].reshape(inputs.dt_bias_shape)
    return out


def kda_decode(inputs, state, state_rows=None, *, threads=0):
    """One token for B requests: q etc. hold [B,1,...]; `state` is the pool
    [R,HV,K,V] (or [R,HV,V,K] with state_v_first), a C-contiguous float32 NumPy array that is
    updated in place. state_rows (int [B], optional) maps request b to its pool row; a
    negative row is a padding request (its output row is 0). Returns o [B,1,HV,V], bfloat16
    when the inputs are (KdaInputs.bf16), else float32."""
    rows = check_decode(inputs, state, state_rows)
    ex = make_exec("recurrent", 64, threads, bf16=inputs.bf16)
    (o, _), _ = _outputs("kda", inputs, final_state=False, first_bf16=inputs.bf16)
    _lib.check(_lib.lib.linseq_kda_decode(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                          ptr(state), state.shape[0], ptr(rows), ptr(o)))
    return bf16_result(o) if inputs.bf16 else o


def check_decode(inputs, state, state_rows):
    """What kda_decode checks before the library: the problem is one token without h0 or
    cu_seqlens, the pool has the state's per-row shape, the rows are integers [B]. Returns
    the rows as int64 (or None)."""
    if inputs.T != 1:
        raise ValueError(f"q: decode takes one token per request (shape [B,1,H,K]), got "
                         f"T = {inputs.T}")
    if inputs.h0 is not None or inputs.cu_seqlens is not None:
        raise ValueError("initial_state, cu_seqlens: decode reads the state pool instead")
    if not (isinstance(state, np.ndarray) and state.dtype == np.float32
            and state.flags.c_contiguous and state.flags.writeable):
        raise TypeError("state: in-place decode needs a writable C-contiguous float32 array")
    per_row = inputs.state_shape[1:]
    if state.ndim != 4 or state.shape[1:] != per_row:
        raise ValueError(f"state: expected a pool of shape [R,{','.join(map(str, per_row))}], "
                         f"got {list(state.shape)}")
    return None if state_rows is None else as_row_indices(state_rows, inputs.B)


# ------------------------------------------------------------------------------------------
# KDA gate
# ------------------------------------------------------------------------------------------

class GateInputs:
    """g_raw [B,T,H,K] with dt_bias [H*K] or [H,K] (per channel), or g_raw [B,T,H] with
    dt_bias [H] (per head); A_log [H]. lower_bound None = the default form."""

    def __init__(self, g_raw, A_log=None, dt_bias=None, lower_bound=None):
        self.g_raw = as_f32_ndim(g_raw, "gate", (3, 4), "gate of shape [B,T,H,K] or [B,T,H]")
        per_channel = self.g_raw.ndim == 4
        B, T, H = self.g_raw.shape[:3]
        K = self.g_raw.shape[3] if per_channel else 0
        self.A_log = _optional(A_log, "A_log", (H,), "[H]")
        self.dt_bias, self.dt_bias_shape = _gate_bias(dt_bias, per_channel, H, K, "H")
        lower_bound = lower_bound_option(lower_bound)
        self.problem = _lib.KdaGateProblem(
            B=B, T=T, H=H, K=K,
            decay=_lib.DECAY_PER_CHANNEL if per_channel else _lib.DECAY_PER_HEAD,
            g_raw=ptr(self.g_raw), A_log=ptr(self.A_log), dt_bias=ptr(self.dt_bias),
            lower_bound=0.0 if lower_bound is None else float(lower_bound))
        _check_inputs("kda_gate", self)


def kda_gate_forward(inputs, *, threads=0):
    ex = make_exec(threads=threads)
    (g,), out = _outputs("kda_gate", inputs, final_state=False)
    _lib.check(_lib.lib.linseq_kda_gate_forward(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                                *out))
    return g


def kda_gate_backward(inputs, d_g, *, threads=0, wanted=None):
    """dict of dg_raw, dA_log, ddt_bias (the gradients of sum(g * d_g))."""
    ex = make_exec(threads=threads)
    (d_g,) = _upstream("kda_gate", inputs, (d_g,))
    out, grads = _grads("kda_gate", inputs, wanted)
    _lib.check(_lib.lib.linseq_kda_gate_backward(ctypes.byref(inputs.problem),
                                                 ctypes.byref(ex), ptr(d_g),
                                                 ctypes.byref(grads)))
    if "ddt_bias" in out and inputs.dt_bias_shape is not None:
        out["ddt_bias"] = out["ddt_bias"].reshape(inputs.dt_bias_shape)
    return out


# ------------------------------------------------------------------------------------------
# SSM1
# ------------------------------------------------------------------------------------------

def activation_code(activation, default):
    if activation is None:
        return default
    if isinstance(activation, str) and activation.lower() in ACTIVATIONS:
        return ACTIVATIONS[activation.lower()]
    raise ValueError(f"activation: expected None or one of {sorted(ACTIVATIONS)}, got "
                     f"{activation!r}")


def _strides(elems):
    """A linseq_strides from (batch, token, channel, state) element strides."""
    return _lib.Strides(*elems)


def _proj_layout(value, name, B, T, D, channel_first):
    """B_proj or C_proj in any of its forms, as (array, groups, strides(G) -> (batch, token,
    group, state) element strides, form). Forms: "shared" [B,T,N] ([B,N,T] channel first),
    "grouped" [B,T,G,N] ([B,G,N,T]), "constant" [D,N] (one B for every token: G = D groups
    read with zero batch and token strides)."""
    forms = "[B,N,T] or [B,G,N,T]" if channel_first else "[B,T,N] or [B,T,G,N]"
    arr, st = as_f32_strided(value, name, (2, 3, 4), f"{name} of shape [D,N] (constant), {forms}")
    if arr.ndim == 2:
        if arr.shape[0] != D:
            raise ValueError(f"{name}: a constant {name} has shape [D,N] with D = {D}, got "
                             f"{list(arr.shape)}")
        return arr, D, arr.shape[1], lambda G: (0, 0, st[0], st[1]), "constant"
    if arr.ndim == 3:
        b, t, n = (0, 2, 1) if channel_first else (0, 1, 2)
        shape = (arr.shape[b], arr.shape[t], arr.shape[n])
        if shape[:2] != (B, T):
            raise ValueError(f"{name}: expected shape "
                             f"{'[B,N,T]' if channel_first else '[B,T,N]'} with B = {B}, T = {T}, "
                             f"got {list(arr.shape)}")
        return arr, 1, shape[2], lambda G: (st[b], st[t], 0, st[n]), "shared"
    b, t, g, n = (0, 3, 1, 2) if channel_first else (0, 1, 2, 3)
    if (arr.shape[b], arr.shape[t]) != (B, T):
        raise ValueError(f"{name}: expected shape {'[B,G,N,T]' if channel_first else '[B,T,G,N]'}"
                         f" with B = {B}, T = {T}, got {list(arr.shape)}")
    if arr.shape[g] == 1:  # one group, read by all the problem's groups: a zero group stride
        return arr, 1, arr.shape[n], lambda G: (st[b], st[t], 0, st[n]), "shared"
    return arr, arr.shape[g], arr.shape[n], lambda G: (st[b], st[t], st[g], st[n]), "grouped"


def _proj_groups(name_b, gb, name_c, gc, D):
    """The problem's group count for B and C given as they were: equal, or one of them with a
    single group (read by every group through a zero group stride)."""
    if gb == gc:
        G = gb
    elif gb == 1 or gc == 1:
        G = max(gb, gc)
    else:
        raise ValueError(f"{name_b}, {name_c}: {gb} and {gc} groups; linseq takes B and C with "
                         "the same number of groups, or one of them with a single group (or "
                         "constant [D,N])")
    if D % G:
        raise ValueError(f"{name_b}: the groups G = {G} must divide D = {D}")
    return G


class Ssm1Inputs:
    """x, dt [B,T,D]; A [D,N]; B_proj, C_proj [B,T,N], [B,T,G,N] or constant [D,N]; D_skip,
    dt_bias [D]; gate [B,T,D]; h0 [N_seq,D,N]. `dt` is the step after softplus unless
    dt_softplus.

    channel_first=True: x, dt and gate are [B,D,T] and B_proj, C_proj [B,N,T] or [B,G,N,T]
    (mamba-ssm's layout), and y and the per-token gradients come back [B,D,T] / [B,G,N,T].

    The per-token inputs (x, dt, gate, B_proj, C_proj) are read where they lie: a float32 view
    with any non-negative strides (a transposed tensor, one half of xz, a broadcast) reaches
    the kernels as the caller's memory with its strides, without a copy; other dtypes or
    negative strides are converted once. The arrays the kernels read are this object's x, dt,
    gate, B_proj and C_proj (their pointers are problem.x, ...)."""

    def __init__(self, x, dt, A, B_proj, C_proj, D_skip=None, *, gate=None, h0=None,
                 cu_seqlens=None, dt_softplus=False, dt_bias=None, activation=None,
                 channel_first=False):
        cf = bool(channel_first)
        tok_what = "[B,D,T]" if cf else "[B,T,D]"
        self.x, sx = as_f32_strided(x, "hidden_states", (3,), f"hidden_states of shape {tok_what}")
        B, T, D = (self.x.shape[0], self.x.shape[2], self.x.shape[1]) if cf else self.x.shape
        tok_shape = (B, D, T) if cf else (B, T, D)

        def per_token(value, name):
            if value is None:
                return None, (0, 0, 0, 0)
            arr, st = as_f32_strided(value, name, (3,), f"{name} of shape {tok_what}")
            if arr.shape != tok_shape:
                raise ValueError(f"{name}: expected shape {tok_what} = {list(tok_shape)} like "
                                 f"hidden_states, got {list(arr.shape)}")
            # (batch, token, channel, 0) in elements
            return arr, ((st[0], st[2], st[1], 0) if cf else (st[0], st[1], st[2], 0))

        xs = (sx[0], sx[2], sx[1], 0) if cf else (sx[0], sx[1], sx[2], 0)
        self.dt, dts = per_token(dt, "dt")
        self.gate, gs = per_token(gate, "gate")
        A = as_f32_ndim(A, "A", (2,), "A of shape [D,N]")
        if A.shape[0] != D:
            raise ValueError(f"A: expected shape [D,N] with D = {D}, got {list(A.shape)}")
        self.A = A
        N = A.shape[1]
        self.B_proj, gb, nb, b_strides, self.B_form = _proj_layout(B_proj, "B", B, T, D, cf)
        self.C_proj, gc, nc, c_strides, self.C_form = _proj_layout(C_proj, "C", B, T, D, cf)
        for name, n in (("B", nb), ("C", nc)):
            if n != N:
                raise ValueError(f"{name}: expected N = {N} states (A is [D,N]), got {n}")
        G = _proj_groups("B", gb, "C", gc, D)
        self.D_skip = _optional(D_skip, "D", (D,), "[D]")
        self.cu_seqlens, n_state = _sequences(cu_seqlens, B, T)
        self.state_shape = (n_state, D, N)
        self.h0 = _optional(h0, "initial_state", self.state_shape, "[B,D,N]")
        if dt_bias is not None and not dt_softplus:
            raise ValueError("dt_bias: given without dt_softplus=True")
        self.dt_bias = _optional(dt_bias, "dt_bias", (D,), "[D]")
        self.channel_first = cf
        # G = 0: one group, so that y's and dB's shapes stay [B,T,N] as the table gives them
        self.B, self.T, self.D, self.N, self.G = B, T, D, N, (G if G > 1 else 0)
        self.problem = _lib.Ssm1Problem(
            B=B, T=T, D=D, N=N, G=self.G, cu_seqlens=ptr(self.cu_seqlens),
            n_seqs=n_state if self.cu_seqlens is not None else 0,
            x=ptr(self.x), dt=ptr(self.dt), A=ptr(self.A), B_proj=ptr(self.B_proj),
            C_proj=ptr(self.C_proj), D_skip=ptr(self.D_skip), gate=ptr(self.gate),
            h0=ptr(self.h0), dt_softplus=bool(dt_softplus), dt_bias=ptr(self.dt_bias),
            gate_activation=activation_code(activation, _lib.ACT_SILU), channel_first=cf,
            x_strides=_strides(xs), dt_strides=_strides(dts), gate_strides=_strides(gs),
            B_strides=_strides(b_strides(G)), C_strides=_strides(c_strides(G)))
        _check_inputs("ssm1", self, strided=("x", "dt", "gate", "B", "C"))

    def proj_grad(self, grad, form, shape):
        """dB or dC as the library returns it ([B,T,G,N] or [B,G,N,T] channel first; without
        G when there is one group) summed to the form and shape B or C was given in."""
        cf = self.channel_first
        if grad.ndim == 3:  # one group: [B,T,N] / [B,N,T] -> [B,T,1,N] / [B,1,N,T]
            grad = grad[:, None] if cf else grad[:, :, None]
        if form == "constant":  # [D,N]: the share of every token of every sequence
            grad = grad.sum(axis=(0, 3) if cf else (0, 1), dtype=np.float32)
        elif form == "shared":  # one group, read by all the problem's groups
            grad = grad.sum(axis=1 if cf else 2, dtype=np.float32)
        return np.ascontiguousarray(grad.reshape(shape))


def ssm1_forward(inputs, *, threads=0, final_state=True):
    """(y [B,T,D] ([B,D,T] channel first), hT [N_seq,D,N] or None)."""
    ex = make_exec(threads=threads)
    (y, hT), out = _outputs("ssm1", inputs, final_state)
    _lib.check(_lib.lib.linseq_ssm1_forward(ctypes.byref(inputs.problem), ctypes.byref(ex), *out))
    return y, hT


def ssm1_forward_train(inputs, *, threads=0, final_state=True):
    """(y, hT or None, saved): the forward plus the states ssm1_backward(saved=...) starts its
    segments from, so that it need not run the recurrence again."""
    (y, hT), saved = forward_train("ssm1", inputs, make_exec(threads=threads), final_state)
    return y, hT, saved


def ssm1_backward(inputs, d_y, d_hT=None, *, threads=0, wanted=None, saved=None):
    """dict of dx, ddt, dA, dB, dC, dD, dgate, dh0, ddt_bias (those that exist); d_y and the
    per-token gradients in the problem's layout, dB and dC in the shapes B and C were given.
    `saved` is the block ssm1_forward_train returned for the same inputs (the same
    gradients, bit for bit, without recomputing the checkpoints)."""
    ex = make_exec(threads=threads)
    d_y, d_hT = _upstream("ssm1", inputs, (d_y, d_hT))
    out, grads = _grads("ssm1", inputs, wanted)
    if saved is None:
        status = _lib.lib.linseq_ssm1_backward(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                               ptr(d_y), ptr(d_hT), ctypes.byref(grads))
    else:
        status = _lib.lib.linseq_ssm1_backward_saved(
            ctypes.byref(inputs.problem), ctypes.byref(ex), ptr(saved), saved.nbytes,
            ptr(d_y), ptr(d_hT), ctypes.byref(grads))
    _lib.check(status)
    for key, form, arr in (("dB", inputs.B_form, inputs.B_proj),
                           ("dC", inputs.C_form, inputs.C_proj)):
        if key in out:
            out[key] = inputs.proj_grad(out[key], form, arr.shape)
    return out


def ssm1_decode(inputs, state, state_rows=None, *, threads=0):
    """One token for B requests (inputs with T = 1, no h0 or cu_seqlens): `state` is the pool
    [R,D,N], a C-contiguous float32 array updated in place; state_rows (int [B], optional) maps
    request b to its pool row (None: row b), a negative row is a padding request (its y row
    is 0, no state touched). Returns y [B,1,D] ([B,D,1] channel first)."""
    if inputs.T != 1:
        raise ValueError(f"hidden_states: decode takes one token per request, got T = {inputs.T}")
    if inputs.h0 is not None or inputs.cu_seqlens is not None:
        raise ValueError("initial_state, cu_seqlens: decode reads the state pool instead")
    if not (isinstance(state, np.ndarray) and state.dtype == np.float32
            and state.flags.c_contiguous and state.flags.writeable):
        raise TypeError("state: in-place decode needs a writable C-contiguous float32 array")
    if state.ndim != 3 or state.shape[1:] != inputs.state_shape[1:]:
        raise ValueError(f"state: expected a pool of shape [R,{inputs.D},{inputs.N}], got "
                         f"{list(state.shape)}")
    rows = None if state_rows is None else as_row_indices(state_rows, inputs.B, "state_rows")
    ex = make_exec(threads=threads)
    (y, _), _ = _outputs("ssm1", inputs, final_state=False)
    _lib.check(_lib.lib.linseq_ssm1_decode(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                           ptr(state), state.shape[0], ptr(rows), ptr(y)))
    return y


# ------------------------------------------------------------------------------------------
# Causal conv1d
# ------------------------------------------------------------------------------------------

class Conv1dInputs:
    """x [B,T,D] ([B,D,T] with channel_first, causal-conv1d's layout); weight [D,W] (or
    [D,1,W] as nn.Conv1d stores it); bias [D]; conv_state [N_seq,D,W-1], oldest input first.

    x is read where it lies: a float32 view with non-negative strides (a transposed tensor,
    a slice of xBC) reaches the kernels as the caller's memory (problem.x is its pointer); y,
    d_y and dx are dense in the problem's layout."""

    def __init__(self, x, weight, bias=None, *, conv_state=None, cu_seqlens=None,
                 activation=None, channel_first=False):
        cf = bool(channel_first)
        what = "[B,D,T]" if cf else "[B,T,D]"
        self.x, sx = as_f32_strided(x, "x", (3,), f"x of shape {what}")
        B, T, D = (self.x.shape[0], self.x.shape[2], self.x.shape[1]) if cf else self.x.shape
        x_strides = (sx[0], sx[2], sx[1], 0) if cf else (sx[0], sx[1], sx[2], 0)
        w = as_f32_ndim(weight, "weight", (2, 3), "weight of shape [D,W] or [D,1,W]")
        if w.ndim == 3:
            if w.shape[1] != 1:
                raise ValueError(f"weight: expected [D,W] or a depthwise [D,1,W], got "
                                 f"{list(w.shape)}")
            w = w.reshape(w.shape[0], w.shape[2])
        if w.shape[0] != D:
            raise ValueError(f"weight: expected shape [D,W] with D = {D}, got {list(w.shape)}")
        self.weight_shape = np.shape(weight)
        self.weight = w
        W = w.shape[1]
        self.bias = _optional(bias, "bias", (D,), "[D]")
        self.cu_seqlens, n_state = _sequences(cu_seqlens, B, T)
        self.state_shape = (n_state, D, W - 1)
        self.conv_state = _optional(conv_state, "conv_state", self.state_shape,
                                    "[B,D,W-1], oldest input first")
        self.channel_first = cf
        self.B, self.T, self.D, self.W = B, T, D, W
        self.problem = _lib.Conv1dProblem(
            B=B, T=T, D=D, W=W, cu_seqlens=ptr(self.cu_seqlens),
            n_seqs=n_state if self.cu_seqlens is not None else 0,
            x=ptr(self.x), weight=ptr(self.weight), bias=ptr(self.bias),
            conv_state=ptr(self.conv_state),
            activation=activation_code(activation, _lib.ACT_IDENTITY), channel_first=cf,
            x_strides=_strides(x_strides))
        _check_inputs("causal_conv1d", self, strided=("x",))


def conv1d_forward(inputs, *, threads=0, final_state=True):
    """(y [B,T,D] ([B,D,T] channel first), conv_state_out [N_seq,D,W-1] or None)."""
    ex = make_exec(threads=threads)
    (y, state), out = _outputs("causal_conv1d", inputs, final_state)
    _lib.check(_lib.lib.linseq_conv1d_forward(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                              *out))
    return y, state


def conv1d_backward(inputs, d_y, d_state=None, *, threads=0, wanted=None):
    """dict of dx (in the problem's layout), dweight (in the weight's given shape), dbias,
    dconv_state."""
    ex = make_exec(threads=threads)
    d_y, d_state = _upstream("causal_conv1d", inputs, (d_y, d_state))
    out, grads = _grads("causal_conv1d", inputs, wanted)
    _lib.check(_lib.lib.linseq_conv1d_backward(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                               ptr(d_y), _pointer(d_state),
                                               ctypes.byref(grads)))
    if "dweight" in out:
        out["dweight"] = out["dweight"].reshape(inputs.weight_shape)
    return out


def conv1d_decode(inputs, state, state_rows=None, cache_seqlens=None, *, threads=0):
    """causal_conv1d_update over a pool: inputs hold the T >= 1 new tokens of B requests
    (no conv_state, no cu_seqlens); `state` is the pool [R,D,state_len] (state_len >= W-1), a
    C-contiguous float32 array updated in place. state_rows (int [B], optional): request ->
    pool row (None: row b; negative: a padding request, y = 0, no state touched).
    cache_seqlens (int [B], optional, each >= 0): the rows are circular buffers and request b's
    new inputs go to positions (cache_seqlens[b] + i) % state_len (see linseq.h); without it
    each row is a shift register. Returns y in the problem's layout ([B,T,D] or [B,D,T])."""
    if inputs.conv_state is not None or inputs.cu_seqlens is not None:
        raise ValueError("conv_state, cu_seqlens: decode reads the state pool instead")
    if not (isinstance(state, np.ndarray) and state.dtype == np.float32
            and state.flags.c_contiguous and state.flags.writeable):
        raise TypeError("state: in-place decode needs a writable C-contiguous float32 array")
    if state.ndim != 3 or state.shape[1] != inputs.D:
        raise ValueError(f"state: expected a pool of shape [R,{inputs.D},state_len], got "
                         f"{list(state.shape)}")
    rows = None if state_rows is None else as_row_indices(state_rows, inputs.B, "state_rows")
    cache = (None if cache_seqlens is None
             else as_row_indices(cache_seqlens, inputs.B, "cache_seqlens"))
    ex = make_exec(threads=threads)
    (y, _), _ = _outputs("causal_conv1d", inputs, final_state=False)
    _lib.check(_lib.lib.linseq_conv1d_decode(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                             ptr(state), state.shape[0], state.shape[2],
                                             ptr(rows), ptr(cache), ptr(y)))
    return y
