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

No copy on the way: a float32 x, channel-first or a transposed view, reaches the kernel as
the caller's memory (linseq reads it through its strides) and the kernel writes the output
in x's layout; causal_conv1d_update decodes in place on a float32 C-contiguous conv_state
(another pool goes through a float32 copy of the rows it names). The kernel calls sit in the
private functions _conv, _packed_conv and _conv_decode, as torch.library custom ops (_conv:
linseq's own conv op, linseq::causal_conv1d, channel first or last; linseq::causal_conv_seq_idx with
its backward, linseq::conv_state_update writing the pool): torch.compile(fullgraph=True)
traces the functions, the in-place update and seq_idx's packed sequences (whose offsets are
read inside the op) included.
"""

import torch

from .. import _torch_direct, _torch_native, _torch_ops, ops
from .._arrays import check_one_device, check_pool
from .._opspec import CONV1D
from .._options import ConvOptions
from .._torch_backend import TorchBackend

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


# ------------------------------------------------------------------------------------------
# The kernel seam
# ------------------------------------------------------------------------------------------

def _conv_inputs(x, weight, bias, initial_states, activation, cu_seqlens, channel_first):
    """linseq's conv problem over the caller's memory: x [b, d, l] with channel_first, else
    [b, l, d], float32 with any non-negative strides (no copy)."""
    return ops.Conv1dInputs(x, weight, bias, conv_state=initial_states, cu_seqlens=cu_seqlens,
                            activation=activation, channel_first=channel_first)


_CONV_GRADS = ("dx", "dweight", "dbias", "dconv_state")


def _conv_forward(channel_first, activation, cu_seqlens, x, weight, bias, initial_states):
    """linseq's conv forward on the kernel directly, for an op's own body (the seq_idx conv):
    x float32 [b, d, l] with channel_first (y [b, d, l]), else
    [b, l, d] (y [b, l, d]); weight [d, W]; bias [d]; initial_states [n, d, W-1]. Returns
    (y, the final states [n, d, W-1]), float32, both new dense arrays the kernel wrote (no
    copy on the way out)."""
    inputs = _conv_inputs(x, weight, bias, initial_states, activation, cu_seqlens,
                          channel_first)
    y, states = ops.conv1d_forward(inputs)
    return torch.from_numpy(y), torch.from_numpy(states)


def _conv_backward(channel_first, activation, cu_seqlens, x, weight, bias, initial_states,
                   d_y, d_states, wanted):
    """One gradient per tensor argument of _conv_forward (an empty one where not wanted)."""
    inputs = _conv_inputs(x, weight, bias, initial_states, activation, cu_seqlens,
                          channel_first)
    return _torch_ops.wanted_grads(_CONV_GRADS, wanted,
                                   lambda keys: ops.conv1d_backward(inputs, d_y, d_states,
                                                                    wanted=keys))


def _conv_op(channel_first, activation, cu_seqlens, x, weight, bias, initial_states):
    """linseq's conv op (linseq::causal_conv1d, differentiable) in either layout: the same call as
    _conv_forward, through the PyTorch backend."""
    arrays = dict(x=x, weight=weight, bias=bias, conv_state=initial_states)
    return TorchBackend.run(CONV1D, arrays, cu_seqlens,
                            ConvOptions(activation=activation, channel_first=channel_first))


def _conv(x, weight, bias, initial_states, activation, cu_seqlens=None, token_major=None):
    """The differentiable conv in causal-conv1d's layout: x [b, d, l] of any real dtype and
    strides; weight [d, W]; bias [d]; initial_states [n, d, W-1] (oldest first). A float32 x
    of any non-negative strides reaches the kernel as it is, and the kernel writes y
    [b, d, l] float32 in x's memory layout (token_major None), or as a [b, l, d] tensor
    (token_major True, y its transposed view) or a dense [b, d, l] one (False): no transpose.
    Returns (y, the final states [n, d, W-1] float32)."""
    x, weight = x.float(), weight.float()
    bias = None if bias is None else bias.float()
    initial_states = None if initial_states is None else initial_states.float()
    if token_major is None:
        token_major = _is_channel_last(x)
    if token_major:  # the kernel reads and writes [b, l, d]
        y, states = _conv_op(False, activation, cu_seqlens, x.transpose(1, 2), weight, bias,
                             initial_states)
        return y.transpose(1, 2), states
    return _conv_op(True, activation, cu_seqlens, x, weight, bias, initial_states)


def _packed_conv_forward(activation, seq_idx, x, weight, bias):
    """The conv of the packed sequences seq_idx [b, l] names (see _seq_idx_offsets): x float32
    [b, l, d], its rows read as one packed sequence of b*l tokens. Returns (y [b, l, d]
    float32, 0 where seq_idx < 0; an empty tensor: no final states with seq_idx). The
    offsets read seq_idx's values, so they are made here, inside the op, where the values
    are known under torch.compile too."""
    batch, seqlen, dim = x.shape
    offsets, keep = _seq_idx_offsets(seq_idx, batch, seqlen, weight.shape[1])
    y, _ = _conv_forward(False, activation, offsets, x.reshape(1, batch * seqlen, dim),
                         weight, bias, None)
    return y.reshape(batch, seqlen, dim) * keep[..., None], x.new_empty(0)


def _packed_conv_fake(activation, seq_idx, x, weight, bias):
    return x.new_empty(x.shape, dtype=torch.float32), x.new_empty(0, dtype=torch.float32)


def _packed_conv_backward(activation, seq_idx, x, weight, bias, d_y, d_states, wanted):
    """One gradient per tensor argument of _packed_conv_forward (empty where not wanted)."""
    batch, seqlen, dim = x.shape
    offsets, keep = _seq_idx_offsets(seq_idx, batch, seqlen, weight.shape[1])
    d_y = torch.zeros_like(x) if d_y is None else d_y * keep[..., None]
    grads = _conv_backward(False, activation, offsets, x.reshape(1, batch * seqlen, dim),
                           weight, bias, None, d_y.reshape(1, batch * seqlen, dim), None,
                           list(wanted) + [False])
    return [grads[0].reshape(x.shape) if wanted[0] else grads[0]] + grads[1:3]


# with torch.library: linseq::causal_conv_seq_idx with its backward
_PACKED_CONV = None if not _torch_ops.AVAILABLE else _torch_ops.compat_op(
    "causal_conv_seq_idx", "str? activation, Tensor seq_idx",
    ["Tensor x", "Tensor weight", "Tensor? bias"], _packed_conv_forward, _packed_conv_fake,
    _packed_conv_backward)


def _packed_conv(x, weight, bias, seq_idx, activation):
    """The differentiable conv of causal_conv1d_fn's seq_idx: x [b, d, l] any real dtype and
    strides, seq_idx [b, l] checked by _check_seq_idx. Returns y [b, d, l] float32 (a
    transposed [b, l, d] tensor)."""
    x, weight = x.float(), weight.float()
    bias = None if bias is None else bias.float()
    if _PACKED_CONV is None:  # PyTorch before 2.4: the offsets outside the autograd node
        batch, dim, seqlen = x.shape
        offsets, keep = _seq_idx_offsets(seq_idx, batch, seqlen, weight.shape[1])
        packed = x.transpose(1, 2).reshape(1, batch * seqlen, dim).transpose(1, 2)
        y, _ = _conv(packed, weight, bias, None, activation, offsets)
        return (y.transpose(1, 2).reshape(batch, seqlen, dim) * keep[..., None]).transpose(1, 2)
    y, _ = _PACKED_CONV(activation, seq_idx, x.transpose(1, 2), weight, bias)
    return y.transpose(1, 2)


def _shares_a_row(rows):
    """True when two requests (non-negative rows) name the same pool row: the kernel refuses
    it, and the float32 copy of another pool's rows is refused the same way."""
    named = rows[rows >= 0]
    return torch.unique(named).shape[0] != named.shape[0]


