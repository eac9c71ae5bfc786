"""fla-core's KDA and Gated DeltaNet functions, with fla's signatures, on linseq's kernels.

    from linseq.compat.fla import (chunk_kda, fused_recurrent_kda, chunk_gated_delta_rule,
                                   fused_recurrent_gated_delta_rule)

replaces `from fla.ops.kda import ...` and `from fla.ops.gated_delta_rule import ...`
(and fused_kda_gate, fused_gdn_gate replace the gate helpers of fla.ops.kda.gate and
fla.ops.gated_delta_rule.gate, on linseq's gate op):
same positional order, defaults and keyword arguments, same return values (the output in
q's dtype from the chunked functions and in v's dtype from the recurrent ones, the final
state float32), on CPU tensors (NumPy and JAX arrays work too). Unlike fla's, the recurrent
functions have a backward (linseq's exact one). linseq.chunk_kda and
linseq.fused_recurrent_kda are these same functions.

Every fla argument is honoured, accepted because it does not change the result, or refused
with an error that names it; `ARGUMENTS` below lists which, and why. How the options fla's
kernels have and linseq's C kernel lacks are reached:

- allow_neg_eigval: beta is 2 * sigmoid(logit), computed before the kernel in the caller's
  framework (so its gradient is the framework's).
- Per value channel beta [B,T,HV,V] and GDN's per value channel decay gv [B,T,HV,V]: each
  value channel of a delta rule is a delta rule of its own, so the problem runs as HV*V value
  heads of size 1 (decay g + gv_j per head, or g + gk + gv_j per key channel), and is folded
  back. Token by token that is the plain problem's arithmetic; in chunks the in-chunk work
  grows V times (every value head of size 1 has its own chunk matrices). With a per key
  channel decay (KDA's g, GDN's gk) the expanded decay is a [B,T,HV*V,K] array, V times
  the size of gk.
- A per head decay together with gk (GDN's recurrent g and gk): their sum is the per channel
  decay; with use_gate_in_kernel the gate is linseq's gate op (kda_decay) before the sum.
- return_intermediate_states (chunk_kda): the state at the start of every chunk, each sequence
  run chunk by chunk from its initial state (one more forward, in pieces); no gradient, as
  in fla.
"""

import contextlib
import functools
import sys
import warnings

import numpy as np

from .. import api
from .._arrays import framework_of
from .._backends import backend_for

__all__ = ["chunk_kda", "fused_recurrent_kda", "chunk_gated_delta_rule",
           "fused_recurrent_gated_delta_rule", "chunk_gdn", "fused_recurrent_gdn",
           "fused_kda_gate", "fused_gdn_gate", "ARGUMENTS"]

ARGUMENTS = {
    "honoured": (
        "q, k, v (HV a multiple of H), g, beta, scale, initial_state, output_final_state, "
        "use_qk_l2norm_in_kernel, use_gate_in_kernel with A_log (any shape of HV elements) "
        "and dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound (the "
        "lower-bound gate with use_gate_in_kernel; without the gate it is unused, as in fla), "
        "state_v_first, transpose_state_layout (deprecated name of state_v_first, with "
        "fla's DeprecationWarning; both together are refused), cu_seqlens, chunk_size "
        "(16, 32, 64 or 128: linseq also takes the sizes fla refuses), beta=None (ones), "
        "per value channel beta [B,T,HV,V] and gk/gv (recurrent GDN), "
        "return_intermediate_states (chunk_kda)"),
    "accepted, unused": (
        "safe_gate (a speed option of fla's kernel: linseq's is exact for every gate; fla's "
        "checks of lower_bound with it are kept), disable_recompute (linseq's backward keeps "
        "the chunk states of the forward anyway), cu_seqlens_cpu and chunk_indices (derived "
        "from cu_seqlens), cp_context=None"),
    "context parallel": (
        "cp_context (chunk_kda, chunk_gated_delta_rule): a linseq.distributed.build_context "
        "context, with this rank's tokens [1,T_r,...] as torch tensors; initial_state "
        "[N,...] global, the final state has the rows of the sequences ending on this rank; "
        "per value channel beta and return_intermediate_states are refused there, and "
        "fla's FLACPContext is refused (it drives fla's kernels)"),
    "refused": (
        "cp_context in the recurrent functions, head_first "
        "(removed from fla too), and any other keyword, by name"),
}


