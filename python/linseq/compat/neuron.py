"""The function names of the Trainium KDA package (kda-neuron-kernels, NKI kernels), with its
arguments and return values, on linseq's kernels.

    from kda_neuron_kernels import kda_chunk_step_exact, kda_recurrent_fwd_state
    ->  from linseq.compat.neuron import kda_chunk_step_exact, kda_recurrent_fwd_state

The package's contract, kept here: one (batch, head) slice per call, tokens along the rows.
    query   (S, dk)  already L2-normalised and multiplied by the softmax scale
                     (no normalisation or scaling happens here)
    key     (S, dk)  already L2-normalised
    value   (S, dv)
    g       (S, dk)  the activated per-channel log decay of each token (<= 0), not
                     cumulative; kda_chunk_step takes the within-chunk cumulative sum instead
    beta    the per-token write gate: (S, 1) for the chunk kernels, (S, dk) with one value
            repeated along each row for the recurrent ones
    state   (dk, dv) the recurrent state, keys along the rows
and the recurrence of every name: for each token, state = exp(g_t)[:, None] * state (each
key row decays by its own channel), u = beta_t * (v_t - k_t @ state),
state = state + outer(k_t, u), out_t = q_t @ state.
Outputs are in query's dtype, states float32.

What differs from the package, every difference a superset:
- any dk and dv (the package needs dk = dv = 128), any S or chunk length (the package
  needs 128-token chunks), and any leading dimensions: (..., S, dk) runs every leading
  index as its own (batch, head) slice, so (B, H, S, dk) is one call instead of B*H;
- beta also as (S,) or (S, 1) everywhere; a (S, dk) beta whose rows are not constant is
  refused (ValueError naming beta), since linseq's write gate is one value per token;
- NumPy arrays in give NumPy arrays out, PyTorch tensors give PyTorch tensors, and with
  PyTorch every function is differentiable (loss.backward() reaches linseq's C backward);
- float16, bfloat16, float64 and integer inputs are taken (computed in float32);
- kda_chunk_step is exact: it recovers each token's decay from g_cumsum and runs the exact
  per-channel algorithm, where the package's version approximates the decay inside a chunk
  by its mean over the channels.

Which contracts come from where: the kernel files of kda_recurrent_fwd,
kda_recurrent_fwd_state and kda_chunk_step_exact, and the package's description of
kda_chunk_step, fix those names' arguments. For the batched, multi-head, backward and
autograd names (kda_chunk_step_exact_multihead, kda_decode_batch, kda_chunk_step_exact_bwd,
kda_recurrent, kda_chunked, kda_chunked_fused) the contracts below follow the same
conventions (a leading head or batch dimension, the same argument order), documented with
each function.

Every function is a thin layer over linseq's KDA (linseq.api / linseq.ops): no second
implementation of the recurrence.
"""

import numpy as np

from .. import ops
from .._arrays import as_f32, framework_of, refuse_dtype, wrap_like
from .._backends import backend_for
from .._opspec import KDA
from .._options import KdaOptions

_TILE = 64  # the chunked algorithm is exact: its tile sets the speed, not the result

__all__ = ["kda_recurrent_fwd", "kda_recurrent_fwd_state", "kda_chunk_step",
           "kda_chunk_step_exact", "kda_chunk_step_exact_multihead", "kda_decode_batch",
           "kda_chunk_step_exact_bwd", "kda_recurrent", "kda_chunked", "kda_chunked_fused"]


# ------------------------------------------------------------------------------------------
# Shapes: (..., S, d) slices onto linseq's [B, T, H=1, d]
# ------------------------------------------------------------------------------------------

def _array(x, name):
    """x itself when it is an array of any framework, else x as a NumPy array; a dtype
    linseq refuses is refused here, under the caller's name for the argument."""
    if x is None:
        raise ValueError(f"{name}: required, got None")
    if not (hasattr(x, "shape") and hasattr(x, "reshape")):
        try:
            x = np.asarray(x)
        except Exception as exc:  # noqa: BLE001 - anything unconvertible is not an array
            raise TypeError(f"{name}: expected an array, got {type(x).__name__}") from exc
    if framework_of([x]) == "torch":
        if x.is_complex() or str(x.dtype) == "torch.bool":
            refuse_dtype(name, x.dtype, x.is_complex())
        return x
    dtype = np.dtype(x.dtype)
    if dtype.kind not in "fiu" and dtype.name != "bfloat16":
        refuse_dtype(name, dtype, dtype.kind == "c")
    return x


def _expect(x, name, shape, what):
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {what} = {tuple(shape)}, got "
                         f"{tuple(x.shape)}")