_FEW_ROWS = 64


def _check_rows(rows, entries, name):
    """The checks of a decode's pool rows [b] int64 that read their values: made inside the
    decode op, where the values are known under torch.compile too, before anything is
    written."""
    if rows.shape[0] <= _FEW_ROWS:  # a decode batch: Python's ints beat torch's reductions
        named = [r for r in rows.tolist() if r >= 0]
        beyond, shared = max(named, default=-1) >= entries, len(set(named)) != len(named)
    else:
        beyond, shared = bool((rows >= entries).any()), None
    if beyond:
        raise ValueError(f"{name}: rows must be < the pool's {entries} rows (negative = "
                         f"padding), got {int(rows.max())}")
    if shared or (shared is None and _shares_a_row(rows)):
        raise ValueError(f"{name}: two requests name the same row; each needs its own")


def _conv_decode(x, conv_state, weight, bias, activation, cache_seqlens, rows):
    """One decode call against a pool of state rows, updated in place (no autograd).

    x [b, d, l] of any dtype and strides; conv_state [R, d, state_len] (state_len >= W-1);
    rows [b] int64 (negative: a padding request, output 0, no row touched); cache_seqlens
    None (each row holds the last state_len inputs, oldest first) or [b] int64 (each row is a
    circular buffer whose next write position is cache_seqlens % state_len). Returns
    y [b, d, l] float32 in x's memory layout. A float32 C-contiguous pool is updated by the
    kernel where it lies; another one through a float32 copy of the named rows."""
    _check_rows(rows, conv_state.shape[0], "conv_state_indices")
    if cache_seqlens is not None and bool((cache_seqlens < 0).any()):
        raise ValueError("cache_seqlens: expected values >= 0")
    y = _torch_direct.conv1d_decode(x, conv_state, weight, bias, activation, cache_seqlens,
                                    rows)
    if y is not None:  # the common form, straight into the kernel
        return y
    channel_first = not _is_channel_last(x)
    xk = x.float() if channel_first else x.float().transpose(1, 2)
    inputs = _conv_inputs(xk, weight.float(), None if bias is None else bias.float(), None,
                          activation, None, channel_first)
    if conv_state.shape[2] == 0:  # width 1: no history to read or keep
        y = torch.from_numpy(ops.conv1d_forward(inputs, final_state=False)[0])
        y[rows < 0] = 0
    elif conv_state.dtype == torch.float32 and conv_state.is_contiguous():
        y = torch.from_numpy(ops.conv1d_decode(inputs, conv_state.detach().numpy(), rows,
                                               cache_seqlens))
    else:
        y = _through_float32_rows(conv_state, rows, lambda pool, local_rows: ops.conv1d_decode(
            inputs, pool, local_rows, cache_seqlens))
    return y if channel_first else y.transpose(1, 2)