# ------------------------------------------------------------------------------------------
# torch.compile: each public function as one non-strict traced block
# ------------------------------------------------------------------------------------------

# name -> the function as written; name -> the same as a non-strict traced block
_ENTRIES, _TORCH_BLOCKS = {}, {}


def _compilable(fn):
    """fn, which under torch.compile runs as a non-strict traced block (where linseq's
    custom ops land in the graph: Dynamo cannot trace the checks of api, which build ctypes
    structs). The blocks are made once torch is loaded: when this module is imported after
    torch, or at the first call, or when linseq.torch is imported, so importing this module
    never imports torch. (Compiled before any of these, fn is traced by Dynamo itself,
    which breaks the graph.)"""
    _ENTRIES[fn.__name__] = fn

    @functools.wraps(fn)
    def entry(*args, **kwargs):
        if not _TORCH_BLOCKS and "torch" in sys.modules:
            _bind_torch(sys.modules["torch"])
        return _TORCH_BLOCKS.get(fn.__name__, fn)(*args, **kwargs)
    return entry


def _bind_torch(torch):
    """The non-strict blocks, where torch has nonstrict_trace and torch.library.custom_op
    (2.4 and later: linseq's custom ops), else none (fn runs as it is)."""
    trace = (getattr(getattr(torch, "compiler", None), "nonstrict_trace", None)
             or getattr(getattr(torch, "_dynamo", None), "nonstrict_trace", None))
    if trace is not None and hasattr(torch.library, "custom_op"):
        _TORCH_BLOCKS.update({name: trace(fn) for name, fn in _ENTRIES.items()})


# ------------------------------------------------------------------------------------------
# The four functions
# ------------------------------------------------------------------------------------------

@_compilable
def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
              use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
              lower_bound=None, disable_recompute=False, return_intermediate_states=False,
              state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, cp_context=None,
              **kwargs):
    """KDA in chunked form, fla-core's `chunk_kda`.

    q, k [B,T,H,K]; v [B,T,HV,V] (HV a multiple of H); g [B,T,HV,K] the log decay (also
    [B,T,HV], one per head), or with use_gate_in_kernel the raw gate: -exp(A_log) *
    softplus(g + dt_bias), or lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) when
    lower_bound is set (A_log may then be None: exp(A_log) = 1); A_log has HV elements,
    dt_bias is [HV*K] or [HV,K]; beta [B,T,HV] (logits with use_beta_sigmoid_in_kernel,
    doubled with allow_neg_eigval); initial_state [N,HV,K,V] ([N,HV,V,K] with
    state_v_first); cu_seqlens: N+1 offsets of packed sequences (B == 1).
    Keywords: A_log, dt_bias, chunk_size (16, 32, 64 or 128; fla takes only 32 and 64),
    transpose_state_layout (deprecated), chunk_indices (unused).
    Returns (o [B,T,HV,V] in q's dtype, final_state float32 or None), and with
    return_intermediate_states also h [B,NT,HV,K,V] ([B,NT,HV,V,K] with state_v_first) in
    k's dtype: the state at the start of each chunk of chunk_size tokens (B = 1 and the
    chunks of every sequence in turn with cu_seqlens), without gradient. fla allows it only
    under torch.inference_mode(); here o and final_state keep their gradients.
    cp_context: a linseq.distributed.build_context context: q..beta are then this rank's
    tokens [1,T_r,...] of the context's packed sequences (see linseq.distributed.chunk_kda).
    """
    extra = _keywords("chunk_kda", kwargs, ("A_log", "dt_bias", "chunk_size",
                                            "chunk_indices"))
    state_v_first = _state_layout(state_v_first, kwargs)
    _check_common(None, allow_neg_eigval, use_beta_sigmoid_in_kernel)
    gate = _kda_gate(use_gate_in_kernel, extra, lower_bound, safe_gate)
    if cp_context is not None and return_intermediate_states:
        raise ValueError("return_intermediate_states: not available with cp_context "
                         "(the chunk states of a rank depend on the ranks before it)")
    return _chunked(cp_context, extra, q, k, v, g, beta, gate=gate, scale=scale,
                    initial_state=initial_state, output_final_state=output_final_state,
                    qk_l2norm=use_qk_l2norm_in_kernel, beta_logit=use_beta_sigmoid_in_kernel,
                    neg_eigval=allow_neg_eigval, state_v_first=state_v_first,
                    cu_seqlens=cu_seqlens, intermediate=return_intermediate_states)



