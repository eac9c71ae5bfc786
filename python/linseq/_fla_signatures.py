"""fla-core's KDA and Gated DeltaNet functions with fla's signatures: positional order,
defaults, keywords and return values, fla's checks of its arguments, and cp_context (context
parallelism through linseq.distributed), over one computation (_delta_rule.delta_rule).

linseq.chunk_kda and linseq.fused_recurrent_kda are these functions, and linseq.compat.fla
exports them all as the drop-in for fla (its docstring says what each argument does there;
ARGUMENTS below lists which are honoured, accepted without effect, or refused). Each is
compilable (_compile_blocks): under torch.compile it runs as one non-strict traced block.
"""

import sys
import warnings

import numpy as np

from . import _delta_rule, _opspec
from ._arrays import framework_of
from ._backends import backend_for
from ._compile_blocks import compilable
from ._options import GateOptions

__all__ = ["chunk_kda", "fused_recurrent_kda", "fused_recurrent_kda_fwd",
           "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_gdn",
           "fused_recurrent_gdn",
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
        "return_intermediate_states (chunk_kda); fused_recurrent_kda_fwd's "
        "inplace_final_state, out, ssm_state_indices ([N] or [N,S]; a negative starting row "
        "is padding) and num_accepted_tokens"),
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
    "linseq's own": (
        "bf16_products (chunk_kda, chunk_gated_delta_rule): True lets the forward run the "
        "products only the output reads, and the backward those only the per-token gradients "
        "read, on bfloat16 operands, float32 accumulation (fla's kernels take bf16 operands "
        "on bf16 inputs); the final state and the initial state's gradient are bit for bit "
        "the float32 ones; no effect with cp_context"),
    "refused": (
        "cp_context in the recurrent functions, head_first "
        "(removed from fla too), and any other keyword, by name"),
}


# ------------------------------------------------------------------------------------------
# The four functions
# ------------------------------------------------------------------------------------------

