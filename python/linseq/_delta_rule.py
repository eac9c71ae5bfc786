"""KDA and Gated DeltaNet with every option of fla's functions, on linseq's C KDA op: the
options the C kernel lacks are expressed through its inputs, in the caller's framework (so
that autograd or jax.grad differentiate them):

- allow_neg_eigval: beta is 2 * sigmoid(logit), computed before the kernel.
- Per value channel beta [B,T,HV,V] and GDN's per value channel decay gv [B,T,HV,V]: each
  value channel of a delta rule is a delta rule of its own, so the problem runs as HV*V value
  heads of size 1 (decay g + gv_j per head, or g + gk + gv_j per key channel), and is folded
  back. Token by token that is the plain problem's arithmetic; in chunks the in-chunk work
  grows V times (every value head of size 1 has its own chunk matrices). With a per key
  channel decay (KDA's g, GDN's gk) the expanded decay is a [B,T,HV*V,K] array, V times
  the size of gk.
- A per head decay together with gk (GDN's recurrent g and gk): their sum is the per channel
  decay; with the gate in the kernel the gate is linseq's gate op (kda_gate) before the sum.
- The state at the start of every chunk (fla's return_intermediate_states): each sequence run
  chunk by chunk from its initial state (one more forward, in pieces); no gradient.
- Gated linear attention (fla's GLA and simple GLA, delta=False): the same call without beta,
  which the C op reads as "no delta rule"; the per value channel decay gv then needs no beta
  either.

delta_rule is the one call; kda_gate and gdn_gate turn fla's gate arguments into its `gate`.
linseq's fla-signature functions (_fla_signatures) and context parallelism (distributed) call
it.
"""

import contextlib
import sys

import numpy as np

from . import _opspec
from ._arrays import framework_of
from ._backends import backend_for
from ._options import GateOptions, KdaOptions


def kda_gate(use_gate_in_kernel, A_log, dt_bias, lower_bound, safe_gate=False):
    """(A_log, dt_bias, lower_bound) of KDA's in-kernel gate, or None without it (A_log,
    dt_bias and lower_bound are then unused, as in fla)."""
    if not use_gate_in_kernel:
        return None
    if A_log is None and lower_bound is None:
        raise ValueError("A_log: required with use_gate_in_kernel=True unless lower_bound is "
                         "set (then the gate is lower_bound * sigmoid(g + dt_bias))")
    if safe_gate:
        if lower_bound is None:
            raise ValueError("lower_bound: required with safe_gate=True and "
                             "use_gate_in_kernel=True")
        if not -5 <= lower_bound < 0:
            raise ValueError(f"lower_bound: safe_gate=True takes a lower_bound in [-5, 0), "
                             f"got {lower_bound}")
    return A_log, dt_bias, lower_bound


def gdn_gate(use_gate_in_kernel, A_log, dt_bias, g):
    """(A_log, dt_bias, None) of GDN's per head gate, or None (A_log and dt_bias are then
    unused, as in fla)."""
    if not use_gate_in_kernel:
        return None
    if A_log is None:
        raise ValueError("A_log: required with use_gate_in_kernel=True")
    if g is None:
        raise ValueError("g: the raw gate input is required with use_gate_in_kernel=True")
    return A_log, dt_bias, None


