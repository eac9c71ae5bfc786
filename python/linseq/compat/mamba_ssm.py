"""mamba-ssm's functions, names, argument order, defaults and return values, on linseq's
SSM1 scan and causal conv1d kernels (PyTorch CPU tensors).

    selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                      delta_softplus=False, return_last_state=False)
    selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                           dt_softplus=False, state_batch_indices=None)
    mamba_inner_fn(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight,
                   out_proj_weight, out_proj_bias, A, B=None, C=None, D=None,
                   delta_bias=None, B_proj_bias=None, C_proj_bias=None, delta_softplus=True,
                   checkpoint_lvl=1, b_rms_weight=None, c_rms_weight=None,
                   dt_rms_weight=None, b_c_dt_rms_eps=1e-6)

mamba-ssm's layout: u, delta, z [batch, dim, seqlen]; A [dim, dstate], real (a complex A
is refused: linseq's SSM1 is the real-A scan); B and C each [batch, dstate, seqlen],
grouped [batch, groups, dstate, seqlen] or constant [dim, dstate], with independent group
counts. The scan runs in float32 whatever the input dtypes (as mamba-ssm accumulates); the
output comes back in u's dtype, the last state in float32. selective_scan_fn and
mamba_inner_fn are differentiable through linseq's C backward; delta_softplus runs inside
the kernel, with delta_bias (without softplus the bias is added here). Unlike mamba-ssm, the
gradient of the returned last state is honoured.

No copy on the way: float32 u, delta, z (contiguous, xz.chunk halves, transposed views) and
B, C (a constant [dim, dstate] included) reach the kernel as the caller's memory, read
through their strides, and the kernel writes out and the per-token gradients in mamba-ssm's
layout. Only B and C with two different group counts, neither of them one, are repeated to a
common count (a copy). selective_state_update decodes in place on a float32 C-contiguous
state (another state goes through a float32 copy of the rows it names). The kernel calls sit
in the private functions _scan and _scan_decode, as torch.library custom ops (_scan: linseq's
own SSM1 op, linseq::ssm1, in mamba-ssm's channel-first layout; linseq::mamba_state_update
writing the pool): torch.compile(fullgraph=True) traces the functions, the in-place update
included.
"""

import math

import torch
import torch.nn.functional as F

from .. import _torch_direct, _torch_native, _torch_ops, ops
from .._arrays import check_one_device, check_pool
from .._opspec import SSM1
from .._options import Ssm1Options
from .._torch_backend import TorchBackend
from .causal_conv1d import _check_rows, _conv, _through_float32_rows


# ------------------------------------------------------------------------------------------
# The kernel seam
# ------------------------------------------------------------------------------------------

def _scan_op(channel_first, softplus, u, delta, A, B, C, D, z, delta_bias):
    """linseq's SSM1 op (linseq::ssm1, differentiable), the gate through silu, all tensors
    float32: with channel_first u, delta, z [b, d, l] and B, C [b, N, l], [b, G, N, l] or
    [d, N], y [b, d, l]; else u, delta, z [b, l, d], B, C [b, l, N], [b, l, G, N] or [d, N],
    y [b, l, d]. Float32 views of any non-negative strides are read where they lie. Returns
    (y, the last state [b, d, N]): new dense arrays the kernel wrote."""
    arrays = dict(x=u, dt=delta, A=A, B=B, C=C, D=D, gate=z, h0=None, dt_bias=delta_bias)
    opts = Ssm1Options(activation="silu", dt_softplus=softplus, channel_first=channel_first)
    return TorchBackend.run(SSM1, arrays, None, opts)


