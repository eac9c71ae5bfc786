"""causal-conv1d's functions, names, argument order, defaults and return values, on linseq's
causal conv1d kernel (PyTorch CPU tensors).

    causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                     return_final_states=False, final_states_out=None, activation=None)
    causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                         cache_seqlens=None, conv_state_indices=None)
    causal_conv1d_varlen_states(x, cu_seqlens, state_len)

Layout as in causal-conv1d: x [batch, dim, seqlen], channel-first or channel-last strides
(a transposed [batch, seqlen, dim] tensor); weight [dim, width]; states [batch, dim, W-1].
Inputs of any real dtype are computed in float32 (as causal-conv1d accumulates) and the
outputs come back in x's dtype, in x's memory layout. causal_conv1d_fn is differentiable
(x, weight, bias, initial_states), through linseq's C backward.

Where linseq is more permissive than causal-conv1d (documented, never silently different):
any width >= 1 (causal-conv1d: 2 to 4); initial_states, return_final_states and seq_idx with
channel-first x too (causal-conv1d: channel-last only); conv_state and x of different dtypes.

The kernel calls sit in the private functions _conv and _conv_decode: the only places that
change when linseq's C API takes the [batch, dim, seqlen] strides and a decode over a pool of
circular state rows directly.
"""

import torch

from .._backends import backend_for
from ..api import ConvOptions

_ACTIVATIONS = (None, "silu", "swish")


def _activation(activation):
    """causal-conv1d's activation names, as linseq's ("silu" for both spellings)."""
    if activation not in _ACTIVATIONS:
        # NotImplementedError, as causal-conv1d raises, so callers that catch it still do
        raise NotImplementedError(f"activation: expected None, 'silu' or 'swish', got "
                                  f"{activation!r}")
    return None if activation is None else "silu"


def _tensor(value, name, ndim, what):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor {what}, got {type(value).__name__}")
    if value.dim() != ndim:
        raise ValueError(f"{name}: expected {what}, got shape {list(value.shape)}")
    return value