@compilable
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
    transpose_state_layout (deprecated), chunk_indices (unused), and linseq's own
    bf16_products: True lets the forward run the output's products, and the backward those
    of the per-token gradients, on bfloat16 operands (fla's kernels do so on bf16 inputs;
    include/linseq.h, exec->products: the final state and the initial state's gradient stay
    bit for bit the same; not taken with cp_context).
    Returns (o [B,T,HV,V] in q's dtype, final_state float32 or None), and with
    return_intermediate_states also h [B,NT,HV,K,V] ([B,NT,HV,V,K] with state_v_first) in
    k's dtype: the state at the start of each chunk of chunk_size tokens (B = 1 and the
    chunks of every sequence in turn with cu_seqlens), without gradient. fla allows it only
    under torch.inference_mode(); here o and final_state keep their gradients.
    cp_context: a linseq.distributed.build_context context: q..beta are then this rank's
    tokens [1,T_r,...] of the context's packed sequences (see linseq.distributed.chunk_kda).
    """
    extra = _keywords("chunk_kda", kwargs, ("A_log", "dt_bias", "chunk_size",
                                            "chunk_indices", "bf16_products"))
    state_v_first = _state_layout(state_v_first, kwargs)
    _check_common(None, allow_neg_eigval, use_beta_sigmoid_in_kernel)
    gate = _delta_rule.kda_gate(use_gate_in_kernel, extra.get("A_log"), extra.get("dt_bias"),
                                lower_bound, safe_gate)
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
    if cp_context is not None:  # (bf16_products, a permission, is not taken there)
        return _context_parallel(cp_context, q, k, v, g, beta, chunk_size=chunk_size, **options)
    return _delta_rule.delta_rule("chunked", chunk_size, extra.get("_framework"), q, k, v,
                                  beta, g=g, out_like=q, intermediate=intermediate,
                                  bf16_products=bool(extra.get("bf16_products", False)),
                                  **options)


def _recurrent_token_step(q, k, v, g, beta, initial_state, output_final_state, qk_l2norm):
    """The recurrent functions' decode call with their defaults (scale, layouts, no gate in
    the kernel, no packed sequences), straight to the step delta_rule would take first
    (_delta_rule.eager_token_step: one token from a state, plain tensors, no gradient),
    without this module's checks of keywords in between, for a caller that passes only
    these arguments (linseq.integrations.transformers): (o in v's dtype, the final state or
    None), the same results as fused_recurrent_kda or fused_recurrent_gated_delta_rule with
    g or gk = g, or None for any call that step does not take."""
    torch = sys.modules.get("torch")
    if initial_state is None or torch is None or torch.compiler.is_compiling():
        return None  # (traced, the functions' blocks are what the graph holds)
    return _delta_rule.eager_token_step(q, k, v, beta, g, initial_state, v.dtype,
                                        output_final_state, scale=None, qk_l2norm=qk_l2norm,
                                        beta_is_logit=False, state_v_first=False)


@compilable
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
    gate = _delta_rule.kda_gate(use_gate_in_kernel, A_log, dt_bias, lower_bound)
    return _delta_rule.delta_rule(
        "recurrent", 64, extra.get("_framework"), q, k, v, beta, g=g, gate=gate, scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        qk_l2norm=use_qk_l2norm_in_kernel, beta_logit=use_beta_sigmoid_in_kernel,
        neg_eigval=allow_neg_eigval, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
        out_like=v)


def fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None,
                            scale=None, output_final_state=False, inplace_final_state=True,
                            state_v_first=False, cu_seqlens=None, ssm_state_indices=None,
                            num_accepted_tokens=None, use_qk_l2norm_in_kernel=False,
                            use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                            allow_neg_eigval=False, lower_bound=None, out=None, **kwargs):
    """fla-core's `fused_recurrent_kda_fwd` (fla.ops.kda.fused_recurrent), the forward that
    fla's fused_recurrent_kda runs and serving code calls for decode: its positional order
    (initial_state before scale), defaults and results. Unlike fla's, differentiable (what
    it writes in place follows torch's rules for in-place writes).

    The arguments of fused_recurrent_kda, and:
    - inplace_final_state (default True): the final state is written into initial_state
      (required then, any floating dtype and strides) and initial_state is returned as the
      final state; False: a new float32 state when output_final_state, else None.
    - ssm_state_indices: continuous batching over a pool of states, initial_state
      [R,HV,K,V] ([R,HV,V,K] with state_v_first). [N]: sequence n starts from row
      ssm_state_indices[n]; [N,S]: from row ssm_state_indices[n, i], i = 0 or
      num_accepted_tokens[n] - 1 (speculative decoding), and with inplace_final_state the
      state after its token t is written to row ssm_state_indices[n, t] (with [N] only the
      one row: sequences of one token, as in decode). Without inplace_final_state the state
      after every token is returned, one row per token ([B*T,...]: N rows in decode). A
      sequence whose starting row is negative is padding: its output is 0 and no row is
      read or written (fla's kernel reads out of bounds there); a negative row for a later
      token is not written. Rows out of range, and a row written twice by one step, are
      refused by name, before anything is written.
    - out: a tensor of v's shape and a floating dtype that receives the output, returned.
    Returns (o in v's dtype (or out), final_state). NumPy arrays are written in place like
    tensors; JAX arrays cannot be, so with JAX only inplace_final_state=False, out=None and
    no ssm_state_indices are taken.
    """
    extra = _keywords("fused_recurrent_kda_fwd", kwargs, _UNUSED_KEYWORDS)
    state_v_first = _state_layout(state_v_first, kwargs)
    _check_common(extra.get("cp_context"), allow_neg_eigval, use_beta_sigmoid_in_kernel)
    framework = extra.get("_framework") or framework_of(
        [q, k, v, g, beta, initial_state, out, A_log, dt_bias])
    if framework == "jax" and (inplace_final_state or out is not None
                               or ssm_state_indices is not None):
        raise TypeError("fused_recurrent_kda_fwd: JAX arrays cannot be written in place; "
                        "pass inplace_final_state=False, out=None and no ssm_state_indices "
                        "(or call fused_recurrent_kda / linseq.jax.kda_decode)")
    if inplace_final_state:
        if initial_state is None:
            raise ValueError("initial_state: required with inplace_final_state=True (fla's "
                             "default): the final state is written into it")
        _floating(initial_state, "initial_state", "it receives the final state")
    if out is not None:
        _floating(out, "out", "it receives the output")
        if tuple(np.shape(out)) != tuple(np.shape(v)):
            raise ValueError(f"out: expected v's shape {list(np.shape(v))}, got "
                             f"{list(np.shape(out))}")
    gate = _delta_rule.kda_gate(use_gate_in_kernel, A_log, dt_bias, lower_bound)
    options = dict(gate=gate, scale=scale, qk_l2norm=use_qk_l2norm_in_kernel,
                   beta_logit=use_beta_sigmoid_in_kernel, neg_eigval=allow_neg_eigval,
                   state_v_first=state_v_first)
    frame = _delta_rule._Frame(framework)
    if ssm_state_indices is None:
        o, ht = _delta_rule.delta_rule(
            "recurrent", 64, framework, q, k, v, beta, g=g, initial_state=initial_state,
            output_final_state=bool(output_final_state or inplace_final_state),
            cu_seqlens=cu_seqlens, out_like=v, **options)
        if inplace_final_state:
            frame.assign(initial_state, slice(None), ht)
            ht = initial_state
    else:
        o, ht = _pool_steps(frame, q, k, v, g, beta, initial_state, output_final_state,
                            inplace_final_state, cu_seqlens, ssm_state_indices,
                            num_accepted_tokens, options)
    if out is not None:
        frame.assign(out, slice(None), o)
        o = out
    return o, ht


def _floating(x, name, why):
    dtype = getattr(x, "dtype", None)
    if dtype is None or not _floating_dtype(dtype):
        raise TypeError(f"{name}: expected an array of a floating dtype ({why}), got "
                        f"{dtype if dtype is not None else type(x).__name__}")


def _int_rows(x, name):
    arr = np.asarray(x.cpu() if hasattr(x, "cpu") else x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got {arr.dtype}")
    return arr.astype(np.int64)


def _sequences(q, cu_seqlens):
    """[(first token, length)] over q's B*T tokens taken as one row."""
    B, T = tuple(np.shape(q))[:2]
    if cu_seqlens is None:
        return [(b * T, T) for b in range(B)]
    cu = _int_rows(cu_seqlens, "cu_seqlens").reshape(-1)
    if B != 1 or len(cu) < 2 or cu[0] != 0 or cu[-1] != T or np.any(np.diff(cu) < 0):
        raise ValueError(f"cu_seqlens: expected N+1 nondecreasing offsets from 0 to T = {T} "
                         f"with B = 1, got {cu.tolist()} with B = {B}")
    return [(int(a), int(b - a)) for a, b in zip(cu[:-1], cu[1:])]


def _pool_steps(frame, q, k, v, g, beta, pool, output_final_state, inplace, cu_seqlens,
                indices, accepted, options):
    """fused_recurrent_kda_fwd with ssm_state_indices: the live sequences advance one token
    per step, each step one recurrent call of M one-token requests from their states; the
    rows are written once every step has run."""
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        shape = tuple(np.shape(x))
        if len(shape) < 3 or shape[:2] != tuple(np.shape(q))[:2]:
            raise ValueError(f"{name}: expected shape [B,T,...] with [B,T] = "
                             f"{list(np.shape(q))[:2]} from q, got {list(shape)}")
    if len(np.shape(q)) != 4 or len(np.shape(v)) != 4:
        raise ValueError(f"q, v: expected [B,T,H,K] and [B,T,HV,V], got {list(np.shape(q))} "
                         f"and {list(np.shape(v))}")
    seqs = _sequences(q, cu_seqlens)
    N, rows_of = len(seqs), _int_rows(indices, "ssm_state_indices")
    if rows_of.ndim not in (1, 2) or rows_of.shape[0] != N:
        raise ValueError(f"ssm_state_indices: expected [N] or [N,S] with N = {N} sequences, "
                         f"got {list(rows_of.shape)}")
    rows_of = rows_of.reshape(N, -1)
    S = rows_of.shape[1]
    first = np.zeros(N, np.int64)
    if accepted is not None:
        first = _int_rows(accepted, "num_accepted_tokens").reshape(-1) - 1
        if first.shape != (N,) or np.any((first < 0) | (first >= S)):
            raise ValueError(f"num_accepted_tokens: expected [N] = [{N}] counts in 1..{S} "
                             f"(the columns of ssm_state_indices), got {(first + 1).tolist()}")
    start = rows_of[np.arange(N), first]
    R = None if pool is None else int(np.shape(pool)[0])
    live = [n for n in range(N) if start[n] >= 0 and seqs[n][1] > 0]
    _check_rows(start[live], R, "the starting rows", writes=False)
    if inplace:
        too_long = [n for n in live if seqs[n][1] > S]
        if too_long:
            raise ValueError(f"ssm_state_indices: [N,S] with S = {S} slots per sequence; "
                             f"sequence {too_long[0]} has {seqs[too_long[0]][1]} tokens, and "
                             "the state after each is written to its slot (pass [N,T])")
    tokens = int(np.prod(np.shape(q)[:2]))
    flat = {n: (None if x is None else x.reshape((tokens,) + tuple(np.shape(x)[2:])))
            for n, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))}
    per_state = _state_shape(q, v, options)
    state = (frame.zeros((len(live),) + per_state) if pool is None
             else frame.f32(frame.take(pool, np.array(start[live], np.int64))))
    pos = {n: i for i, n in enumerate(live)}
    o = frame.zeros_like(flat["v"])
    final = frame.zeros((tokens,) + per_state) if output_final_state and not inplace else None
    writes = []
    for t in range(max([seqs[n][1] for n in live], default=0)):
        step = [n for n in live if seqs[n][1] > t]
        at = np.array([pos[n] for n in step], np.int64)
        tok = np.array([seqs[n][0] + t for n in step], np.int64)
        x = {n: (None if a is None else frame.take(a, tok)[:, None]) for n, a in flat.items()}
        o_t, h_t = _delta_rule.delta_rule(
            "recurrent", 64, frame.name, x["q"], x["k"], x["v"], x["beta"], g=x["g"],
            initial_state=frame.take(state, at), output_final_state=True, cu_seqlens=None,
            out_like=v, **options)
        frame.assign(o, tok, o_t[:, 0])
        frame.assign(state, at, h_t)
        if inplace:
            slots = rows_of[step, t]
            keep = slots >= 0
            _check_rows(slots[keep], R, f"the rows written after token {t}", writes=True)
            writes.append((slots[keep], frame.take(h_t, np.nonzero(keep)[0])))
        elif final is not None:
            frame.assign(final, tok, h_t)
    o = o.reshape(tuple(np.shape(v)))
    if not inplace:
        return o, final
    for slots, h in writes:
        frame.assign(pool, slots, h)
    return o, pool