def _chunked(cp_context, extra, q, k, v, g, beta, *, intermediate=False, **options):
    """The chunked functions' run: across the ranks of a linseq context, or here. options:
    gate, scale, initial_state, output_final_state, qk_l2norm, beta_logit, neg_eigval,
    state_v_first, cu_seqlens; the output in q's dtype."""
    chunk_size = extra.get("chunk_size", 64)
    if cp_context is not None:
        return _context_parallel(cp_context, q, k, v, g, beta, chunk_size=chunk_size, **options)
    return _delta_rule("chunked", chunk_size, extra.get("_framework"), q, k, v, beta, g=g,
                       out_like=q, intermediate=intermediate, **options)

@_compilable
def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None,
                        initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                        lower_bound=None, state_v_first=False, cu_seqlens=None, **kwargs):
    """KDA token by token, fla-core's `fused_recurrent_kda` (A_log and dt_bias are its 6th
    and 7th positional arguments). Same arguments as chunk_kda, and beta may be
    [B,T,HV,V] (one beta per value channel). Returns (o in v's dtype, final_state float32 or
    None); unlike fla's, differentiable. A_log None without lower_bound is refused with the
    gate (fla's recurrent kernel then reads exp(A_log) as e, its chunked one refuses it)."""
    extra = _keywords("fused_recurrent_kda", kwargs, _UNUSED_KEYWORDS)
    state_v_first = _state_layout(state_v_first, kwargs)
    _check_common(extra.get("cp_context"), allow_neg_eigval, use_beta_sigmoid_in_kernel)
    gate = _kda_gate(use_gate_in_kernel, dict(A_log=A_log, dt_bias=dt_bias), lower_bound,
                     False)
    return _delta_rule(
        "recurrent", 64, extra.get("_framework"), q, k, v, beta, g=g, gate=gate, scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        qk_l2norm=use_qk_l2norm_in_kernel, beta_logit=use_beta_sigmoid_in_kernel,
        neg_eigval=allow_neg_eigval, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
        out_like=v)


@_compilable
def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False,
                           use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                           chunk_indices=None, cp_context=None, **kwargs):
    """Gated DeltaNet in chunked form, fla-core's `chunk_gated_delta_rule`.

    g [B,T,HV]: one log decay per head (None: no decay), or with use_gate_in_kernel=True
    (keyword) the raw gate, -exp(A_log) * softplus(g + dt_bias) with A_log and dt_bias of HV
    elements. Keywords: use_gate_in_kernel, A_log, dt_bias, chunk_size (16, 32, 64 or 128),
    transpose_state_layout (deprecated). The rest as chunk_kda. Returns (o in q's dtype,
    final_state float32 or None).
    """
    extra = _keywords("chunk_gated_delta_rule", kwargs,
                      ("use_gate_in_kernel", "A_log", "dt_bias", "chunk_size",
                       "safe_gate", "disable_recompute"))
    state_v_first = _state_layout(state_v_first, kwargs)
    _check_common(None, allow_neg_eigval, use_beta_sigmoid_in_kernel)
    gate = _gdn_gate(extra.get("use_gate_in_kernel", False), extra.get("A_log"),
                     extra.get("dt_bias"), g)
    return _chunked(cp_context, extra, q, k, v, g, beta, gate=gate, scale=scale,
                    initial_state=initial_state, output_final_state=output_final_state,
                    qk_l2norm=use_qk_l2norm_in_kernel, beta_logit=use_beta_sigmoid_in_kernel,
                    neg_eigval=allow_neg_eigval, state_v_first=state_v_first,
                    cu_seqlens=cu_seqlens)


@_compilable
def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None,
                                     initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                                     allow_neg_eigval=False, state_v_first=False,
                                     cu_seqlens=None, **kwargs):
    """Gated DeltaNet token by token, fla-core's `fused_recurrent_gated_delta_rule`.

    Decays, all optional and multiplied: g [B,T,HV] per head (the raw gate with
    use_gate_in_kernel), gk [B,T,HV,K] per key channel, gv [B,T,HV,V] per value channel.
    beta [B,T,HV] or [B,T,HV,V] (per value channel); None means ones (then logits of 1 with
    use_beta_sigmoid_in_kernel, as in fla). Returns (o in v's dtype, final_state float32 or
    None); unlike fla's, differentiable.
    """
    extra = _keywords("fused_recurrent_gated_delta_rule", kwargs, _UNUSED_KEYWORDS)
    state_v_first = _state_layout(state_v_first, kwargs)
    _check_common(extra.get("cp_context"), allow_neg_eigval, use_beta_sigmoid_in_kernel)
    gate = _gdn_gate(use_gate_in_kernel, A_log, dt_bias, g)
    return _delta_rule(
        "recurrent", 64, extra.get("_framework"), q, k, v, beta, g=g, gk=gk, gv=gv, gate=gate,
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        qk_l2norm=use_qk_l2norm_in_kernel, beta_logit=use_beta_sigmoid_in_kernel,
        neg_eigval=allow_neg_eigval, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
        out_like=v)


chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule


@_compilable
def fused_kda_gate(g, A_log=None, dt_bias=None, lower_bound=None, output_dtype=None):
    """fla's KDA gate helper (fla.ops.kda.gate.fused_kda_gate) on linseq's gate op:
    -exp(A_log) * softplus(g + dt_bias), or lower_bound * sigmoid(exp(A_log) * (g + dt_bias))
    with lower_bound (A_log None: exp(A_log) = 1). g [..., H, K]; A_log H elements; dt_bias
    H*K elements. Returns [..., H, K] in output_dtype (None: float32, fla's default)."""
    if A_log is None and lower_bound is None:
        raise ValueError("A_log: required unless lower_bound is set")
    shape = tuple(np.shape(g))
    if len(shape) < 2:
        raise ValueError(f"g: expected shape [..., H, K], got {list(shape)}")
    H, K = shape[-2:]
    return _gate(g.reshape((1, -1, H, K)), A_log, dt_bias, H * K, lower_bound, shape,
                 output_dtype)


@_compilable
def fused_gdn_gate(g, A_log, dt_bias=None, output_dtype=None):
    """fla's Gated DeltaNet gate helper (fla.ops.gated_delta_rule.gate.fused_gdn_gate) on
    linseq's gate op: -exp(A_log) * softplus(g + dt_bias). g [..., HV]; A_log and dt_bias HV
    elements. Returns g's shape in output_dtype (None: float32, fla's default)."""
    shape = tuple(np.shape(g))
    if len(shape) < 1:
        raise ValueError("g: expected shape [..., HV], got a scalar")
    return _gate(g.reshape((1, -1, shape[-1])), A_log, dt_bias, shape[-1], None, shape,
                 output_dtype)


def _gate(g, A_log, dt_bias, bias_size, lower_bound, shape, output_dtype):
    framework = framework_of([g, A_log, dt_bias])
    H = np.shape(g)[2]
    A_log = _heads_vector(A_log, H)
    if dt_bias is not None and int(np.prod(np.shape(dt_bias))) == bias_size:
        dt_bias = dt_bias.reshape((bias_size,))
    out = api.kda_decay(g, A_log, dt_bias, lower_bound=lower_bound, _framework=framework)
    out = out.reshape(shape)
    if output_dtype is None:
        return out
    return out.to(output_dtype) if framework == "torch" else out.astype(output_dtype)


# ------------------------------------------------------------------------------------------
# Arguments
# ------------------------------------------------------------------------------------------

# keywords the recurrent functions take without effect: fla's **kwargs swallows them there
_UNUSED_KEYWORDS = ("safe_gate", "disable_recompute", "cu_seqlens_cpu", "chunk_indices",
                    "cp_context")


def _keywords(function, kwargs, known):
    """The keywords fla reads from **kwargs (and the unused ones accepted); any other is
    refused by name, where fla would ignore it silently."""
    extra = {}
    for name, value in kwargs.items():
        if name in known or name == "_framework":
            extra[name] = value
        elif name == "head_first":
            raise TypeError(f"{function}: head_first was removed from fla; inputs are "
                            "[B,T,H,...]")
        elif name != "transpose_state_layout":
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r} "
                            "(linseq.compat.fla takes fla's arguments only; see ARGUMENTS)")
    return extra


def _state_layout(state_v_first, kwargs):
    """fla's rename of transpose_state_layout to state_v_first: the old name still works,
    with a DeprecationWarning, and giving both is an error."""
    if "transpose_state_layout" not in kwargs:
        return bool(state_v_first)
    if state_v_first:
        raise ValueError("transpose_state_layout and state_v_first were both given; "
                         "transpose_state_layout is the deprecated name of state_v_first: "
                         "pass state_v_first only")
    warnings.warn("transpose_state_layout is deprecated: it is now called state_v_first",
                  DeprecationWarning, stacklevel=3)
    return bool(kwargs["transpose_state_layout"])