def _weight(weight, dim):
    """[dim, width] (or nn.Conv1d's [dim, 1, width]) as [dim, width]."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight: expected a torch.Tensor [dim, width], got "
                        f"{type(weight).__name__}")
    if weight.dim() == 3 and weight.shape[1] == 1:
        weight = weight[:, 0]
    if weight.dim() != 2 or weight.shape[0] != dim or weight.shape[1] < 1:
        raise ValueError(f"weight: expected shape [dim, width] with dim = {dim}, got "
                         f"{list(weight.shape)}")
    return weight


def _is_channel_last(x):
    """True when x [b, d, l] is a transposed [b, l, d] tensor (unit stride along d)."""
    return x.stride(1) < x.stride(2)


def _in_layout_of(y_bld, like_bdl, dtype):
    """y [b, l, d] as [b, d, l] in `like`'s memory layout (channel-last or -first) and dtype,
    as causal-conv1d allocates its outputs (empty_like)."""
    y = y_bld.transpose(1, 2)
    if not _is_channel_last(like_bdl):
        y = y.contiguous()
    return y.to(dtype)


# ------------------------------------------------------------------------------------------
# The kernel seam
# ------------------------------------------------------------------------------------------

def _conv(x_bld, weight, bias, initial_states, activation, cu_seqlens=None):
    """linseq's conv forward with autograd: x [b, l, d] float32 of any strides (a channel-last
    view reaches the kernel as it is, a channel-first one is copied once), weight [d, W],
    bias [d], initial_states [n, d, W-1] (oldest first). Returns (y [b, l, d], the final
    states [n, d, W-1]), float32."""
    arrays = dict(x=x_bld, weight=weight, bias=bias, conv_state=initial_states)
    return backend_for((), "torch").conv1d(arrays, cu_seqlens,
                                           ConvOptions(activation=activation))


def _conv_decode(x_bld, conv_state, weight, bias, activation, cache_seqlens, rows):
    """One decode call against a pool of state rows, updated in place.

    x [b, l, d]; conv_state [R, d, state_len] (state_len >= W-1), any dtype and strides;
    rows [b] int64 (negative: a padding request, output 0, no row touched); cache_seqlens
    None (each row holds the last state_len inputs, oldest first) or [b] int64 (each row is a
    circular buffer whose next write position is cache_seqlens % state_len). Returns
    y [b, l, d] float32. Today: the window of each valid row is gathered here, the kernel
    convolves, and the new inputs are scattered back."""
    batch, seqlen, dim = x_bld.shape
    width = weight.shape[1]
    state_len = conv_state.shape[2]
    y = torch.zeros(batch, seqlen, dim, dtype=torch.float32)
    valid = rows >= 0
    if not bool(valid.any()):
        return y
    vrows, xv = rows[valid], x_bld[valid]
    rows_state = conv_state[vrows]                               # [n, d, state_len]
    if state_len == 0:                                           # width 1: no history
        window = updated = rows_state
    elif cache_seqlens is None:
        window = rows_state[:, :, state_len - (width - 1):]
        updated = torch.cat([rows_state, xv.transpose(1, 2).to(conv_state.dtype)],
                            dim=2)[:, :, -state_len:]
    else:
        start = cache_seqlens[valid][:, None]
        read = torch.remainder(start - (width - 1) + torch.arange(width - 1), state_len)
        window = rows_state.gather(2, read[:, None, :].expand(-1, dim, -1))
        write = torch.remainder(start + torch.arange(seqlen), state_len)
        updated = rows_state.scatter(2, write[:, None, :].expand(-1, dim, -1),
                                     xv.transpose(1, 2).to(conv_state.dtype))
    yv, _ = _conv(xv.float(), weight.float(), None if bias is None else bias.float(),
                  window.float().contiguous(), activation)
    y[valid] = yv
    conv_state[vrows] = updated
    return y


# ------------------------------------------------------------------------------------------
# causal_conv1d_fn
# ------------------------------------------------------------------------------------------

def _seq_idx_offsets(seq_idx, batch, seqlen, width):
    """The packed-sequence offsets over the flattened [batch * seqlen] tokens that give
    causal-conv1d's seq_idx rule (a tap reads a token only when both carry the same seq_idx),
    and the mask of tokens with seq_idx >= 0 (the others are padding: output 0).

    Each run of equal seq_idx in a row becomes one sequence; refused (ValueError) is the one
    case a run cannot express: an index that reappears within width-1 tokens after another."""
    if not isinstance(seq_idx, torch.Tensor) or seq_idx.is_floating_point() or \
            seq_idx.is_complex() or seq_idx.dtype == torch.bool:
        raise TypeError("seq_idx: expected an integer torch.Tensor [batch, seqlen]")
    if tuple(seq_idx.shape) != (batch, seqlen):
        raise ValueError(f"seq_idx: expected shape [batch, seqlen] = [{batch}, {seqlen}], got "
                         f"{list(seq_idx.shape)}")
    s = seq_idx.to(torch.int64)
    starts = torch.ones(batch, seqlen, dtype=torch.bool)
    starts[:, 1:] = s[:, 1:] != s[:, :-1]
    run = torch.cumsum(starts.reshape(-1).to(torch.int64), 0).reshape(batch, seqlen)
    for lag in range(1, min(width, seqlen)):
        same_idx = s[:, lag:] == s[:, :-lag]
        same_run = run[:, lag:] == run[:, :-lag]
        if bool((same_idx & ~same_run & (s[:, lag:] >= 0)).any()):
            raise ValueError(f"seq_idx: an index reappears within width-1 = {width - 1} "
                             "tokens after a different one; linseq takes each run of equal "
                             "indices as one sequence (use increasing indices per sequence)")
    first = torch.nonzero(starts.reshape(-1)).reshape(-1)
    offsets = torch.cat([first, torch.tensor([batch * seqlen])])
    return offsets, (s >= 0)


def _final_states(states, x, final_states_out):
    """causal_conv1d_fn's final states, differentiable: a new tensor in x's dtype with
    causal-conv1d's channel-last strides, or the caller's final_states_out, written."""
    batch, dim, _ = x.shape
    want = [batch, dim, states.shape[2]]
    if final_states_out is None:
        return states.to(x.dtype).transpose(1, 2).contiguous().transpose(1, 2)
    if not isinstance(final_states_out, torch.Tensor) or \
            list(final_states_out.shape) != want:
        got = list(getattr(final_states_out, "shape", [type(final_states_out).__name__]))
        raise ValueError(f"final_states_out: expected a tensor [batch, dim, width-1] = {want}, "
                         f"got {got}")
    return final_states_out.copy_(states)


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                     return_final_states=False, final_states_out=None, activation=None):
    """Causal depthwise conv1d, causal-conv1d's `causal_conv1d_fn`.

    x [batch, dim, seqlen] (channel-first or channel-last strides); weight [dim, width];
    bias [dim]; seq_idx [batch, seqlen] integers: a tap reads a token only with the same
    seq_idx, tokens with seq_idx < 0 give 0 (not with initial_states / final states, as in
    causal-conv1d); initial_states [batch, dim, width-1], the inputs before the sequence,
    oldest first; final_states_out: a [batch, dim, width-1] tensor the final states are
    written to; activation None, "silu" or "swish".
    Returns out [batch, dim, seqlen] in x's dtype and layout, or (out, final_states) with
    return_final_states (final_states in x's dtype).
    """
    act = _activation(activation)
    x = _tensor(x, "x", 3, "[batch, dim, seqlen]")
    batch, dim, seqlen = x.shape
    weight = _weight(weight, dim)
    width = weight.shape[1]
    if seq_idx is not None:
        if initial_states is not None:
            raise ValueError("initial_states: must be None with seq_idx (as in causal-conv1d)")
        if return_final_states:
            raise ValueError("return_final_states: not available with seq_idx (as in "
                             "causal-conv1d)")
    if initial_states is not None:
        initial_states = _tensor(initial_states, "initial_states", 3,
                                 f"[batch, dim, width-1] = [{batch}, {dim}, {width - 1}]")
        if tuple(initial_states.shape) != (batch, dim, width - 1):
            raise ValueError(f"initial_states: expected shape [batch, dim, width-1] = "
                             f"[{batch}, {dim}, {width - 1}], got "
                             f"{list(initial_states.shape)}")
        initial_states = initial_states.float()
    x_bld = x.float().transpose(1, 2)
    w, b = weight.float(), None if bias is None else bias.float()
    if seq_idx is None:
        y, states = _conv(x_bld, w, b, initial_states, act)
    else:
        offsets, keep = _seq_idx_offsets(seq_idx, batch, seqlen, width)
        y, _ = _conv(x_bld.reshape(1, batch * seqlen, dim), w, b, None, act, offsets)
        y = y.reshape(batch, seqlen, dim) * keep[..., None]
    out = _in_layout_of(y, x, x.dtype)
    if not return_final_states:
        return out
    return out, _final_states(states, x, final_states_out)


# ------------------------------------------------------------------------------------------
# causal_conv1d_update and causal_conv1d_varlen_states
# ------------------------------------------------------------------------------------------

def _int_vector(value, name, batch):
    if value is None:
        return None
    if not isinstance(value, torch.Tensor) or value.is_floating_point() or \
            value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer torch.Tensor [batch], got "
                        f"{getattr(value, 'dtype', type(value).__name__)}")
    if tuple(value.shape) != (batch,):
        raise ValueError(f"{name}: expected shape [batch] = [{batch}], got "
                         f"{list(value.shape)}")
    return value.to(torch.int64)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                         cache_seqlens=None, conv_state_indices=None):
    """Decode: the next seqlen tokens of each request, causal-conv1d's `causal_conv1d_update`.

    x [batch, dim] or [batch, dim, seqlen]; conv_state [entries, dim, state_len], state_len >=
    width-1, updated in place (entries = batch without conv_state_indices); weight
    [dim, width]; bias [dim]; cache_seqlens [batch] int: each state row is a circular buffer,
    the tokens are written from position cache_seqlens % state_len on; conv_state_indices
    [batch] int: the state row of each request, a negative row marks a padding request (its
    output is 0 and no row changes). Returns out in x's shape and dtype. No autograd (as in
    causal-conv1d).
    """
    act = _activation(activation)
    if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
        raise ValueError(f"x: expected a torch.Tensor [batch, dim] or [batch, dim, seqlen], "
                         f"got {list(getattr(x, 'shape', [type(x).__name__]))}")
    squeeze = x.dim() == 2
    x3 = x[:, :, None] if squeeze else x
    batch, dim, _ = x3.shape
    weight = _weight(weight, dim)
    width = weight.shape[1]
    conv_state = _tensor(conv_state, "conv_state", 3, "[entries, dim, state_len]")
    if conv_state.shape[1] != dim or conv_state.shape[2] < width - 1:
        raise ValueError(f"conv_state: expected shape [entries, dim, state_len] with dim = "
                         f"{dim} and state_len >= width-1 = {width - 1}, got "
                         f"{list(conv_state.shape)}")
    rows = _int_vector(conv_state_indices, "conv_state_indices", batch)
    if rows is None:
        if conv_state.shape[0] != batch:
            raise ValueError(f"conv_state: expected {batch} rows (one per request) without "
                             f"conv_state_indices, got {conv_state.shape[0]}")
        rows = torch.arange(batch)
    elif bool((rows >= conv_state.shape[0]).any()):
        raise ValueError(f"conv_state_indices: rows must be < entries = "
                         f"{conv_state.shape[0]} (negative = padding), got "
                         f"{int(rows.max())}")
    seqlens = _int_vector(cache_seqlens, "cache_seqlens", batch)
    if seqlens is not None and bool((seqlens < 0).any()):
        raise ValueError("cache_seqlens: expected values >= 0")
    if bias is not None and tuple(bias.shape) != (dim,):
        raise ValueError(f"bias: expected shape [dim] = [{dim}], got {list(bias.shape)}")
    with torch.no_grad():
        y = _conv_decode(x3.transpose(1, 2), conv_state, weight, bias, act, seqlens, rows)
        out = y.transpose(1, 2).to(x.dtype)
    return out[:, :, 0] if squeeze else out


def causal_conv1d_varlen_states(x, cu_seqlens, state_len):
    """The last state_len tokens of each packed sequence, causal-conv1d's
    `causal_conv1d_varlen_states`: x [total_tokens, dim]; cu_seqlens [batch + 1] sorted
    offsets from 0; returns states [batch, dim, state_len] in x's dtype (causal-conv1d's
    channel-last strides), oldest first, zero where a sequence is shorter than state_len.
    A copy, done here with torch indexing (no arithmetic); no autograd, as in causal-conv1d."""
    x = _tensor(x, "x", 2, "[total_tokens, dim]")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.is_floating_point() or \
            cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError("cu_seqlens: expected an integer torch.Tensor [batch + 1]")
    if isinstance(state_len, bool) or not isinstance(state_len, int) or state_len < 1:
        raise ValueError(f"state_len: expected an integer >= 1, got {state_len!r}")
    cu = cu_seqlens.to(torch.int64)
    if int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) > x.shape[0]:
        raise ValueError(f"cu_seqlens: expected sorted offsets from 0 to at most "
                         f"total_tokens = {x.shape[0]}, got {cu.tolist()}")
    start, end = cu[:-1, None], cu[1:, None]
    token = end - state_len + torch.arange(state_len)           # [batch, state_len]
    inside = token >= start
    with torch.no_grad():
        picked = x[token.clamp(min=0)]                            # [batch, state_len, dim]
        states = torch.where(inside[..., None], picked, torch.zeros((), dtype=x.dtype))
    return states.transpose(1, 2)