def _state_shape(q, v, options):
    K, (HV, V) = np.shape(q)[3], np.shape(v)[2:4]
    return (HV, V, K) if options["state_v_first"] else (HV, K, V)


def _check_rows(rows, R, what, writes):
    if R is None or not len(rows):
        return
    bad = rows[rows >= R]
    if bad.size:
        raise ValueError(f"ssm_state_indices: {what} include row {int(bad[0])}, out of range "
                         f"for initial_state's {R} rows")
    values, counts = np.unique(rows, return_counts=True)
    if writes and np.any(counts > 1):
        raise ValueError(f"ssm_state_indices: {what} name row {int(values[counts > 1][0])} "
                         "twice; each sequence needs its own row")


@compilable
def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False,
                           use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                           chunk_indices=None, cp_context=None, **kwargs):
    """Gated DeltaNet in chunked form, fla-core's `chunk_gated_delta_rule`.

    g [B,T,HV]: one log decay per head (None: no decay), or with use_gate_in_kernel=True
    (keyword) the raw gate, -exp(A_log) * softplus(g + dt_bias) with A_log and dt_bias of HV
    elements. Keywords: use_gate_in_kernel, A_log, dt_bias, chunk_size (16, 32, 64 or 128),
    transpose_state_layout (deprecated), bf16_products (linseq's, as chunk_kda's). The rest
    as chunk_kda. Returns (o in q's dtype, final_state float32 or None).
    """
    extra = _keywords("chunk_gated_delta_rule", kwargs,
                      ("use_gate_in_kernel", "A_log", "dt_bias", "chunk_size",
                       "safe_gate", "disable_recompute", "bf16_products"))
    state_v_first = _state_layout(state_v_first, kwargs)
    _check_common(None, allow_neg_eigval, use_beta_sigmoid_in_kernel)
    gate = _delta_rule.gdn_gate(extra.get("use_gate_in_kernel", False), extra.get("A_log"),
                     extra.get("dt_bias"), g)
    return _chunked(cp_context, extra, q, k, v, g, beta, gate=gate, scale=scale,
                    initial_state=initial_state, output_final_state=output_final_state,
                    qk_l2norm=use_qk_l2norm_in_kernel, beta_logit=use_beta_sigmoid_in_kernel,
                    neg_eigval=allow_neg_eigval, state_v_first=state_v_first,
                    cu_seqlens=cu_seqlens)