def _check_common(cp_context, allow_neg_eigval, use_beta_sigmoid_in_kernel):
    if cp_context is not None:
        raise NotImplementedError("cp_context: the recurrent functions have no context "
                                  "parallel path (fla's neither); use the chunked ones")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval=True needs use_beta_sigmoid_in_kernel=True "
                         "(beta is then 2 * sigmoid(logit), in (0, 2))")


def _kda_gate(use_gate_in_kernel, extra, lower_bound, safe_gate):
    """(A_log, dt_bias, lower_bound) of KDA's in-kernel gate, or None without it (A_log,
    dt_bias and lower_bound are then unused, as in fla)."""
    if not use_gate_in_kernel:
        return None
    A_log, dt_bias = extra.get("A_log"), extra.get("dt_bias")
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


def _gdn_gate(use_gate_in_kernel, A_log, dt_bias, g):
    """(A_log, dt_bias, None) of GDN's per head gate, or None (A_log and dt_bias are then
    unused, as in fla)."""
    if not use_gate_in_kernel:
        return None
    if A_log is None:
        raise ValueError("A_log: required with use_gate_in_kernel=True")
    if g is None:
        raise ValueError("g: the raw gate input is required with use_gate_in_kernel=True")
    return A_log, dt_bias, None


# ------------------------------------------------------------------------------------------
# Context parallelism: linseq.distributed with fla's arguments
# ------------------------------------------------------------------------------------------

def _context_parallel(cp, q, k, v, g, beta, *, gate, scale, initial_state, output_final_state,
                      qk_l2norm, beta_logit, neg_eigval, state_v_first, cu_seqlens,
                      chunk_size):
    """This rank's tokens through linseq.distributed.chunk_kda (torch tensors, B == 1, the
    sequences from the context): o in q's dtype, the final state [N,HV,K,V] float32 with the
    rows of the sequences ending on this rank ([N,HV,V,K] with state_v_first) or None."""
    import torch
    from .. import distributed
    if not isinstance(cp, distributed.ContextParallel):
        # NotImplementedError, as before linseq had context parallelism: fla's own context
        # (FLACPContext) describes fla's kernels' split, which linseq does not run
        raise NotImplementedError(f"cp_context: expected linseq.distributed.build_context"
                                  f"(...)'s context, got {type(cp).__name__}")
    arrays = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    for name, x in arrays.items():
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor with cp_context (context "
                            f"parallelism runs over torch.distributed), got "
                            f"{type(x).__name__}")
    _check_context_seqlens(cp, cu_seqlens, torch)
    T = q.shape[1] if q.dim() == 4 else None
    HV = v.shape[2] if v.dim() == 4 else None
    if beta is not None and beta.dim() == 4:
        raise ValueError("beta: per value channel beta [B,T,HV,V] is not available with "
                         "cp_context; pass [B,T,HV]")
    if beta is None:
        beta = torch.ones(v.shape[:3])
    beta = beta.float()
    if neg_eigval:
        beta, beta_logit = 2.0 * torch.sigmoid(beta), False
    if g is None:   # Gated DeltaNet without decay
        g = torch.zeros(1, T if T is not None else 0, HV if HV is not None else 0)
    A_log, dt_bias, lower_bound = gate if gate is not None else (None, None, None)
    A_log = _heads_vector(A_log, HV) if HV is not None else A_log
    if dt_bias is not None:
        dt_bias = dt_bias.reshape(-1)
    h0 = None if initial_state is None else initial_state.float()
    o, ht = distributed.chunk_kda(
        q.float(), k.float(), v.float(), g.float(), beta, scale, h0, output_final_state,
        qk_l2norm, gate is not None, A_log, dt_bias, lower_bound, beta_logit,
        cp_context=cp, chunk_size=chunk_size, state_v_first=state_v_first)
    return o.to(q.dtype), ht


def _check_context_seqlens(cp, cu_seqlens, torch):
    """fla takes the rank's cu_seqlens from the context; one given as well must be the
    context's (global or this rank's), not another split."""
    if cu_seqlens is None:
        return
    given = [int(c) for c in torch.as_tensor(cu_seqlens).reshape(-1).tolist()]
    if given not in (list(cp.cu_seqlens), list(cp.local_offsets)):
        raise ValueError(f"cu_seqlens: with cp_context the sequences come from the context "
                         f"(global {list(cp.cu_seqlens)}, this rank's "
                         f"{list(cp.local_offsets)}); pass cu_seqlens=None, got {given}")


