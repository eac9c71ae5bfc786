"""KDA on NumPy arrays: the problem (KdaInputs), forward, training forward, backward and
decode."""

import ctypes

import numpy as np

from .. import _lib
from .._arrays import (as_bf16, as_bf16_ndim, as_f32, as_f32_ndim, as_row_indices,
                       bf16_result, check_pool, is_bf16, ptr)
from ._common import (check_inputs, forward_train, gate_bias, grads, lower_bound_option,
                      make_exec, optional, outputs, scale_option, sequences, upstream)


def kda_bf16_storage(q, k, v, beta, g):
    """Whether a KDA call keeps bfloat16 storage: q, k, v, beta and g (when given) are all
    bfloat16 (is_bf16). Any other mix of dtypes runs in float32, every input converted once,
    as with float16 or float64: an input is never rounded to bfloat16. The state, h0, A_log
    and dt_bias are float32 on either path (converted when given otherwise)."""
    return all(is_bf16(x) for x in (q, k, v)) and all(x is None or is_bf16(x) for x in (beta, g))


class KdaInputs:
    """One KDA problem: the converted arrays (kept alive here) and the C struct over them.

    q, k [B,T,H,K]; v [B,T,HV,V]; beta [B,T,HV], or None for no delta rule (gated linear
    attention: the state takes k v^T as it is); g [B,T,HV,K] (per channel), [B,T,HV]
    (per head) or None (no decay); h0 [N,HV,K,V] ([N,HV,V,K] with state_v_first), N = B or
    the number of sequences with cu_seqlens; A_log [HV]; dt_bias [HV*K] (or [HV,K]) per
    channel, [HV] per head. l2norm_eps: the eps of qk_l2norm (None: 1e-6; vLLM uses 1e-5).

    bf16=True allows bfloat16 storage (kda_bf16_storage decides; self.bf16 says what was
    chosen): the per-token arrays are then kept as uint16 views of the caller's bfloat16
    memory, for kda_forward and kda_decode only (the library's training forward and
    backward take float32). Default False: everything float32.
    """

    def __init__(self, q, k, v, beta, g=None, *, h0=None, cu_seqlens=None, scale=None,
                 qk_l2norm=False, beta_is_logit=False, state_v_first=False,
                 gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None, bf16=False,
                 l2norm_eps=None):
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
        self.beta = None if beta is None else token(beta, "beta", (B, T, HV), "[B,T,HV]")
        decay = _lib.DECAY_NONE
        self.g = None
        if g is not None:
            ga = token_ndim(g, "g", (3, 4), "g of shape [B,T,HV,K] or [B,T,HV]")
            decay = _lib.DECAY_PER_CHANNEL if ga.ndim == 4 else _lib.DECAY_PER_HEAD
            want = (B, T, HV, K) if ga.ndim == 4 else (B, T, HV)
            self.g = token(ga, "g", want, "[B,T,HV,K]" if ga.ndim == 4 else "[B,T,HV]")
        self.cu_seqlens, N = sequences(cu_seqlens, B, T)
        self.state_shape = (N, HV, V, K) if state_v_first else (N, HV, K, V)
        state_what = "[N,HV,V,K]" if state_v_first else "[N,HV,K,V]"
        self.h0 = optional(h0, "initial_state", self.state_shape, state_what)
        if gate_in_kernel:
            if self.g is None:
                raise ValueError("g: the gate input is required with use_gate_in_kernel")
            self.A_log = optional(A_log, "A_log", (HV,), "[HV]")
            self.dt_bias, self.dt_bias_shape = gate_bias(
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
            lower_bound=0.0 if lower_bound is None else float(lower_bound),
            l2norm_eps=0.0 if l2norm_eps is None else _positive(l2norm_eps, "l2norm_eps"))
        check_inputs("kda", self)


def _positive(value, name):
    value = float(value)
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{name} = {value}; expected a finite value > 0")
    return value