class _Frame:
    """The few array operations needed around the kernel, in the caller's framework (so
    that autograd or jax.grad differentiate them)."""

    def __init__(self, framework):
        self.name = framework
        if framework == "torch":
            import torch
            self.xp = torch
        elif framework == "jax":
            import jax.numpy as jnp
            self.xp = jnp
        else:
            self.xp = np

    def f32(self, x):
        if self.name == "torch":
            return x.float()
        return self.xp.asarray(x).astype(self.xp.float32)

    def ones(self, shape):
        return self.xp.ones(shape, dtype=self.xp.float32)

    def zeros(self, shape):
        return self.xp.zeros(shape, dtype=self.xp.float32)

    def swap_last(self, x):
        return self.xp.swapaxes(x, -1, -2)

    def stack(self, xs, axis):
        return self.xp.stack(xs, axis)

    def concat(self, xs, axis):
        return self.xp.cat(xs, axis) if self.name == "torch" else self.xp.concatenate(xs, axis)

    def no_grad(self):
        if self.name == "torch":
            return self.xp.no_grad()
        return contextlib.nullcontext()

    def zeros_like(self, x):
        return self.xp.zeros_like(x)

    def _index(self, rows):
        if isinstance(rows, slice) or self.name != "torch":
            return rows
        return self.xp.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))

    def take(self, x, rows):
        """x's rows (first axis) at the integer array rows, a new array."""
        return x[self._index(rows)]

    def assign(self, dest, rows, values):
        """dest[rows] = values, in place, in dest's dtype (NumPy arrays and tensors)."""
        if self.name == "torch":
            dest[self._index(rows)] = values.to(dest.dtype)
        else:
            dest[rows] = np.asarray(values)


def _shape_of(x, name, shapes, what):
    shape = tuple(np.shape(x))
    if shape not in shapes:
        raise ValueError(f"{name}: expected shape {what}, got {list(shape)}")


def heads_vector(x, HV):
    """A per head parameter of any shape with HV elements (fla's tests pass A_log as
    [1,1,HV,1]), as [HV]; other sizes are left to the kernel's checks."""
    if x is None or int(np.prod(np.shape(x))) != HV:
        return x
    return x.reshape(HV) if hasattr(x, "reshape") else np.reshape(x, HV)


def delta_rule(mode, chunk_size, framework, q, k, v, beta, *, g=None, gk=None, gv=None,
               gate=None, scale, initial_state, output_final_state, qk_l2norm, beta_logit,
               neg_eigval, state_v_first, cu_seqlens, out_like, intermediate=False, delta=True,
               bf16_products=False):
    """One call of the C KDA op (or, with return_intermediate_states, one more in pieces):
    o in out_like's dtype, the final state or None (and the chunk start states). delta=False:
    gated linear attention (beta must be None). bf16_products: KdaOptions.bf16_products."""
    if (mode == "recurrent" and delta and gk is None and gv is None and gate is None
            and cu_seqlens is None and not neg_eigval and not intermediate):
        step = eager_token_step(q, k, v, beta, g, initial_state, out_like.dtype,
                                output_final_state, scale=scale, qk_l2norm=qk_l2norm,
                                beta_is_logit=beta_logit, state_v_first=state_v_first)
        if step is not None:
            return step
    values = [q, k, v, g, gk, gv, beta, initial_state, cu_seqlens] + list(gate or ())
    framework = framework or framework_of(values)
    backend = backend_for(values, framework)
    frame = _Frame(framework)
    dims = _dims(q, v)
    if beta is None and delta and None not in dims:
        beta = frame.ones(dims[:3])  # fla's default, then read as the beta flags say
    if neg_eigval:
        beta = 2.0 / (1.0 + frame.xp.exp(-frame.f32(beta)))
        beta_logit = False
    per_value = gv is not None or (beta is not None and len(np.shape(beta)) == 4)
    _check_channel_shapes(gk, gv, beta, per_value, dims)
    g, gate = _kernel_decay(frame, backend, g, gk, gv, gate, per_value, dims)
    A_log, dt_bias, lower_bound = gate if gate is not None else (None, None, None)
    arrays = dict(q=q, k=k, v=v, beta=beta, g=g, h0=initial_state, A_log=A_log,
                  dt_bias=dt_bias)
    if per_value:
        arrays = _per_value_heads(frame, arrays, state_v_first, dims)
    opts = KdaOptions(scale=scale, qk_l2norm=qk_l2norm, beta_is_logit=beta_logit,
                      state_v_first=state_v_first and not per_value,
                      gate_in_kernel=gate is not None, lower_bound=lower_bound, mode=mode,
                      chunk_size=chunk_size, bf16_products=bf16_products)
    o, ht = backend.run(_opspec.KDA, arrays, cu_seqlens, opts)

    def state_out(h):   # back from the value heads of size 1: [..., HV*V, K, 1]
        if not per_value:
            return h
        h = h.reshape(tuple(np.shape(h)[:-3]) + (dims[2], dims[4], dims[3]))
        return h if state_v_first else frame.swap_last(h)

    if per_value:
        o = o.reshape(dims[:3] + (dims[4],))
    result = (backend.cast(o, out_like), state_out(ht) if output_final_state else None)
    if not intermediate:
        return result
    with frame.no_grad():
        h = _chunk_start_states(frame, backend, arrays, opts, cu_seqlens, chunk_size)
    return result + (backend.cast(state_out(h), k),)


