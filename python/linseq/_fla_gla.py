"""fla-core's gated linear attention functions with fla's signatures: `chunk_gla` and
`fused_recurrent_gla` (fla.ops.gla: a decay per key channel, and per value channel in the
recurrent one), `chunk_simple_gla` and `fused_recurrent_simple_gla` (fla.ops.simple_gla: a
decay per head, data-dependent g or constant g_gamma). Per head and token, with the state
S [K,V] and scale defaulting to K^-0.5:

    S_t = diag(exp(gk_t)) S_{t-1} diag(exp(gv_t)) + k_t v_t^T,    o_t = scale * S_t^T q_t

(simple GLA: exp(g_t + g_gamma) scales the whole state). This is KDA's recurrence without the
delta rule, and it runs on the same C op: _delta_rule.delta_rule(delta=False) passes no beta,
which the op reads as gated linear attention. The per value channel decay gv takes the value
heads of size 1 that _delta_rule describes. reverse=True runs each sequence from its last
token to its first: the tokens (and, with cu_seqlens, the sequences and initial states) are
flipped around the call in the caller's framework, which is exact and differentiable.
"""

import numpy as np

from . import _delta_rule
from ._compile_blocks import compilable
from ._fla_signatures import _keywords, _state_layout

__all__ = ["chunk_gla", "fused_recurrent_gla", "chunk_simple_gla", "fused_recurrent_simple_gla",
           "ARGUMENTS"]

ARGUMENTS = {
    "honoured": (
        "q, k, v (HV a multiple of H), g / gk [B,T,HV,K], gv [B,T,HV,V] (recurrent GLA), g "
        "[B,T,HV] and g_gamma [HV] (simple GLA; both given add up, as in fla's recurrent "
        "kernel), scale, initial_state, output_final_state, reverse (recurrent functions), "
        "state_v_first, transpose_state_layout (deprecated name of state_v_first), "
        "cu_seqlens, chunk_size (chunk_simple_gla: 16, 32, 64 or 128)"),
    "accepted, unused": "cu_seqlens_cpu (derived from cu_seqlens)",
    "refused": "head_first (removed from fla too), and any other keyword, by name",
}


@compilable
def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
              state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """GLA in chunked form, fla-core's `chunk_gla`: g [B,T,HV,K] the log decay per key
    channel (<= 0), q, k [B,T,H,K], v [B,T,HV,V], initial_state [N,HV,K,V] ([N,HV,V,K]
    with state_v_first). Returns (o in q's dtype, final_state float32 or None)."""
    extra = _keywords("chunk_gla", kwargs, ())
    return _gated_linear_attention(
        "chunked", 64, extra, q, k, v, gk=g, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, state_v_first=_state_layout(state_v_first, kwargs),
        cu_seqlens=cu_seqlens, out_like=q)


@compilable
def fused_recurrent_gla(q, k, v, gk=None, gv=None, scale=None, initial_state=None,
                        output_final_state=False, reverse=False, state_v_first=False,
                        cu_seqlens=None, **kwargs):
    """GLA token by token, fla-core's `fused_recurrent_gla`: gk [B,T,HV,K] and gv
    [B,T,HV,V] the log decays of the state's rows and columns (either, both or neither).
    Returns (o in v's dtype, final_state float32 or None); unlike fla's, differentiable."""
    extra = _keywords("fused_recurrent_gla", kwargs, ())
    return _gated_linear_attention(
        "recurrent", 64, extra, q, k, v, gk=gk, gv=gv, scale=scale,
        initial_state=initial_state, output_final_state=output_final_state, reverse=reverse,
        state_v_first=_state_layout(state_v_first, kwargs), cu_seqlens=cu_seqlens, out_like=v)


@compilable
def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                     output_final_state=False, state_v_first=False, cu_seqlens=None,
                     cu_seqlens_cpu=None, **kwargs):
    """Simple GLA in chunked form, fla-core's `chunk_simple_gla`: g [B,T,HV] a log decay
    per head and token, g_gamma [HV] a constant one per head. Keyword chunk_size (a power
    of two, as fla asks; linseq runs 16 to 128). Returns (o in q's dtype, final_state)."""
    extra = _keywords("chunk_simple_gla", kwargs, ("chunk_size",))
    chunk_size = extra.get("chunk_size") or 64
    if chunk_size != 2 ** (int(chunk_size).bit_length() - 1):
        raise ValueError(f"chunk_size: must be a power of 2, got {chunk_size}")
    return _gated_linear_attention(
        "chunked", chunk_size, extra, q, k, v, g=_head_decay(g, g_gamma, v), scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        state_v_first=_state_layout(state_v_first, kwargs), cu_seqlens=cu_seqlens, out_like=q)