def _token_beta(beta, name, lead, S, dk):
    """beta as (..., S): from (..., S), (..., S, 1), or (..., S, dk) with constant rows."""
    shape = tuple(beta.shape)
    if shape == (*lead, S):
        return beta
    if shape == (*lead, S, 1):
        return beta[..., 0]
    if shape == (*lead, S, dk):
        _check_constant_rows(beta, name)
        return beta[..., 0]
    raise ValueError(f"{name}: expected shape (..., S), (..., S, 1) or (..., S, dk) with "
                     f"(..., S) = {(*lead, S)} and dk = {dk}, got {shape}")


def _check_constant_rows(beta, name):
    values = as_f32(beta, name)
    rows = np.nonzero(np.any(values != values[..., :1], axis=-1))
    if rows[0].size:
        where = tuple(int(r[0]) for r in rows)
        raise ValueError(f"{name}: a (..., S, dk) write gate must repeat one value along each "
                         f"row (one gate per token); row {where} does not")


class _Slices:
    """The checked arrays of one call, viewed as linseq's [B, T, 1, d] problem."""

    def __init__(self, names, query, key, value, g, beta, state):
        nq, nk, nv, ng, nb, ns = names
        q, k, v, g = (_array(x, n) for x, n in ((query, nq), (key, nk), (value, nv), (g, ng)))
        if len(q.shape) < 2:
            raise ValueError(f"{nq}: expected shape (..., S, dk), got {tuple(q.shape)}")
        *lead, S, dk = q.shape
        self.lead, self.S, self.dk = tuple(lead), S, dk
        _expect(k, nk, q.shape, f"(..., S, dk) like {nq}")
        if len(v.shape) != len(q.shape) or tuple(v.shape[:-1]) != (*lead, S):
            raise ValueError(f"{nv}: expected shape (..., S, dv) with (..., S) = "
                             f"{(*lead, S)} from {nq}, got {tuple(v.shape)}")
        self.dv = v.shape[-1]
        _expect(g, ng, q.shape, f"(..., S, dk) like {nq}")
        beta = _array(beta, nb)
        self.beta_shape = tuple(beta.shape)
        b = _token_beta(beta, nb, self.lead, S, dk)
        if state is not None:
            state = _array(state, ns)
            _expect(state, ns, (*lead, dk, self.dv), "(..., dk, dv)")
        self.query = q
        B = int(np.prod(self.lead, dtype=np.int64)) if self.lead else 1
        self.B = B
        self.arrays = dict(q=q.reshape(B, S, 1, dk), k=k.reshape(B, S, 1, dk),
                           v=v.reshape(B, S, 1, self.dv), beta=b.reshape(B, S, 1),
                           g=g.reshape(B, S, 1, dk), A_log=None, dt_bias=None,
                           h0=None if state is None else state.reshape(B, 1, dk, self.dv))

    def out(self, o):
        return o.reshape(*self.lead, self.S, self.dv)

    def state(self, h):
        return h.reshape(*self.lead, self.dk, self.dv)


_FLA_NAMES = ("query", "key", "value", "g", "beta", "initial_state")


def _kda(names, query, key, value, g, beta, state, mode):
    """(out (..., S, dv) in query's dtype, final state (..., dk, dv) float32), in the
    framework of the inputs; differentiable with PyTorch and JAX."""
    s = _Slices(names, query, key, value, g, beta, state)
    backend = backend_for(s.arrays.values())
    o, h = backend.run(KDA, s.arrays, None, KdaOptions(scale=1.0, mode=mode, chunk_size=_TILE))
    return backend.cast(s.out(o), s.query), s.state(h)


# ------------------------------------------------------------------------------------------
# The raw kernels' names
# ------------------------------------------------------------------------------------------

def kda_recurrent_fwd(query, key, value, g_in, beta_in):
    """KDA token by token from a zero state, for one (batch, head) slice.

    query (S, dk) normalised and scaled; key (S, dk) normalised; value (S, dv); g_in
    (S, dk) per-channel log decay; beta_in (S, dk) with the token's write gate repeated
    along the row (or (S, 1), (S,)). Returns the output (S, dv) in query's dtype.
    """
    names = ("query", "key", "value", "g_in", "beta_in", "state")
    return _kda(names, query, key, value, g_in, beta_in, None, "recurrent")[0]


def kda_recurrent_fwd_state(query, key, value, g_in, beta_in):
    """kda_recurrent_fwd that also hands back the final state, for the hand-off from
    prefill to decode. Returns (output (S, dv) in query's dtype, final_state (dk, dv)
    float32)."""
    names = ("query", "key", "value", "g_in", "beta_in", "state")
    return _kda(names, query, key, value, g_in, beta_in, None, "recurrent")