def _scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, softplus=False,
          token_major=False):
    """The differentiable scan in mamba-ssm's layout: u, delta, z [b, d, l] of any real dtype
    and strides; A [d, N]; B, C [b, G, N, l] or constant [d, N] (from _groups); D,
    delta_bias [d]. Float32 inputs reach the kernel as the caller's memory; y [b, d, l]
    float32 is written by the kernel channel-first, or with token_major as [b, l, d] and
    returned as its transposed view (for a caller that goes on token by token). Returns
    (y, the last state [b, d, N] float32)."""
    u, delta, A = u.float(), delta.float(), A.float()
    z, D = (None if t is None else t.float() for t in (z, D))
    if delta_bias is not None:
        delta_bias = delta_bias.float()
        if not softplus:  # the kernel adds dt_bias only together with its softplus
            delta, delta_bias = delta + delta_bias[:, None], None
    B, C = _common_groups(B.float(), C.float(), u.shape[1])
    if not token_major:
        return _scan_op(True, bool(softplus), u, delta, A, B, C, D, z, delta_bias)

    def tokens(P):  # [b, G, N, l] -> [b, l, G, N], a view; constant [d, N] as it is
        return P if P.dim() == 2 else P.permute(0, 3, 1, 2)

    y, last = _scan_op(False, bool(softplus), u.transpose(1, 2), delta.transpose(1, 2), A,
                       tokens(B), tokens(C), D, None if z is None else z.transpose(1, 2),
                       delta_bias)
    return y.transpose(1, 2), last


