"""mamba-ssm's Mamba2 chunked scan (mamba_ssm.ops.triton.ssd_combined) on linseq's SSD op:
its name, argument order, defaults and return values, on PyTorch CPU tensors.

    mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                              initial_states=None, seq_idx=None, cu_seqlens=None,
                              dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False)

x, z [batch, seqlen, nheads, headdim]; dt [batch, seqlen, nheads]; A, dt_bias [nheads]; B, C
[batch, seqlen, ngroups, dstate]; D [nheads] or [nheads, headdim]; initial_states and the
final states [batch, nheads, headdim, dstate]. As mamba-ssm computes it: dt (+ dt_bias, added
with or without the softplus), softplus with dt_softplus, clamped to dt_limit unless it is
(0, inf); out = (the scan + D x) * silu(z). seq_idx [batch, seqlen] restarts the state where
it changes along a row (the row's first sequence starts from initial_states, the others from
zeros); return_varlen_states gives the state after each sequence of cu_seqlens, which must be
the sequences seq_idx marks (batch 1). chunk_size is accepted as any positive int: linseq's
kernels take their own chunks, which changes nothing but float32 rounding.

Differentiable (every input, initial_states and the final states' gradient included) through
linseq's C backward, under torch.compile(fullgraph=True): the kernel is linseq's own custom
op, linseq::ssd. The scan runs in float32; out comes back in x's dtype, states in float32.

cp_context (linseq's own, not in mamba-ssm): a linseq.distributed.build_context context; x,
dt, B, C, z are then this rank's tokens [1, T_r, ...] of the context's packed sequences
(seq_idx and cu_seqlens are the context's: both must be None), initial_states is [N_seq,
nheads, headdim, dstate] (one row per sequence of the context; [1, ...] for one sequence, as
mamba-ssm's batch of one), and the final and varlen states are [N_seq, ...] with the rows of
the sequences ending on this rank, zeros elsewhere (linseq.distributed.ssd).
"""

import math

import torch

from .. import torch as _linseq_torch

_NO_LIMIT = (0.0, math.inf)


def _as_f32(t):
    return None if t is None else t.float()


def _packed(seq_idx, batch, seqlen):
    """(cu_seqlens over the batch rows laid end to end, each row's first and last sequence)
    from seq_idx: a sequence ends where seq_idx changes along a row, and at each row's end."""
    if seq_idx.shape != (batch, seqlen) or seq_idx.dtype.is_floating_point:
        raise ValueError(f"seq_idx: expected integers of shape [batch, seqlen] = "
                         f"[{batch}, {seqlen}], got {seq_idx.dtype} {list(seq_idx.shape)}")
    change = torch.ones(batch, seqlen, dtype=torch.bool)
    change[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
    starts = torch.nonzero(change.reshape(-1)).reshape(-1)
    cu = torch.cat([starts, torch.tensor([batch * seqlen])]).to(torch.int64)
    per_row = change.sum(dim=1)
    first = torch.cumsum(per_row, 0) - per_row
    return cu, first, first + per_row - 1


def _check_varlen(cu_seqlens, cu, batch):
    if cu_seqlens is None:
        raise ValueError("cu_seqlens: return_varlen_states needs the sequences' offsets")
    if batch != 1:
        raise ValueError(f"cu_seqlens: packed sequences need batch 1, got {batch}")
    given = torch.as_tensor(cu_seqlens).to(torch.int64).reshape(-1)
    if cu is None or not torch.equal(given, cu):
        raise ValueError("seq_idx: return_varlen_states needs seq_idx marking the sequences of "
                         "cu_seqlens (mamba-ssm restarts the state only where seq_idx changes)")


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                              initial_states=None, seq_idx=None, cu_seqlens=None,
                              dt_softplus=False, dt_limit=_NO_LIMIT,
                              return_final_states=False, return_varlen_states=False, *,
                              cp_context=None):
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")
    if x.dim() != 4:
        raise ValueError(f"x: expected [batch, seqlen, nheads, headdim], got {list(x.shape)}")
    batch, seqlen, nheads, headdim = x.shape
    lo, hi = (float(v) for v in dt_limit)
    dt = dt.float()
    if dt_bias is not None and not dt_softplus:  # mamba-ssm adds it without softplus too
        dt, dt_bias = dt + dt_bias.float(), None
    options = dict(dt_softplus=bool(dt_softplus), D_per_channel=D is not None and D.dim() == 2)
    if (lo, hi) != _NO_LIMIT:
        options.update(dt_min=lo, dt_max=hi)
    if cp_context is not None:
        return _context_parallel(cp_context, x, dt, A, B, C, D, z, dt_bias, initial_states,
                                 seq_idx, cu_seqlens, bool(dt_softplus), (lo, hi),
                                 return_final_states, return_varlen_states)
    arrays = dict(x=x.float(), dt=dt, A=_as_f32(A), B=_as_f32(B), C=_as_f32(C), D=_as_f32(D),
                  z=_as_f32(z), dt_bias=_as_f32(dt_bias), h0=_as_f32(initial_states))
    cu = first = last = None
    if seq_idx is not None:
        cu, first, last = _packed(seq_idx, batch, seqlen)
        for name in ("x", "dt", "B", "C", "z"):
            if arrays[name] is not None:
                arrays[name] = arrays[name].reshape(1, batch * seqlen, *arrays[name].shape[2:])
        if initial_states is not None:  # each row's first sequence starts from its row's
            rows = torch.zeros(cu.shape[0] - 1, *initial_states.shape[1:])
            arrays["h0"] = rows.index_copy(0, first, arrays["h0"])
    if return_varlen_states:
        _check_varlen(cu_seqlens, cu, batch)
    y, states = _linseq_torch.run("ssd", arrays, cu, **options)
    out = y.reshape(batch, seqlen, nheads, headdim).to(x.dtype)
    final = states if last is None else states[last]
    result = (out,)
    if return_final_states:
        result += (final,)
    if return_varlen_states:
        result += (states,)
    return result[0] if len(result) == 1 else result


def _context_parallel(cp, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                      dt_softplus, dt_limit, return_final_states, return_varlen_states):
    """mamba_chunk_scan_combined over this rank's tokens through linseq.distributed.ssd."""
    from .. import distributed
    if not isinstance(cp, distributed.ContextParallel):
        raise TypeError(f"cp_context: expected linseq.distributed.build_context(...)'s "
                        f"context, got {type(cp).__name__}")
    if seq_idx is not None or cu_seqlens is not None:
        raise ValueError("seq_idx, cu_seqlens: must be None with cp_context (the context's "
                         "cu_seqlens give the sequences)")
    if x.shape[0] != 1:
        raise ValueError(f"x: expected this rank's tokens [1, seqlen, nheads, headdim] with "
                         f"cp_context, got {list(x.shape)}")
    y, states = distributed.ssd(x.float(), dt, _as_f32(A), _as_f32(B), _as_f32(C), _as_f32(D),
                                _as_f32(z), _as_f32(initial_states), dt_softplus=dt_softplus,
                                dt_bias=_as_f32(dt_bias), dt_limit=dt_limit, cp_context=cp)
    result = (y.to(x.dtype),)
    if return_final_states:
        result += (states,)
    if return_varlen_states:
        result += (states,)
    return result[0] if len(result) == 1 else result