def kda_chunk_step(q, k, v, beta_broadcast, g_cumsum, g_last, state_in):
    """One prefill chunk given the state before it, decay given as running sums.

    q (C, dk) normalised and scaled; k (C, dk) normalised; v (C, dv); beta_broadcast the
    per-token write gate, (C, dk) repeated along each row (or (C, 1), (C,)); g_cumsum
    (C, dk) the running sum over the chunk's tokens of the per-channel log decay (row t
    holds g_0 + ... + g_t); g_last its last row, as the package passes it, g_cumsum[-1:, :]
    broadcast to (C, dk) (every row the same), or (1, dk) or (dk,) (checked against
    g_cumsum); state_in (dk, dv) (None: zeros).

    Computed exactly: each token's decay is recovered as the difference of consecutive rows
    of g_cumsum and the chunk runs linseq's exact per-channel algorithm. (The package's
    kernel approximates the decay inside the chunk by its mean over the channels, which
    departs from KDA as soon as the channels decay differently.)
    Returns (chunk_out (C, dv) in q's dtype, state_out (dk, dv) float32).
    """
    g_cumsum = _array(g_cumsum, "g_cumsum")
    _check_g_last(g_cumsum, _array(g_last, "g_last"))
    names = ("q", "k", "v", "g_cumsum", "beta_broadcast", "state_in")
    g = _token_decay(g_cumsum)
    return _kda(names, q, k, v, g, beta_broadcast, state_in, "chunked")


def _check_g_last(g_cumsum, g_last):
    if len(g_cumsum.shape) < 2:
        raise ValueError(f"g_cumsum: expected shape (..., C, dk), got {tuple(g_cumsum.shape)}")
    lead, C, dk = tuple(g_cumsum.shape[:-2]), g_cumsum.shape[-2], g_cumsum.shape[-1]
    shape = tuple(g_last.shape)
    if shape not in ((*lead, C, dk), (*lead, 1, dk), (*lead, dk)):
        raise ValueError(f"g_last: expected shape (..., C, dk) (the last row of g_cumsum "
                         f"broadcast to every row), (..., 1, dk) or (..., dk) with (...) = "
                         f"{lead}, C = {C} and dk = {dk}, got {shape}")
    if C == 0:
        return
    last = as_f32(g_cumsum, "g_cumsum")[..., -1:, :].astype(np.float64)
    given = as_f32(g_last, "g_last").astype(np.float64)
    given = given.reshape((*lead, 1, dk)) if shape == (*lead, dk) else given
    if not np.all(np.abs(given - last) <= 1e-5 * np.maximum(1.0, np.abs(last))):
        raise ValueError("g_last: every row must equal the last row of g_cumsum (the "
                         "chunk's total log decay per channel)")


def _token_decay(g_cumsum):
    """Each token's log decay from the running sums: g_0 = G_0, g_t = G_t - G_(t-1)
    (NumPy in float64, where the difference of two float32 values is exact)."""
    if framework_of([g_cumsum]) == "numpy":
        gc = np.asarray(g_cumsum, dtype=np.float64)
        return np.diff(gc, axis=-2, prepend=np.zeros_like(gc[..., :1, :]))
    step = g_cumsum[..., 1:, :] - g_cumsum[..., :-1, :]
    if framework_of([g_cumsum]) == "torch":
        import torch
        return torch.cat([g_cumsum[..., :1, :], step], dim=-2)
    import jax.numpy as jnp
    return jnp.concatenate([g_cumsum[..., :1, :], step], axis=-2)


def kda_chunk_step_exact(query, key, value, beta, g, state_in):
    """One prefill chunk given the state before it, exact per-channel decay.

    query (C, dk) normalised and scaled; key (C, dk) normalised; value (C, dv); beta (C, 1)
    the per-token write gate (or (C,), or (C, dk) with constant rows); g (C, dk) each
    token's per-channel log decay, not cumulative; state_in (dk, dv) (None: zeros). C is
    any length.
    Returns (chunk_out (C, dv) in query's dtype, state_out (dk, dv) float32).
    """
    names = ("query", "key", "value", "g", "beta", "state_in")
    return _kda(names, query, key, value, g, beta, state_in, "chunked")


def kda_chunk_step_exact_multihead(query, key, value, beta, g, state_in):
    """kda_chunk_step_exact for H heads in one call: query, key, g (H, C, dk); value
    (H, C, dv); beta (H, C, 1) (or (H, C)); state_in (H, dk, dv). Any further leading
    dimensions are kept. Returns (chunk_out (H, C, dv) in query's dtype, state_out
    (H, dk, dv) float32)."""
    return kda_chunk_step_exact(query, key, value, beta, g, state_in)