def _common_groups(B, C, dim):
    """B and C as the kernel takes them: as given when their group counts are equal or one
    of them has a single group (a constant [d, N] counts as d groups); otherwise both
    repeated to the least common multiple of the two (a copy, differentiable)."""
    def groups(P):
        return dim if P.dim() == 2 else P.shape[1]

    gb, gc = groups(B), groups(C)
    if gb == gc or 1 in (gb, gc):
        return B, C
    G = math.lcm(gb, gc)

    def repeat(P, g):  # a constant one has d = G groups already
        return P if g == G else P.repeat_interleave(G // g, dim=1)

    return repeat(B, gb), repeat(C, gc)


def _scan_decode(state, rows, x, dt, A, B, C, D, z, dt_bias, dt_softplus):
    """One token per request against a pool of states, updated in place (no autograd).

    state [R, H, P, N] (any dtype and strides: the caller's pool, d = H*P channels); rows [b]
    int64, negative = a padding request (output 0, no row touched); x, dt, z [b, d];
    B, C [b, G, N]; A [d, N]; D, dt_bias [d]. Returns y [b, d] float32. A float32
    C-contiguous pool is updated by the kernel where it lies; another one through a float32
    copy of the rows named."""
    _check_rows(rows, state.shape[0], "state_batch_indices")
    y = _torch_direct.ssm1_decode(state, rows, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if y is not None:  # the common form, straight into the kernel
        return y
    dt = dt.float()
    if dt_bias is not None and not dt_softplus:
        dt, dt_bias = dt + dt_bias.float(), None  # the kernel adds dt_bias with softplus only
    inputs = ops.Ssm1Inputs(
        x.float()[:, None], dt[:, None], A.float(), B.float()[:, None], C.float()[:, None],
        None if D is None else D.float(), gate=None if z is None else z.float()[:, None],
        dt_softplus=bool(dt_softplus), dt_bias=None if dt_bias is None else dt_bias.float(),
        activation="silu")

    def decode(pool, pool_rows):  # pool: float32 C-contiguous [R, H, P, N], seen as [R, d, N]
        return ops.ssm1_decode(inputs, pool.reshape(pool.shape[0], inputs.D, inputs.N),
                               pool_rows)

    if state.dtype == torch.float32 and state.is_contiguous():
        y = torch.from_numpy(decode(state.detach().numpy(), rows))
    else:
        y = _through_float32_rows(state, rows, decode)
    return y[:, 0]


def _scan_decode_fake(state, rows, x, dt, A, B, C, D, z, dt_bias, dt_softplus):
    return x.new_empty(x.shape, dtype=torch.float32)


# with torch.library: linseq::mamba_state_update, declared to write the pool, so that
# torch.compile keeps the in-place update
_SCAN_DECODE = _scan_decode if not _torch_ops.AVAILABLE else _torch_ops.pool_update_op(
    "mamba_state_update", "(Tensor(a!) state, Tensor rows, Tensor x, Tensor dt, Tensor A, "
    "Tensor B, Tensor C, Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus) -> Tensor",
    _scan_decode, _scan_decode_fake)
# the op's C++ kernel without its dispatch through Python, for the eager calls of plain
# tensors (None without the C++ kernels: then the Python body)
_SCAN_EAGER = (_torch_ops.eager_entry("mamba_state_update") if _torch_ops.AVAILABLE else None) \
    or _scan_decode
# the common Mamba1 decode call checked and run in C++ (linseq::mamba1_token_step), or None
_MAMBA1_STEP = _torch_native.defined_here("mamba1_token_step")


# ------------------------------------------------------------------------------------------
# selective_scan_fn
# ------------------------------------------------------------------------------------------

def _real_tensor(value, name):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if value.is_complex():
        raise TypeError(f"{name}: complex {name} is not supported: linseq's SSM1 is the "
                        "real-A selective scan (pass a real A and real B, C)")
    return value


def _groups(P, name, batch, dim, dstate, seqlen):
    """B or C in mamba-ssm's layout, checked, as [b, G, N, l] or constant [d, N]."""
    P = _real_tensor(P, name)
    if P.dim() == 2:
        if tuple(P.shape) != (dim, dstate):
            raise ValueError(f"{name}: a constant {name} has shape [dim, dstate] = "
                             f"[{dim}, {dstate}], got {list(P.shape)}")
        return P
    if P.dim() == 3:
        P = P[:, None]
    if P.dim() != 4 or P.shape[0] != batch or P.shape[2:] != (dstate, seqlen):
        raise ValueError(f"{name}: expected [batch, dstate, seqlen] = [{batch}, {dstate}, "
                         f"{seqlen}], [batch, groups, dstate, seqlen] or [dim, dstate] = "
                         f"[{dim}, {dstate}], got {list(P.shape)}")
    if dim % P.shape[1]:
        raise ValueError(f"{name}: the groups ({P.shape[1]}) must divide dim = {dim}")
    return P


def _scan_mamba_layout(u, delta, A, B, C, D, z, delta_bias, delta_softplus, token_major=False):
    """selective_scan_fn's checks and work: (y [b, d, l] float32, dense, or with token_major
    a dense [b, l, d] tensor's transposed view; last state [b, d, N])."""
    check_one_device(dict(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z,
                          delta_bias=delta_bias))
    u, delta, A = _real_tensor(u, "u"), _real_tensor(delta, "delta"), _real_tensor(A, "A")
    if u.dim() != 3:
        raise ValueError(f"u: expected [batch, dim, seqlen], got {list(u.shape)}")
    batch, dim, seqlen = u.shape
    if A.dim() != 2 or A.shape[0] != dim:
        raise ValueError(f"A: expected [dim, dstate] with dim = {dim}, got {list(A.shape)}")
    dstate = A.shape[1]
    for t, name in ((delta, "delta"), (z, "z")):
        if t is not None and tuple(_real_tensor(t, name).shape) != tuple(u.shape):
            raise ValueError(f"{name}: expected [batch, dim, seqlen] = {list(u.shape)} like "
                             f"u, got {list(t.shape)}")
    for t, name in ((D, "D"), (delta_bias, "delta_bias")):
        if t is not None and tuple(_real_tensor(t, name).shape) != (dim,):
            raise ValueError(f"{name}: expected [dim] = [{dim}], got {list(t.shape)}")
    B = _groups(B, "B", batch, dim, dstate, seqlen)
    C = _groups(C, "C", batch, dim, dstate, seqlen)
    return _scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, token_major)


def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False, *, cp_context=None):
    """The Mamba1 selective scan, mamba-ssm's `selective_scan_fn`.

    u, delta, z [batch, dim, seqlen]; A [dim, dstate] real; B, C [batch, dstate, seqlen],
    [batch, groups, dstate, seqlen] or constant [dim, dstate]; D, delta_bias [dim]. Per
    channel: delta' = softplus(delta + delta_bias) with delta_softplus (else delta +
    delta_bias), h_t = exp(delta'_t A) h_{t-1} + delta'_t B_t u_t, y_t = C_t . h_t + D u_t,
    out = y * silu(z). Returns out [batch, dim, seqlen] in u's dtype, or (out, last_state
    [batch, dim, dstate] float32) with return_last_state.

    cp_context (linseq's own, not in mamba-ssm): a linseq.distributed.build_context context;
    u, delta, z, B, C are then this rank's tokens [1, ..., seqlen_r] of the context's packed
    sequences, and the last state is [N, dim, dstate] with the rows of the sequences ending
    on this rank (zeros elsewhere).
    """
    if cp_context is not None:
        out, last = _context_parallel_scan(cp_context, u, delta, A, B, C, D, z, delta_bias,
                                           delta_softplus)
        return (out, last) if return_last_state else out
    y, last = _scan_mamba_layout(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    out = y.to(u.dtype)  # y is the kernel's own [b, d, l] array: no copy for float32
    return (out, last) if return_last_state else out


def _context_parallel_scan(cp, u, delta, A, B, C, D, z, delta_bias, delta_softplus):
    """selective_scan_fn over this rank's tokens through linseq.distributed.state_space_v1,
    the [1, d, l] tensors seen as [1, l, d] (transposed views, differentiable)."""
    from .. import distributed
    if not isinstance(cp, distributed.ContextParallel):
        raise TypeError(f"cp_context: expected linseq.distributed.build_context(...)'s "
                        f"context, got {type(cp).__name__}")
    u, delta, A = _real_tensor(u, "u"), _real_tensor(delta, "delta"), _real_tensor(A, "A")
    for t, name in ((D, "D"), (z, "z"), (delta_bias, "delta_bias")):
        if t is not None:
            _real_tensor(t, name)
    if u.dim() != 3 or u.shape[0] != 1:
        raise ValueError(f"u: expected this rank's tokens [1, dim, seqlen], got "
                         f"{list(u.shape)}")
    for P, name in ((B, "B"), (C, "C")):
        if not isinstance(P, torch.Tensor) or P.dim() not in (3, 4):
            raise ValueError(f"{name}: expected [1, dstate, seqlen] or [1, groups, dstate, "
                             f"seqlen] with cp_context (a constant [dim, dstate] is not "
                             f"taken there), got {list(getattr(P, 'shape', []))}")

    def tokens(t):   # [1, ..., l] -> [1, l, ...]
        return None if t is None else t.float().movedim(-1, 1)

    y, last = distributed.state_space_v1(
        tokens(u), A.float(), tokens(B), tokens(C), None if D is None else D.float(),
        tokens(delta), gate=tokens(z), dt_softplus=delta_softplus,
        dt_bias=None if delta_bias is None else delta_bias.float(), cp_context=cp)
    return y.transpose(1, 2).to(u.dtype), last


# ------------------------------------------------------------------------------------------
# selective_state_update
# ------------------------------------------------------------------------------------------

def _checked(t, name, want, what):
    """An optional tensor, real and of exactly the shape `want`."""
    if t is None:
        return None
    t = _real_tensor(t, name)
    if tuple(t.shape) != tuple(want):
        raise ValueError(f"{name}: expected {what} = {list(want)}, got {list(t.shape)}")
    return t


def _with_heads(t, lacking_heads_ndim, axis):
    """mamba-ssm's rule: a tensor given without the heads (or groups) axis gets one there."""
    if isinstance(t, torch.Tensor) and t.dim() == lacking_heads_ndim:
        return t.unsqueeze(axis)
    return t


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                           dt_softplus=False, state_batch_indices=None):
    """One decode step, mamba-ssm's `selective_state_update` (Mamba1 and Mamba2 shapes).

    state [batch, dim, dstate] or [batch, nheads, dim, dstate], updated in place (with
    state_batch_indices: a pool of any number of rows); x, dt, z [batch, (nheads,) dim];
    A [(nheads,) dim, dstate]; B, C [batch, (ngroups,) dstate]; D, dt_bias [(nheads,) dim];
    state_batch_indices [batch] int: the pool row of each request, a negative row marks a
    padding request (output 0, no row touched); two requests may not share a row
    (ValueError). Per channel: dt' = softplus(dt + dt_bias)
    with dt_softplus (else dt + dt_bias), state = exp(dt' A) state + dt' B x,
    out = (C . state + D x) * silu(z). Returns out [batch, (nheads,) dim] in x's dtype.
    No autograd (as in mamba-ssm).
    """
    state = _real_tensor(state, "state")
    if state.dim() == 3 and state_batch_indices is None:
        y = _mamba1_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
        if y is not None:  # plain CPU tensors and a dense pool: nothing more to check
            return y
    check_one_device(dict(state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                          state_batch_indices=state_batch_indices))
    check_pool(state, "state")
    if state.dim() not in (3, 4):
        raise ValueError(f"state: expected [batch, dim, dstate] or [batch, nheads, dim, "
                         f"dstate], got {list(state.shape)}")
    has_heads = state.dim() == 4
    pool = state if has_heads else state.unsqueeze(1)     # a view: written in place
    _, nheads, hdim, dstate = pool.shape
    x = _with_heads(_real_tensor(x, "x"), 2, 1)
    batch = x.shape[0]
    per_token, token_what = (batch, nheads, hdim), "[batch, (nheads,) dim]"
    per_channel, channel_what = (nheads, hdim), "[(nheads,) dim]"
    x = _checked(x, "x", per_token, token_what)
    dt = _checked(_with_heads(_real_tensor(dt, "dt"), 2, 1), "dt", per_token, token_what)
    z = _checked(_with_heads(z, 2, 1), "z", per_token, token_what)
    A = _checked(_with_heads(A, 2, 0), "A", (nheads, hdim, dstate), "[(nheads,) dim, dstate]")
    D = _checked(_with_heads(D, 1, 0), "D", per_channel, channel_what)
    dt_bias = _checked(_with_heads(dt_bias, 1, 0), "dt_bias", per_channel, channel_what)
    B = _with_heads(_real_tensor(B, "B"), 2, 1)
    ngroups = B.shape[1] if B.dim() == 3 else 0
    if B.dim() != 3 or B.shape[0] != batch or B.shape[2] != dstate or nheads % ngroups:
        raise ValueError(f"B: expected [batch, (ngroups,) dstate] = [{batch}, G, {dstate}] "
                         f"with G dividing nheads = {nheads}, got {list(B.shape)}")
    C = _checked(_with_heads(C, 2, 1), "C", B.shape, "[batch, (ngroups,) dstate] like B")
    if state_batch_indices is None:
        if pool.shape[0] != batch:
            raise ValueError(f"state: expected {batch} rows (one per request) without "
                             f"state_batch_indices, got {pool.shape[0]}")
        rows = torch.arange(batch)
    else:
        rows = _row_indices(state_batch_indices, batch)
    dim = nheads * hdim  # heads flattened into linseq's channels; head h reads group h//(H/G)

    def flat(t, *shape):
        return None if t is None else t.reshape(*shape)

    args = (pool, rows, flat(x, batch, dim), flat(dt, batch, dim), flat(A, dim, dstate), B, C,
            flat(D, dim), flat(z, batch, dim), flat(dt_bias, dim), bool(dt_softplus))
    # eager on plain tensors: the op's body without torch.library's dispatch (same result)
    update = _SCAN_EAGER if _torch_direct.direct_call(*args[:10]) else _SCAN_DECODE
    with torch.no_grad():
        y = update(*args)
    out = y.reshape(per_token).to(x.dtype)
    return out if has_heads else out[:, 0]