def _conv_decode_fake(x, conv_state, weight, bias, activation, cache_seqlens, rows):
    if not _is_channel_last(x):
        return x.new_empty(x.shape, dtype=torch.float32)
    return x.new_empty((x.shape[0], x.shape[2], x.shape[1]), dtype=torch.float32).transpose(1, 2)


# with torch.library: linseq::conv_state_update, declared to write the pool, so that
# torch.compile keeps the in-place update
_CONV_DECODE = _conv_decode if not _torch_ops.AVAILABLE else _torch_ops.pool_update_op(
    "conv_state_update", "(Tensor x, Tensor(a!) state, Tensor weight, Tensor? bias, "
    "str? activation, Tensor? cache_seqlens, Tensor rows) -> Tensor", _conv_decode,
    _conv_decode_fake)
# the op's C++ kernel without its dispatch through Python, for the eager calls of plain
# tensors (None without the C++ kernels: then the Python body)
_CONV_EAGER = (_torch_ops.eager_entry("conv_state_update") if _torch_ops.AVAILABLE else None) \
    or _conv_decode
# the common decode call (no cache_seqlens, no conv_state_indices) checked and run in C++
# (linseq::conv_token_step), or None
_CONV_STEP = _torch_native.defined_here("conv_token_step")


def _through_float32_rows(pool, rows, decode):
    """decode(float32 C-contiguous pool, rows) on a copy of the rows `rows` names (negative:
    padding), for a pool of another dtype or layout; the new rows are written back. Returns
    decode's output as a tensor."""
    valid = rows >= 0
    named = rows[valid]
    n = named.shape[0]
    local = pool[named].to(torch.float32).contiguous() if n else \
        torch.zeros((1,) + tuple(pool.shape[1:]))  # all padding: the kernel needs a row
    local_rows = torch.full_like(rows, -1)
    local_rows[valid] = torch.arange(n)
    y = decode(local.numpy(), local_rows.numpy())
    pool[named] = local[:n].to(pool.dtype)
    return torch.from_numpy(y)