def kda_decode_batch(query, key, value, g, beta, state):
    """One decode token for N (batch, head) rows, each with its own state.

    query, key, g (N, dk); value (N, dv); beta (N, 1) or (N,) (or (N, dk) with constant
    rows); state (N, dk, dv) (None: zeros), left untouched.
    Returns (out (N, dv) in query's dtype, new_state (N, dk, dv) float32).
    """
    names = ("query", "key", "value", "g", "beta", "state")
    q, k, v, gg = (_array(x, n) for x, n in zip((query, key, value, g), names))
    b = _array(beta, "beta")
    b = b[..., None, :] if len(b.shape) == len(q.shape) else b[..., None]
    out, new_state = _kda(names, q[..., None, :], k[..., None, :], v[..., None, :],
                          gg[..., None, :], b, state, "recurrent")
    return out[..., 0, :], new_state


def kda_chunk_step_exact_bwd(query, key, value, beta, g, state_in, d_chunk_out,
                             d_state_out=None):
    """The backward of kda_chunk_step_exact: the gradients of
    sum(chunk_out * d_chunk_out) + sum(state_out * d_state_out) (d_state_out None: 0).

    Arguments as kda_chunk_step_exact, plus d_chunk_out (C, dv) and d_state_out (dk, dv).
    Returns (d_query, d_key, d_value, d_beta, d_g, d_state_in), each in its input's shape
    (d_beta: a (C, dk) beta's gradient lands in its first column, the one that is read),
    float32, NumPy for NumPy inputs and PyTorch for PyTorch ones.
    """
    framework = framework_of([query, key, value, beta, g, state_in])
    names = ("query", "key", "value", "g", "beta", "state_in")
    s = _Slices(names, *(None if x is None else as_f32(x, n) for x, n in zip(
        (query, key, value, g, beta, state_in), names)))
    a = s.arrays
    inputs = ops.KdaInputs(a["q"], a["k"], a["v"], a["beta"], a["g"], h0=a["h0"], scale=1.0)
    d_o = as_f32(d_chunk_out, "d_chunk_out", (*s.lead, s.S, s.dv), "(..., C, dv)")
    d_h = None if d_state_out is None else as_f32(
        d_state_out, "d_state_out", (*s.lead, s.dk, s.dv), "(..., dk, dv)")
    grads = ops.kda_backward(inputs, d_o.reshape(s.B, s.S, 1, s.dv),
                             None if d_h is None else d_h.reshape(s.B, 1, s.dk, s.dv),
                             mode="chunked", chunk_size=_TILE)
    tokens = (*s.lead, s.S)
    out = (grads["dq"].reshape(*tokens, s.dk), grads["dk"].reshape(*tokens, s.dk),
           grads["dv"].reshape(*tokens, s.dv), _beta_grad(grads["dbeta"], tokens, s),
           grads["dg"].reshape(*tokens, s.dk),
           None if state_in is None else s.state(grads["dh0"]))
    return tuple(wrap_like(framework, x) for x in out)


def _beta_grad(dbeta, tokens, s):
    dbeta = dbeta.reshape(tokens)
    if s.beta_shape == tokens:
        return dbeta
    full = np.zeros(s.beta_shape, np.float32)
    full[..., 0] = dbeta
    return full


# ------------------------------------------------------------------------------------------
# The differentiable names (torch.autograd with PyTorch tensors)
# ------------------------------------------------------------------------------------------

def kda_recurrent(query, key, value, g, beta, initial_state=None):
    """Differentiable KDA token by token from any initial state.

    query (..., S, dk) normalised and scaled; key (..., S, dk) normalised; value
    (..., S, dv); g (..., S, dk) per-channel log decay; beta (..., S) or (..., S, 1) (or
    (..., S, dk) with constant rows); initial_state (..., dk, dv) or None (zeros).
    Returns (output (..., S, dv) in query's dtype, final_state (..., dk, dv) float32);
    with PyTorch tensors loss.backward() fills every input's gradient, initial_state's too.
    """
    return _kda(_FLA_NAMES, query, key, value, g, beta, initial_state, "recurrent")


def kda_chunked(query, key, value, g, beta, initial_state=None):
    """kda_recurrent computed chunk by chunk (exact, any S: no multiple of a chunk length
    needed), with the same arguments, results and gradients."""
    return _kda(_FLA_NAMES, query, key, value, g, beta, initial_state, "chunked")


def kda_chunked_fused(query, key, value, g, beta, initial_state=None):
    """kda_chunked under the package's name for its fused-kernel variant: linseq's chunked
    kernel is one fused pass already, so the two are the same function."""
    return _kda(_FLA_NAMES, query, key, value, g, beta, initial_state, "chunked")
