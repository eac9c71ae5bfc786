"""mamba-ssm's Mamba2 chunked scan and fused mixer (mamba_ssm.ops.triton.ssd_combined) on
linseq's SSD and conv ops: their names, argument order, defaults and return values, on
PyTorch CPU tensors.

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
op, linseq::ssd, or with seq_idx linseq::ssd_seq_idx, which finds the sequences from seq_idx's
values inside the op (return_varlen_states, whose number of states depends on those values,
is eager only). The scan runs in float32; out comes back in x's dtype, states in float32.

mamba_chunk_scan_combined's cp_context (linseq's own, not in mamba-ssm): a
linseq.distributed.build_context context; x, dt, B, C, z are then this rank's tokens
[1, T_r, ...] of the context's packed sequences (seq_idx and cu_seqlens are the context's:
both must be None), initial_states is [N_seq, nheads, headdim, dstate] (one row per sequence
of the context; [1, ...] for one sequence, as mamba-ssm's batch of one), and the final and
varlen states are [N_seq, ...] with the rows of the sequences ending on this rank, zeros
elsewhere (linseq.distributed.ssd).

    mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D,
        chunk_size, initial_states=None, seq_idx=None, dt_limit=(0.0, float("inf")),
        return_final_states=False, activation="silu", rmsnorm_weight=None, rmsnorm_eps=1e-6,
        outproj_weight=None, outproj_bias=None, headdim=None, ngroups=1,
        norm_before_gate=True, state_dtype=None)

The whole Mamba2 mixer after the input projection, as a composition: linseq's conv
(linseq.compat.causal_conv1d) and scan (above), torch for the gated RMSNorm, the SwiGLU of
the optional extra columns and the output projection; see its docstring.
"""

import math

import torch
import torch.nn.functional as F

from .. import _torch_ops, ops
from .. import torch as _linseq_torch
from . import causal_conv1d as _causal_conv1d

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


# ------------------------------------------------------------------------------------------
# The scan with seq_idx as one custom op: the packed sequences are counted from seq_idx's
# values inside it, where they are known under torch.compile too (outside it, their number
# would be a data-dependent size and break the graph)
# ------------------------------------------------------------------------------------------