# ------------------------------------------------------------------------------------------
# causal_conv1d_fn
# ------------------------------------------------------------------------------------------

def _check_seq_idx(seq_idx, batch, seqlen):
    """The checks of seq_idx that need no values (made before the packed conv op)."""
    if not isinstance(seq_idx, torch.Tensor) or seq_idx.is_floating_point() or \
            seq_idx.is_complex() or seq_idx.dtype == torch.bool:
        raise TypeError("seq_idx: expected an integer torch.Tensor [batch, seqlen]")
    if tuple(seq_idx.shape) != (batch, seqlen):
        raise ValueError(f"seq_idx: expected shape [batch, seqlen] = [{batch}, {seqlen}], got "
                         f"{list(seq_idx.shape)}")


def _seq_idx_offsets(seq_idx, batch, seqlen, width):
    """The packed-sequence offsets over the flattened [batch * seqlen] tokens that give
    causal-conv1d's seq_idx rule (a tap reads a token only when both carry the same seq_idx),
    and the mask of tokens with seq_idx >= 0 (the others are padding: output 0).

    Each run of equal seq_idx in a row becomes one sequence; refused (ValueError) is the one
    case a run cannot express: an index that reappears within width-1 tokens after another."""
    _check_seq_idx(seq_idx, batch, seqlen)
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
                     return_final_states=False, final_states_out=None, activation=None, *,
                     cp_context=None):
    """Causal depthwise conv1d, causal-conv1d's `causal_conv1d_fn`.

    x [batch, dim, seqlen] (channel-first or channel-last strides); weight [dim, width];
    bias [dim]; seq_idx [batch, seqlen] integers: a tap reads a token only with the same
    seq_idx, tokens with seq_idx < 0 give 0 (not with initial_states / final states, as in
    causal-conv1d); initial_states [batch, dim, width-1], the inputs before the sequence,
    oldest first; final_states_out: a [batch, dim, width-1] tensor the final states are
    written to; activation None, "silu" or "swish".
    Returns out [batch, dim, seqlen] in x's dtype and layout, or (out, final_states) with
    return_final_states (final_states in x's dtype).

    cp_context (linseq's own, not in causal-conv1d): a linseq.distributed.build_context
    context; x is then this rank's tokens [1, dim, seqlen_r] of the context's packed
    sequences, initial_states [N, dim, width-1] one row per global sequence, and the final
    states [N, dim, width-1] have the rows of the sequences ending on this rank.
    """
    act = _activation(activation)
    check_one_device(dict(x=x, weight=weight, bias=bias, seq_idx=seq_idx,
                          initial_states=initial_states,
                          final_states_out=final_states_out))
    if isinstance(final_states_out, torch.Tensor) and not final_states_out.is_floating_point():
        raise TypeError(f"final_states_out: expected a floating-point tensor (it receives the "
                        f"final states), got {final_states_out.dtype}")
    if cp_context is not None:
        return _context_parallel_conv(cp_context, x, weight, bias, seq_idx, initial_states,
                                      return_final_states, final_states_out, act)
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
    if seq_idx is None:
        y, states = _conv(x, weight, bias, initial_states, act)
    else:
        _check_seq_idx(seq_idx, batch, seqlen)
        y = _packed_conv(x, weight, bias, seq_idx, act)
        if not _is_channel_last(x):
            y = y.contiguous()
    out = y.to(x.dtype)
    if not return_final_states:
        return out
    return out, _final_states(states, x, final_states_out)