def kda_forward(inputs, *, mode="chunked", chunk_size=64, threads=0, final_state=True,
                bf16_products=False):
    """(o [B,T,HV,V], ht or None). o is bfloat16 when the inputs are (KdaInputs.bf16; see
    bf16_result), float32 otherwise; ht is float32. bf16_products: the chunked forward's
    output products take bfloat16 operands (exec->products, include/linseq.h): faster where
    the CPU has AVX512-BF16, o within a bf16 bound, ht the same bits."""
    ex = make_exec(mode, chunk_size, threads, bf16=inputs.bf16, bf16_products=bf16_products)
    (o, ht), out = outputs("kda", inputs, final_state, first_bf16=inputs.bf16)
    _lib.check(_lib.lib.linseq_kda_forward(ctypes.byref(inputs.problem), ctypes.byref(ex), *out))
    return (bf16_result(o) if inputs.bf16 else o), ht


def _float32_only(inputs, what):
    """The library's training forward and backward read float32: bfloat16 storage must not
    reach them as if it were."""
    if inputs.bf16:
        raise ValueError(f"{what}: takes float32 inputs; build KdaInputs with bf16=False "
                         "(bfloat16 storage is for the inference forward and decode)")



def kda_forward_train(inputs, *, mode="chunked", chunk_size=64, threads=0, final_state=True,
                      bf16_products=False):
    """(o, ht or None, saved): the forward plus what kda_backward(saved=...) needs.
    bf16_products as kda_forward takes it: o from bf16 operands, ht and the saved block (the
    chunk states and deltas) the same bits as without it."""
    _float32_only(inputs, "kda_forward_train")
    ex = make_exec(mode, chunk_size, threads, bf16_products=bf16_products)
    (o, ht), saved = forward_train("kda", inputs, ex, final_state)
    return o, ht, saved


def kda_backward(inputs, d_o, d_ht=None, *, mode="chunked", chunk_size=64, threads=0,
                 saved=None, wanted=None, bf16_products=False):
    """The gradients of sum(o * d_o) + sum(ht * d_ht), as a dict: dq, dk, dv, dbeta, dg,
    dh0 (and dA_log, ddt_bias with the gate in the kernel). `wanted` limits the set;
    `saved` is the block kda_forward_train returned for the same inputs and settings.
    bf16_products: the chunked backward's products that only the per-token gradients read
    take bfloat16 operands (exec->products): dh0 and dv the same bits as without it, dq, dk,
    dbeta, dg within a bf16 bound."""
    _float32_only(inputs, "kda_backward")
    if inputs.beta is None:  # no delta rule: there is no beta to differentiate
        names = wanted if wanted is not None else [t["name"] for t in _lib.op_tensors("kda", "grad")]
        wanted = [name for name in names if name != "dbeta"]
    ex = make_exec(mode, chunk_size, threads, bf16_products=bf16_products)
    d_o, d_ht = upstream("kda", inputs, (d_o, d_ht))
    out, grads_struct = grads("kda", inputs, wanted)
    if saved is None:
        status = _lib.lib.linseq_kda_backward(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                              ptr(d_o), ptr(d_ht), ctypes.byref(grads_struct))
    else:
        status = _lib.lib.linseq_kda_backward_saved(
            ctypes.byref(inputs.problem), ctypes.byref(ex), ptr(saved), saved.nbytes,
            ptr(d_o), ptr(d_ht), ctypes.byref(grads_struct))
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
    (o, _), _ = outputs("kda", inputs, final_state=False, first_bf16=inputs.bf16)
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
    check_pool(state, "state")
    if not (isinstance(state, np.ndarray) and state.dtype == np.float32
            and state.flags.c_contiguous and state.flags.writeable):
        raise TypeError("state: in-place decode needs a writable C-contiguous float32 array")
    per_row = inputs.state_shape[1:]
    if state.ndim != 4 or state.shape[1:] != per_row:
        raise ValueError(f"state: expected a pool of shape [R,{','.join(map(str, per_row))}], "
                         f"got {list(state.shape)}")
    return None if state_rows is None else as_row_indices(state_rows, inputs.B)