def eager_token_step(q, k, v, beta, g, h0, out_dtype, output_final_state, **kwargs):
    """A decode step from PyTorch straight to the decode op's C++ kernel
    (_torch_direct.kda_token_step): (o in out_dtype, the final state or None), or None: not
    torch tensors, or not that common form. kwargs: kda_token_step's."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(q, torch.Tensor):
        return None
    parts = _TOKEN_STEP_PARTS if _TOKEN_STEP_PARTS is not None else _token_step_parts()
    if not parts:  # torch without torch.library.custom_op
        return None
    direct, step, one_step = parts
    taken = direct.kda_token_step(step, q, k, v, beta, g, h0, one_step=one_step, **kwargs)
    if taken is None:
        return None
    o, ht = taken
    return (o if o.dtype == out_dtype else o.to(out_dtype)), ht if output_final_state else None


# (_torch_direct, the decode op's eager entry, linseq::kda_token_step's kernel or None), or ()
# without custom ops: looked up at the first step, not at each (an import statement costs
# microseconds there)
_TOKEN_STEP_PARTS = None


def _token_step_parts():
    global _TOKEN_STEP_PARTS
    from . import _torch_direct, _torch_native, _torch_ops
    _TOKEN_STEP_PARTS = () if not _torch_ops.AVAILABLE else (
        _torch_direct, _torch_ops.eager_entry("kda_decode"),
        _torch_native.defined_here("kda_token_step"))
    return _TOKEN_STEP_PARTS


def _dims(q, v):
    """(B, T, HV, K, V), None where q or v is malformed (the kernel's checks then say so)."""
    q_shape, v_shape = tuple(np.shape(q)), tuple(np.shape(v))
    B, T, K = (q_shape[0], q_shape[1], q_shape[3]) if len(q_shape) == 4 else (None,) * 3
    HV, V = v_shape[2:4] if len(v_shape) == 4 else (None, None)
    return B, T, HV, K, V


def _check_channel_shapes(gk, gv, beta, per_value, dims):
    B, T, HV, K, V = dims
    if gk is not None:
        _shape_of(gk, "gk", {(B, T, HV, K)}, f"[B,T,HV,K] = {[B, T, HV, K]}")
    if gv is not None:
        _shape_of(gv, "gv", {(B, T, HV, V)}, f"[B,T,HV,V] = {[B, T, HV, V]}")
    if per_value and beta is not None:
        _shape_of(beta, "beta", {(B, T, HV), (B, T, HV, V)},
                  f"[B,T,HV] = {[B, T, HV]} or per value channel [B,T,HV,V] = {[B, T, HV, V]}")


def _kernel_decay(frame, backend, g, gk, gv, gate, per_value, dims):
    """(the decay the kernel reads, the gate it applies or None). The gate stays in the
    kernel unless the decay is combined here from several terms: then linseq's gate op
    (kda_decay) runs first."""
    HV = dims[2]
    if gate is not None:
        A_log, dt_bias, lower_bound = gate
        if HV is not None:
            A_log = heads_vector(A_log, HV)
            if len(np.shape(g)) == 3:
                dt_bias = heads_vector(dt_bias, HV)
        gate = (A_log, dt_bias, lower_bound)
    if not per_value and gk is None:
        return g, gate
    if not per_value and g is None:
        return gk, None
    if gate is not None:
        gate_arrays = dict(g_raw=g, A_log=gate[0], dt_bias=gate[1])
        g = backend.run(_opspec.KDA_GATE, gate_arrays, None,
                        GateOptions(lower_bound=gate[2]))[0]
    return _sum_decays(frame, g, gk, gv, per_value, dims), None


def _sum_decays(frame, g, gk, gv, per_value, dims):
    """The log decay of every (head, key channel[, value channel]) from the per head (g
    [B,T,HV]), per key channel (g [B,T,HV,K] or gk) and per value channel (gv) terms:
    [B,T,HV*V] or [B,T,HV*V,K] over value heads of size 1 when per_value, else [B,T,HV,K]."""
    B, T, HV, K, V = dims
    head = g if g is not None and len(np.shape(g)) == 3 else None
    key = g if g is not None and len(np.shape(g)) == 4 else None
    if gk is not None:
        key = gk if key is None else key + gk
    if not per_value:
        return key if head is None else key + head[..., None]
    if head is None and key is None and gv is None:
        return None
    value = gv if gv is not None else frame.zeros((B, T, HV, V))
    if head is not None:
        value = value + head[..., None]
    if key is None:
        return value.reshape((B, T, HV * V))
    return (key[:, :, :, None, :] + value[..., None]).reshape((B, T, HV * V, K))


def _per_value_heads(frame, arrays, state_v_first, dims):
    """The problem over HV*V value heads of size 1 (head hv*V + j is value channel j of head
    hv; they share query head hv // (HV/H) as before). The state is taken [K,V]-first."""
    B, T, HV, K, V = dims
    a = dict(arrays)
    a["v"] = arrays["v"].reshape((B, T, HV * V, 1))
    beta = arrays["beta"]
    if beta is not None and len(np.shape(beta)) == 3:
        beta = beta[..., None] * frame.ones((B, T, HV, V))
    a["beta"] = None if beta is None else beta.reshape((B, T, HV * V))
    h0 = arrays["h0"]
    if h0 is not None:
        n = np.shape(h0)[0]
        h0 = h0 if state_v_first else frame.swap_last(h0)   # [N,HV,V,K]
        a["h0"] = h0.reshape((n, HV * V, K, 1))
    return a


def _chunk_start_states(frame, backend, arrays, opts, cu_seqlens, chunk_size):
    """The state before each chunk of every sequence ([B,NT,...], or [1,NT_total,...] with
    cu_seqlens, sequence after sequence): each sequence runs chunk by chunk, from its initial
    state, carrying the state."""
    B, T = np.shape(arrays["q"])[:2]
    HV, V = np.shape(arrays["v"])[2:4]
    K = np.shape(arrays["q"])[3]
    per_state = (HV, V, K) if opts.state_v_first else (HV, K, V)
    h0 = arrays["h0"]
    if cu_seqlens is None:
        groups = [(slice(0, B), 0, T, h0)]
    else:
        cu = [int(c) for c in np.asarray(cu_seqlens).reshape(-1)]
        groups = [(slice(0, 1), cu[n], cu[n + 1], None if h0 is None else h0[n:n + 1])
                  for n in range(len(cu) - 1)]
    per_token = ("q", "k", "v", "beta", "g")
    out = []
    for rows, start, end, state in groups:
        n = rows.stop - rows.start
        state = frame.zeros((n,) + per_state) if state is None else frame.f32(state)
        starts = []
        for s in range(start, end, chunk_size):
            starts.append(state)
            piece = {name: (x[:, s:min(s + chunk_size, end)] if name in per_token and
                            x is not None else x) for name, x in arrays.items()}
            piece["h0"] = state
            _, state = backend.run(_opspec.KDA, piece, None, opts)
        out.append(frame.stack(starts, 1) if starts else frame.zeros((n, 0) + per_state))
    return out[0] if cu_seqlens is None else frame.concat(out, 1)