# ------------------------------------------------------------------------------------------
# The computation: the C KDA op, with the options it lacks expressed through its inputs
# ------------------------------------------------------------------------------------------

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


def _shape_of(x, name, shapes, what):
    shape = tuple(np.shape(x))
    if shape not in shapes:
        raise ValueError(f"{name}: expected shape {what}, got {list(shape)}")


def _heads_vector(x, HV):
    """A per head parameter of any shape with HV elements (fla's tests pass A_log as
    [1,1,HV,1]), as [HV]; other sizes are left to the kernel's checks."""
    if x is None or int(np.prod(np.shape(x))) != HV:
        return x
    return x.reshape(HV) if hasattr(x, "reshape") else np.reshape(x, HV)


def _delta_rule(mode, chunk_size, framework, q, k, v, beta, *, g=None, gk=None, gv=None,
                gate=None, scale, initial_state, output_final_state, qk_l2norm, beta_logit,
                neg_eigval, state_v_first, cu_seqlens, out_like, intermediate=False):
    """One call of the C KDA op (or, with return_intermediate_states, one more in pieces):
    o in out_like's dtype, the final state or None (and the chunk start states)."""
    values = [q, k, v, g, gk, gv, beta, initial_state, cu_seqlens] + list(gate or ())
    framework = framework or framework_of(values)
    frame = _Frame(framework)
    dims = _dims(q, v)
    if beta is None and None not in dims:
        beta = frame.ones(dims[:3])  # fla's default, then read as the beta flags say
    if neg_eigval:
        beta = 2.0 / (1.0 + frame.xp.exp(-frame.f32(beta)))
        beta_logit = False
    per_value = gv is not None or len(np.shape(beta)) == 4
    _check_channel_shapes(gk, gv, beta, per_value, dims)
    g, gate = _kernel_decay(frame, g, gk, gv, gate, per_value, dims)
    A_log, dt_bias, lower_bound = gate if gate is not None else (None, None, None)
    arrays = dict(q=q, k=k, v=v, beta=beta, g=g, h0=initial_state, A_log=A_log,
                  dt_bias=dt_bias)
    if per_value:
        arrays = _per_value_heads(frame, arrays, state_v_first, dims)
    opts = api.KdaOptions(scale=scale, qk_l2norm=qk_l2norm, beta_is_logit=beta_logit,
                          state_v_first=state_v_first and not per_value,
                          gate_in_kernel=gate is not None, lower_bound=lower_bound, mode=mode,
                          chunk_size=chunk_size)
    backend = backend_for(list(arrays.values()) + [cu_seqlens], framework)
    o, ht = backend.kda(arrays, cu_seqlens, opts)

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
    if per_value:
        _shape_of(beta, "beta", {(B, T, HV), (B, T, HV, V)},
                  f"[B,T,HV] = {[B, T, HV]} or per value channel [B,T,HV,V] = {[B, T, HV, V]}")


def _kernel_decay(frame, g, gk, gv, gate, per_value, dims):
    """(the decay the kernel reads, the gate it applies or None). The gate stays in the
    kernel unless the decay is combined here from several terms: then linseq's gate op
    (kda_decay) runs first."""
    HV = dims[2]
    if gate is not None:
        A_log, dt_bias, lower_bound = gate
        if HV is not None:
            A_log = _heads_vector(A_log, HV)
            if len(np.shape(g)) == 3:
                dt_bias = _heads_vector(dt_bias, HV)
        gate = (A_log, dt_bias, lower_bound)
    if not per_value and gk is None:
        return g, gate
    if not per_value and g is None:
        return gk, None
    if gate is not None:
        g = api.kda_decay(g, gate[0], gate[1], lower_bound=gate[2], _framework=frame.name)
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
    if len(np.shape(beta)) == 3:
        beta = beta[..., None] * frame.ones((B, T, HV, V))
    a["beta"] = beta.reshape((B, T, HV * V))
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
            _, state = backend.kda(piece, None, opts)
        out.append(frame.stack(starts, 1) if starts else frame.zeros((n, 0) + per_state))
    return out[0] if cu_seqlens is None else frame.concat(out, 1)


if "torch" in sys.modules:
    _bind_torch(sys.modules["torch"])