def _context_parallel_conv(cp, x, weight, bias, seq_idx, initial_states, return_final_states,
                           final_states_out, act):
    """causal_conv1d_fn over this rank's tokens through linseq.distributed.causal_conv1d, x
    [1, d, l] seen as [1, l, d] (a transposed view, differentiable)."""
    from .. import distributed
    if not isinstance(cp, distributed.ContextParallel):
        raise TypeError(f"cp_context: expected linseq.distributed.build_context(...)'s "
                        f"context, got {type(cp).__name__}")
    if seq_idx is not None:
        raise ValueError("seq_idx: must be None with cp_context (the context's cu_seqlens "
                         "give the sequences)")
    if final_states_out is not None:
        raise ValueError("final_states_out: not available with cp_context (the final states "
                         "are returned)")
    x = _tensor(x, "x", 3, "this rank's tokens [1, dim, seqlen]")
    weight = _weight(weight, x.shape[1])
    if bias is not None:
        bias = _tensor(bias, "bias", 1, f"[dim] = [{x.shape[1]}]")
    if initial_states is not None:
        initial_states = _tensor(initial_states, "initial_states", 3,
                                 "[N, dim, width-1] (one row per global sequence)").float()
    y, states = distributed.causal_conv1d(
        x.float().transpose(1, 2), weight.float(), None if bias is None else bias.float(),
        act, initial_states, cp_context=cp)
    out = y.transpose(1, 2)
    out = (out if _is_channel_last(x) else out.contiguous()).to(x.dtype)
    return (out, states.to(x.dtype)) if return_final_states else out


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
    output is 0 and no row changes); two requests may not share a row (ValueError). Returns
    out in x's shape and dtype. No autograd (as in causal-conv1d).
    """
    if (_CONV_STEP is not None and cache_seqlens is None and conv_state_indices is None
            and activation in _ACTIVATIONS
            and _torch_direct.direct_call(x, conv_state, weight, bias)):
        taken = _CONV_STEP(x, conv_state, weight, bias, activation is not None)
        if taken:  # else another form: checked, converted or refused below
            return taken[0]
    act = _activation(activation)
    if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
        raise ValueError(f"x: expected a torch.Tensor [batch, dim] or [batch, dim, seqlen], "
                         f"got {list(getattr(x, 'shape', [type(x).__name__]))}")
    squeeze = x.dim() == 2
    x3 = x[:, :, None] if squeeze else x
    batch, dim, _ = x3.shape
    weight = _weight(weight, dim)
    width = weight.shape[1]
    conv_state = check_pool(_tensor(conv_state, "conv_state", 3, "[entries, dim, state_len]"),
                            "conv_state")
    if conv_state.shape[1] != dim or conv_state.shape[2] < width - 1:
        raise ValueError(f"conv_state: expected shape [entries, dim, state_len] with dim = "
                         f"{dim} and state_len >= width-1 = {width - 1}, got "
                         f"{list(conv_state.shape)}")
    rows = _int_vector(conv_state_indices, "conv_state_indices", batch)
    seqlens = _int_vector(cache_seqlens, "cache_seqlens", batch)
    # eager on plain tensors: the op's body without torch.library's dispatch (same result)
    direct = _torch_direct.direct_call(x3, conv_state, weight, bias, seqlens, rows)
    if rows is None:
        if conv_state.shape[0] != batch:
            raise ValueError(f"conv_state: expected {batch} rows (one per request) without "
                             f"conv_state_indices, got {conv_state.shape[0]}")
        rows = _torch_direct.identity_rows(batch) if direct else torch.arange(batch)
    if bias is not None and tuple(bias.shape) != (dim,):
        raise ValueError(f"bias: expected shape [dim] = [{dim}], got {list(bias.shape)}")
    if not direct:  # (plain CPU tensors all: on one device)
        check_one_device(dict(x=x, conv_state=conv_state, weight=weight, bias=bias,
                              cache_seqlens=seqlens, conv_state_indices=rows))
    update = _CONV_EAGER if direct else _CONV_DECODE
    with torch.no_grad():
        out = update(x3, conv_state, weight, bias, act, seqlens, rows).to(x.dtype)
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