@compilable
def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                               output_final_state=False, reverse=False, state_v_first=False,
                               cu_seqlens=None, **kwargs):
    """Simple GLA token by token, fla-core's `fused_recurrent_simple_gla` (arguments as
    chunk_simple_gla, plus reverse). Returns (o in v's dtype, final_state); differentiable."""
    extra = _keywords("fused_recurrent_simple_gla", kwargs, ())
    return _gated_linear_attention(
        "recurrent", 64, extra, q, k, v, g=_head_decay(g, g_gamma, v), scale=scale,
        initial_state=initial_state, output_final_state=output_final_state, reverse=reverse,
        state_v_first=_state_layout(state_v_first, kwargs), cu_seqlens=cu_seqlens, out_like=v)


def _head_decay(g, g_gamma, v):
    """The per head log decay [B,T,HV] from g, g_gamma [HV] (broadcast over the tokens; a
    view, differentiable), or their sum; None without either."""
    if g_gamma is None:
        return g
    B, T, HV = np.shape(v)[:3] if len(np.shape(v)) == 4 else (None,) * 3
    if tuple(np.shape(g_gamma)) != (HV,):
        raise ValueError(f"g_gamma: expected shape [HV] = [{HV}] (one log decay per head), "
                         f"got {list(np.shape(g_gamma))}")
    xp = _namespace(g_gamma)
    gamma = xp.broadcast_to(g_gamma, (B, T, HV))
    return gamma if g is None else g + gamma


def _namespace(x):
    """The array module of x: torch, jax.numpy or NumPy."""
    module = type(x).__module__
    if module.startswith("torch"):
        import torch
        return torch
    if module.startswith("jax"):
        import jax.numpy as jnp
        return jnp
    return np


def _gated_linear_attention(mode, chunk_size, extra, q, k, v, *, g=None, gk=None, gv=None,
                            scale, initial_state, output_final_state, reverse=False,
                            state_v_first, cu_seqlens, out_like):
    """fla's checks of varlen, then one call of the C op without beta (flipped in time for
    reverse): (o, final_state or None)."""
    if cu_seqlens is not None:
        if np.shape(q)[0] != 1:
            raise ValueError(f"q: the batch size must be 1 with cu_seqlens (packed sequences), "
                             f"got {np.shape(q)[0]}")
        n_seqs = len(cu_seqlens) - 1
        if initial_state is not None and np.shape(initial_state)[0] != n_seqs:
            raise ValueError(f"initial_state: expected one state per sequence, {n_seqs} rows "
                             f"(from cu_seqlens), got {np.shape(initial_state)[0]}")
    per_token = dict(q=q, k=k, v=v, g=g, gk=gk, gv=gv)
    if reverse:
        per_token = {name: _flip(x, 1) for name, x in per_token.items()}
        initial_state, cu_seqlens = _reversed_sequences(initial_state, cu_seqlens)
    o, final_state = _delta_rule.delta_rule(
        mode, chunk_size, extra.get("_framework"), per_token["q"], per_token["k"],
        per_token["v"], None, g=per_token["g"], gk=per_token["gk"], gv=per_token["gv"],
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        qk_l2norm=False, beta_logit=False, neg_eigval=False, state_v_first=state_v_first,
        cu_seqlens=cu_seqlens, out_like=out_like, delta=False)
    if reverse:
        o = _flip(o, 1)
        if final_state is not None and cu_seqlens is not None:
            final_state = _flip(final_state, 0)
    return o, final_state


def _flip(x, axis):
    if x is None:
        return None
    xp = _namespace(x)
    return xp.flip(x, (axis,))


def _reversed_sequences(initial_state, cu_seqlens):
    """Flipping the packed token axis reverses the order of the sequences too: their initial
    states in reverse row order, and the offsets of the reversed lengths."""
    if cu_seqlens is None:
        return initial_state, None
    cu = np.asarray(cu_seqlens.cpu() if hasattr(cu_seqlens, "cpu") else cu_seqlens)
    flipped = (cu[-1] - cu[::-1]).astype(cu.dtype)
    if _namespace(cu_seqlens) is not np:
        flipped = _namespace(cu_seqlens).asarray(flipped)
    return _flip(initial_state, 0), flipped