@compilable
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
    gate = _delta_rule.gdn_gate(use_gate_in_kernel, A_log, dt_bias, g)
    return _delta_rule.delta_rule(
        "recurrent", 64, extra.get("_framework"), q, k, v, beta, g=g, gk=gk, gv=gv, gate=gate,
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        qk_l2norm=use_qk_l2norm_in_kernel, beta_logit=use_beta_sigmoid_in_kernel,
        neg_eigval=allow_neg_eigval, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
        out_like=v)


chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule


@compilable
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


@compilable
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
    if output_dtype is not None and not _floating_dtype(output_dtype):
        raise TypeError(f"output_dtype: expected None or a floating-point dtype (the gate is "
                        f"a log decay), got {output_dtype}")
    H = np.shape(g)[2]
    A_log = _delta_rule.heads_vector(A_log, H)
    if dt_bias is not None and int(np.prod(np.shape(dt_bias))) == bias_size:
        dt_bias = dt_bias.reshape((bias_size,))
    arrays = dict(g_raw=g, A_log=A_log, dt_bias=dt_bias)
    out = backend_for(arrays.values(), framework).run(
        _opspec.KDA_GATE, arrays, None, GateOptions(lower_bound=lower_bound))[0]
    out = out.reshape(shape)
    if output_dtype is None:
        return out
    return out.to(output_dtype) if framework == "torch" else out.astype(output_dtype)


def _floating_dtype(dtype):
    """True for a real floating-point dtype of any framework (torch.float16, np.float32,
    jnp.bfloat16, "float64"...)."""
    if hasattr(dtype, "is_floating_point"):   # torch.dtype
        return bool(dtype.is_floating_point)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return False
    return dt.kind == "f" or dt.name == "bfloat16"


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


# ------------------------------------------------------------------------------------------
# Context parallelism: linseq.distributed with fla's arguments
# ------------------------------------------------------------------------------------------

def _context_parallel(cp, q, k, v, g, beta, *, gate, scale, initial_state, output_final_state,
                      qk_l2norm, beta_logit, neg_eigval, state_v_first, cu_seqlens,
                      chunk_size):
    """This rank's tokens through linseq.distributed.chunk_kda (torch tensors, B == 1, the
    sequences from the context): o in q's dtype, the final state [N,HV,K,V] float32 with the
    rows of the sequences ending on this rank ([N,HV,V,K] with state_v_first) or None."""
    import torch  # only here: importing linseq never imports torch

    from . import distributed
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
    A_log = _delta_rule.heads_vector(A_log, HV) if HV is not None else A_log
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