def _mamba1_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus):
    """The common Mamba1 decode call (state [b, d, N], one row per request; x, dt, z [b, d];
    A [d, N]; B, C [b, N]; D, dt_bias [d]; plain float32 CPU tensors, eager) straight into
    the kernel, without the reshaping of the general path (a model makes this call once per
    layer and token); None for any other call, which the general path checks and takes."""
    if not _torch_direct.direct_call(state, x, dt, A, B, C, D, z, dt_bias):
        return None
    if _MAMBA1_STEP is not None:  # the whole call in C++, or nothing for another form
        taken = _MAMBA1_STEP(state, x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus))
        if taken:
            return taken[0]
    b, d, N = state.shape
    if not (x.shape == dt.shape == (b, d) and A.shape == (d, N) and B.shape == C.shape == (b, N)
            and (z is None or z.shape == (b, d))
            and all(t is None or t.shape == (d,) for t in (D, dt_bias))):
        return None
    args = (state[:, None], _torch_direct.identity_rows(b), x, dt, A, B[:, None], C[:, None],
            D, z, dt_bias, bool(dt_softplus))
    # the C++ kernel passes a call it does not take to _scan_decode, which returns float32
    # and does not check the pool's layout: only float32 tensors and a dense pool go there
    native = _SCAN_EAGER is not _scan_decode and state.is_contiguous() and all(
        t is None or t.dtype is torch.float32 for t in (state, x, dt, A, B, C, D, z, dt_bias))
    with torch.no_grad():
        return (_SCAN_EAGER if native else _torch_direct.ssm1_decode)(*args)