_SSD_INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "h0")
_SSD_GRADS = ("dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "dh0")
_PER_TOKEN = ("x", "dt", "B", "C", "z")


def _options(dt_softplus, D_per_channel, dt_min, dt_max):
    options = dict(dt_softplus=dt_softplus, D_per_channel=D_per_channel)
    if (dt_min, dt_max) != _NO_LIMIT:
        options.update(dt_min=dt_min, dt_max=dt_max)
    return options


def _seq_idx_problem(seq_idx, tensors):
    """(the table op's float32 arrays with the batch rows laid end to end and h0 on each
    row's first sequence, cu_seqlens, each row's first and last sequence)."""
    batch, seqlen = tensors[0].shape[:2]
    cu, first, last = _packed(seq_idx, batch, seqlen)
    arrays = {}
    for name, t in zip(_SSD_INPUTS, tensors):
        if t is None:
            continue
        t = t.detach().float()
        if name in _PER_TOKEN:
            t = t.reshape(1, batch * seqlen, *t.shape[2:])
        elif name == "h0":
            t = torch.zeros(cu.shape[0] - 1, *t.shape[1:]).index_copy(0, first, t)
        arrays[name] = t.contiguous().numpy()
    return arrays, cu.numpy(), first, last


def _ssd_seq_idx_forward(seq_idx, dt_softplus, D_per_channel, dt_min, dt_max, *tensors):
    """y [batch, seqlen, H, P] and each row's final state [batch, H, P, N], float32."""
    arrays, cu, _, last = _seq_idx_problem(seq_idx, tensors)
    y, states = ops.run("ssd", arrays, cu_seqlens=cu,
                        **_options(dt_softplus, D_per_channel, dt_min, dt_max))
    return torch.from_numpy(y).reshape(tensors[0].shape), torch.from_numpy(states)[last]


def _ssd_seq_idx_fake(seq_idx, dt_softplus, D_per_channel, dt_min, dt_max, *tensors):
    x, B = tensors[0], tensors[3]
    return (x.new_empty(x.shape, dtype=torch.float32),
            x.new_empty((x.shape[0], x.shape[2], x.shape[3], B.shape[3]), dtype=torch.float32))


def _ssd_seq_idx_backward(seq_idx, dt_softplus, D_per_channel, dt_min, dt_max, *args):
    """One gradient per tensor of _ssd_seq_idx_forward (an empty one where not wanted)."""
    tensors, (d_y, d_final, wanted) = args[:-3], args[-3:]
    x = tensors[0]
    arrays, cu, first, last = _seq_idx_problem(seq_idx, tensors)
    d_y = torch.zeros(x.shape) if d_y is None else d_y.float()
    upstream = {"d_y": d_y.reshape(1, -1, *x.shape[2:]).contiguous().numpy()}
    if d_final is not None:
        d_states = torch.zeros(cu.shape[0] - 1, *d_final.shape[1:])
        upstream["d_hT"] = d_states.index_copy(0, last, d_final.float()).numpy()
    grads = ops.backward("ssd", arrays, upstream, cu_seqlens=cu,
                         **_options(dt_softplus, D_per_channel, dt_min, dt_max))
    out = []
    for name, t, w in zip(_SSD_INPUTS, tensors, wanted):
        if not w:
            out.append(torch.empty(0))
            continue
        g = torch.from_numpy(grads["d" + name])
        out.append(g[first] if name == "h0" else g.reshape(t.shape))
    return out


# with torch.library: linseq::ssd_seq_idx with its backward
_SSD_SEQ_IDX = None if not _torch_ops.AVAILABLE else _torch_ops.compat_op(
    "ssd_seq_idx", "Tensor seq_idx, bool dt_softplus, bool D_per_channel, float dt_min, "
    "float dt_max", ["Tensor x", "Tensor dt", "Tensor A", "Tensor B", "Tensor C", "Tensor? D",
                     "Tensor? z", "Tensor? dt_bias", "Tensor? h0"],
    _ssd_seq_idx_forward, _ssd_seq_idx_fake, _ssd_seq_idx_backward)


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
    if seq_idx is not None and not return_varlen_states and _SSD_SEQ_IDX is not None:
        if seq_idx.shape != (batch, seqlen) or seq_idx.dtype.is_floating_point:
            raise ValueError(f"seq_idx: expected integers of shape [batch, seqlen] = "
                             f"[{batch}, {seqlen}], got {seq_idx.dtype} {list(seq_idx.shape)}")
        y, final = _SSD_SEQ_IDX(seq_idx, bool(dt_softplus), options["D_per_channel"], lo, hi,
                                *(arrays[name] for name in _SSD_INPUTS))
        out = y.to(x.dtype)
        return (out, final) if return_final_states else out
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


# ------------------------------------------------------------------------------------------
# mamba_split_conv1d_scan_combined: the fused Mamba2 mixer
# ------------------------------------------------------------------------------------------

_ACTIVATIONS = (None, "silu", "swish")


def _tensor(value, name, shape, what):
    """value, a real torch.Tensor of exactly `shape` (what: its dims, for the message)."""
    if not isinstance(value, torch.Tensor) or value.is_complex():
        got = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(f"{name}: expected a real torch.Tensor {what}, got {got}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {what} = {list(shape)}, got "
                         f"{list(value.shape)}")
    return value


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


class _Mixer:
    """The sizes of a mamba_split_conv1d_scan_combined call, from its arguments' shapes (as
    mamba-ssm derives them), every tensor checked against them."""

    def __init__(self, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, headdim, ngroups):
        if not isinstance(zxbcdt, torch.Tensor) or not zxbcdt.is_floating_point() or \
                zxbcdt.dim() != 3:
            got = list(zxbcdt.shape) if isinstance(zxbcdt, torch.Tensor) else \
                type(zxbcdt).__name__
            raise ValueError(f"zxbcdt: expected a floating-point tensor [batch, seqlen, "
                             f"2*d_nonssm + 2*dim + 2*ngroups*dstate + nheads], got {got}")
        if not isinstance(D, torch.Tensor) or D.dim() not in (1, 2):
            raise ValueError("D: expected a tensor [nheads] or [nheads, headdim], got "
                             f"{list(D.shape) if isinstance(D, torch.Tensor) else D!r}")
        self.nheads = D.shape[0]
        if D.dim() == 1:   # as in mamba-ssm, a 2-D D gives headdim, and headdim is unused
            self.headdim = _positive_int(headdim, "headdim (needed with D of shape [nheads])")
        else:
            self.headdim = D.shape[1]
        self.ngroups = _positive_int(ngroups, "ngroups")
        if self.nheads < 1 or self.nheads % self.ngroups:
            raise ValueError(f"ngroups: expected a divisor of nheads = {self.nheads}, got "
                             f"{self.ngroups}")
        self.batch, self.seqlen, width = zxbcdt.shape
        self.dim = self.nheads * self.headdim
        if not isinstance(conv1d_weight, torch.Tensor) or conv1d_weight.dim() not in (2, 3) or \
                (conv1d_weight.dim() == 3 and conv1d_weight.shape[1] != 1):
            raise ValueError("conv1d_weight: expected [dim + 2*ngroups*dstate, width] (or "
                             "nn.Conv1d's [.., 1, width]), got "
                             f"{list(getattr(conv1d_weight, 'shape', [])) or conv1d_weight!r}")
        self.conv_weight = conv1d_weight.reshape(conv1d_weight.shape[0],
                                                 conv1d_weight.shape[-1])
        self.conv_dim = self.conv_weight.shape[0]
        bc = self.conv_dim - self.dim
        if bc < 2 * self.ngroups or bc % (2 * self.ngroups) or self.conv_weight.shape[1] < 1:
            raise ValueError(f"conv1d_weight: expected [dim + 2*ngroups*dstate, width] with "
                             f"dim = {self.dim}, ngroups = {self.ngroups}, dstate >= 1, got "
                             f"{list(conv1d_weight.shape)}")
        self.dstate = bc // (2 * self.ngroups)
        extra = width - (self.dim + self.conv_dim + self.nheads)
        if extra < 0 or extra % 2:
            raise ValueError(f"zxbcdt: expected a last dim of 2*d_nonssm + 2*dim + "
                             f"2*ngroups*dstate + nheads = 2*d_nonssm + {width - extra} "
                             f"(d_nonssm >= 0; dim = {self.dim}, dstate = {self.dstate} from "
                             f"conv1d_weight), got {width}")
        self.d_nonssm = extra // 2
        if conv1d_bias is not None:
            _tensor(conv1d_bias, "conv1d_bias", (self.conv_dim,), "[dim + 2*ngroups*dstate]")
        _tensor(dt_bias, "dt_bias", (self.nheads,), "[nheads]")
        _tensor(A, "A", (self.nheads,), "[nheads]")

    def check(self, initial_states, rmsnorm_weight, rmsnorm_eps, outproj_weight, outproj_bias,
              activation, state_dtype):
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation: expected None, 'silu' or 'swish', got "
                             f"{activation!r}")
        if initial_states is not None:
            _tensor(initial_states, "initial_states",
                    (self.batch, self.nheads, self.headdim, self.dstate),
                    "[batch, nheads, headdim, dstate]")
        if rmsnorm_weight is not None:
            _tensor(rmsnorm_weight, "rmsnorm_weight", (self.dim,), "[dim]")
            if isinstance(rmsnorm_eps, bool) or not isinstance(rmsnorm_eps, (int, float)) or \
                    not rmsnorm_eps >= 0:
                raise ValueError(f"rmsnorm_eps: expected a number >= 0, got {rmsnorm_eps!r}")
        if outproj_weight is not None:
            if not isinstance(outproj_weight, torch.Tensor) or outproj_weight.dim() != 2 or \
                    outproj_weight.shape[1] != self.d_nonssm + self.dim:
                got = list(getattr(outproj_weight, "shape", [])) or repr(outproj_weight)
                raise ValueError(f"outproj_weight: expected [out_dim, d_nonssm + dim] = "
                                 f"[out_dim, {self.d_nonssm + self.dim}], got {got}")
            if outproj_bias is not None:
                _tensor(outproj_bias, "outproj_bias", (outproj_weight.shape[0],), "[out_dim]")
        elif outproj_bias is not None:
            raise ValueError("outproj_bias: must be None without outproj_weight (as in "
                             "mamba-ssm)")
        if state_dtype is not None and not isinstance(state_dtype, torch.dtype):
            raise ValueError(f"state_dtype: expected None or a torch.dtype, got "
                             f"{state_dtype!r}")


def _gated_rms_norm(y, z, weight, eps, group_size, norm_before_gate):
    """mamba-ssm's gated RMSNorm, in float32: with norm_before_gate, RMSNorm(y) * silu(z),
    else RMSNorm(y * silu(z)); the mean square over each group of group_size channels, then
    times weight. Returns y's dtype."""
    y32, gate = y.float(), F.silu(z.float())
    if not norm_before_gate:
        y32 = y32 * gate
    groups = y32.unflatten(-1, (-1, group_size))
    normed = (groups * torch.rsqrt(groups.square().mean(-1, keepdim=True) + eps)).flatten(-2)
    out = normed * weight.float()
    if norm_before_gate:
        out = out * gate
    return out.to(y.dtype)


def mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D,
                                     chunk_size, initial_states=None, seq_idx=None,
                                     dt_limit=_NO_LIMIT, return_final_states=False,
                                     activation="silu", rmsnorm_weight=None, rmsnorm_eps=1e-6,
                                     outproj_weight=None, outproj_bias=None, headdim=None,
                                     ngroups=1, norm_before_gate=True, state_dtype=None):
    """The fused Mamba2 mixer after the input projection, mamba-ssm's
    `mamba_split_conv1d_scan_combined`.

    zxbcdt [batch, seqlen, 2*d_nonssm + 2*dim + 2*ngroups*dstate + nheads], dim = nheads *
    headdim, split along its last dim into zx0 [2*d_nonssm], z [dim], xBC [dim +
    2*ngroups*dstate] and dt [nheads]; conv1d_weight [dim + 2*ngroups*dstate, width] (or
    nn.Conv1d's [.., 1, width]), which gives dstate; conv1d_bias [dim + 2*ngroups*dstate];
    dt_bias, A [nheads]; D [nheads] (headdim then required) or [nheads, headdim];
    initial_states [batch, nheads, headdim, dstate]; seq_idx [batch, seqlen] integers;
    rmsnorm_weight [dim]; outproj_weight [out_dim, d_nonssm + dim]; outproj_bias [out_dim].

        xBC    <- causal depthwise conv1d of xBC (+ conv1d_bias), then silu unless
                  activation is None (per seq_idx: a tap reads only its own sequence's tokens)
        x, B, C = xBC's [dim], [ngroups*dstate], [ngroups*dstate] columns, as
                  [.., nheads, headdim] and [.., ngroups, dstate]
        y      = the SSD scan (mamba_chunk_scan_combined) of x, dt, A, B, C with D, dt_bias,
                  dt_softplus=True, dt_limit, initial_states, seq_idx; gated by silu(z) there
                  when rmsnorm_weight is None
        y      <- with rmsnorm_weight: RMSNorm(y) * silu(z) (norm_before_gate) or
                  RMSNorm(y * silu(z)), the mean square over each group of dim // ngroups
                  channels, times rmsnorm_weight
        out    = [silu(zx0[:d_nonssm]) * zx0[d_nonssm:], y]   (just y when d_nonssm = 0)
        out    <- out outproj_weight^T + outproj_bias          with outproj_weight

    Returns out [batch, seqlen, out_dim or d_nonssm + dim] in zxbcdt's dtype (outproj_weight's
    with the projection), or (out, final_states [batch, nheads, headdim, dstate] float32) with
    return_final_states. Differentiable through autograd (every tensor argument: linseq's
    conv and scan backward, torch's for the rest) and under torch.compile(fullgraph=True),
    seq_idx included.

    As in mamba_chunk_scan_combined: any chunk_size; the scan and conv compute in float32; with
    seq_idx, each row's first sequence starts from its row of initial_states. state_dtype
    (the dtype mamba-ssm keeps its inter-chunk states in) is checked, not used: linseq's
    states are float32. Bad arguments raise ValueError or TypeError naming the argument and
    the expected shape (mamba-ssm asserts).
    """
    sizes = _Mixer(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, headdim, ngroups)
    sizes.check(initial_states, rmsnorm_weight, rmsnorm_eps, outproj_weight, outproj_bias,
                activation, state_dtype)
    batch, seqlen, dim = sizes.batch, sizes.seqlen, sizes.dim
    nheads, headdim, ngroups, dstate = sizes.nheads, sizes.headdim, sizes.ngroups, sizes.dstate
    bc = ngroups * dstate
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * sizes.d_nonssm, dim, sizes.conv_dim, nheads],
                                  dim=-1)
    # the conv reads xBC where it lies, as a channel-last [batch, conv_dim, seqlen] view, and
    # writes token-major memory: xBC_conv [batch, seqlen, conv_dim]
    xBC_conv = _causal_conv1d.causal_conv1d_fn(
        xBC.transpose(1, 2), sizes.conv_weight, conv1d_bias, seq_idx=seq_idx,
        activation=activation).transpose(1, 2)
    x, B, C = torch.split(xBC_conv, [dim, bc, bc], dim=-1)
    x = x.unflatten(-1, (nheads, headdim))
    B, C = B.unflatten(-1, (ngroups, dstate)), C.unflatten(-1, (ngroups, dstate))
    z = z.unflatten(-1, (nheads, headdim))
    y, final_states = mamba_chunk_scan_combined(
        x, dt, A, B, C, chunk_size, D=D, z=z if rmsnorm_weight is None else None,
        dt_bias=dt_bias, initial_states=initial_states, seq_idx=seq_idx, dt_softplus=True,
        dt_limit=dt_limit, return_final_states=True)
    y = y.flatten(-2)
    if rmsnorm_weight is not None:
        y = _gated_rms_norm(y, z.flatten(-2), rmsnorm_weight, rmsnorm_eps, dim // ngroups,
                            norm_before_gate)
    if sizes.d_nonssm:
        gate, up = zx0.float().chunk(2, dim=-1)
        y = torch.cat([(F.silu(gate) * up).to(y.dtype), y], dim=-1)
    out = y
    if outproj_weight is not None:
        out = F.linear(y.to(outproj_weight.dtype), outproj_weight, outproj_bias)
    return (out, final_states) if return_final_states else out