def _row_indices(rows, batch):
    if not isinstance(rows, torch.Tensor) or rows.is_floating_point() or rows.is_complex() \
            or rows.dtype == torch.bool:
        raise TypeError(f"state_batch_indices: expected an integer torch.Tensor [batch], got "
                        f"{getattr(rows, 'dtype', type(rows).__name__)}")
    if tuple(rows.shape) != (batch,):
        raise ValueError(f"state_batch_indices: expected shape [batch] = [{batch}], got "
                         f"{list(rows.shape)}")
    return rows.to(torch.int64)  # their values: checked by _scan_decode


# ------------------------------------------------------------------------------------------
# mamba_inner_fn
# ------------------------------------------------------------------------------------------

def _rms_norm(t, weight, eps):
    """RMSNorm over the last axis, in float32, back in t's dtype (torch, differentiable)."""
    tf = t.float()
    return (tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(t.dtype)


def _projected(x_dbl, lo, hi, bias, rms_weight, eps, batch, seqlen):
    """B or C taken from the x projection ([b*l, r+2N] columns lo:hi) as [b, 1, N, l]."""
    P = x_dbl[:, lo:hi]
    if bias is not None:
        P = P + bias.to(P.dtype)
    if rms_weight is not None:
        P = _rms_norm(P, rms_weight, eps)
    return P.reshape(batch, seqlen, 1, -1).permute(0, 2, 3, 1)


def _rms_norm_given(P, name, weight, weight_name, eps):
    """A given variable B or C ([batch, (groups,) dstate, seqlen]) RMS-normed over dstate, as
    mamba-ssm norms a given [batch, 1, dstate, seqlen] one; a constant one is refused."""
    if not isinstance(P, torch.Tensor) or P.dim() not in (3, 4):
        raise ValueError(f"{weight_name}: the RMS norm needs a variable {name} [batch, "
                         f"(groups,) dstate, seqlen], got {name} of shape "
                         f"{list(getattr(P, 'shape', []))}")
    return _rms_norm(P.transpose(-1, -2), weight, eps).transpose(-1, -2)


def mamba_inner_fn(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight,
                   out_proj_weight, out_proj_bias, A, B=None, C=None, D=None, delta_bias=None,
                   B_proj_bias=None, C_proj_bias=None, delta_softplus=True, checkpoint_lvl=1,
                   b_rms_weight=None, c_rms_weight=None, dt_rms_weight=None,
                   b_c_dt_rms_eps=1e-6):
    """The fused Mamba1 mixer, mamba-ssm's `mamba_inner_fn`: x, z = xz's halves along dim;
    x <- silu(causal_conv1d(x)) (linseq); x_dbl = x W_x^T; delta = W_dt x_dbl[:, :rank];
    B, C = the next dstate columns each (unless given) plus B_proj_bias / C_proj_bias, then
    RMSNorm over dstate by b_rms_weight / c_rms_weight (a given variable B / C too; the
    projection biases apply to the projected B / C only) and of delta by dt_rms_weight;
    y = selective_scan(x, delta, A, B, C, D, z, delta_bias, delta_softplus) (linseq);
    out = y^T W_out^T + out_proj_bias. torch does the matmuls and norms, linseq the conv and
    the scan; autograd reaches every input (the norms' gradients included).
    xz [batch, 2*dim, seqlen]; returns out [batch, seqlen, out_dim].
    checkpoint_lvl (0 or 1) only chooses what mamba-ssm recomputes; it is checked, not used.
    """
    if checkpoint_lvl not in (0, 1):
        raise ValueError(f"checkpoint_lvl: expected 0 or 1, got {checkpoint_lvl!r}")
    A = _real_tensor(A, "A")
    xz = _real_tensor(xz, "xz")
    if xz.dim() != 3 or xz.shape[1] % 2:
        raise ValueError(f"xz: expected [batch, 2*dim, seqlen], got {list(xz.shape)}")
    batch, _, seqlen = xz.shape
    x, z = xz.chunk(2, dim=1)
    dim = x.shape[1]
    rank = delta_proj_weight.shape[1]
    dstate = A.shape[-1]
    w = conv1d_weight.reshape(conv1d_weight.shape[0], conv1d_weight.shape[-1])
    # token-major outputs ([b, l, d] memory) where the projections read tokens as rows
    conv_out, _ = _conv(x, w, conv1d_bias, None, "silu", token_major=True)
    conv_out = conv_out.to(xz.dtype)                                   # [b, d, l] view
    x_dbl = F.linear(conv_out.transpose(1, 2).reshape(batch * seqlen, dim), x_proj_weight)
    delta = F.linear(x_dbl[:, :rank], delta_proj_weight)               # [(b l), d]
    if dt_rms_weight is not None:
        delta = _rms_norm(delta, dt_rms_weight, b_c_dt_rms_eps)
    if B is None:
        B = _projected(x_dbl, rank, rank + dstate, B_proj_bias, b_rms_weight, b_c_dt_rms_eps,
                       batch, seqlen)
    elif b_rms_weight is not None:
        B = _rms_norm_given(B, "B", b_rms_weight, "b_rms_weight", b_c_dt_rms_eps)
    if C is None:
        C = _projected(x_dbl, x_dbl.shape[1] - dstate, x_dbl.shape[1], C_proj_bias,
                       c_rms_weight, b_c_dt_rms_eps, batch, seqlen)
    elif c_rms_weight is not None:
        C = _rms_norm_given(C, "C", c_rms_weight, "c_rms_weight", b_c_dt_rms_eps)
    delta = delta.reshape(batch, seqlen, dim).transpose(1, 2)
    y, _ = _scan_mamba_layout(conv_out, delta, A, B, C, D, z, delta_bias, delta_softplus,
                              token_major=True)
    return F.linear(y.transpose(1, 2).to(xz.dtype), out_proj_weight, out_proj_bias)
