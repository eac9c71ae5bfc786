"""linseq.compat.causal_conv1d against float64 definitions written here: causal_conv1d_fn
forward and backward (dtypes, channel-first and channel-last x, bias, activation, widths,
initial and final states, seq_idx), causal_conv1d_update (plain and circular state rows, a
pool of rows with padding requests), causal_conv1d_varlen_states, and the refusals."""

import itertools

import pytest

from conftest import require

torch = require("torch")
from linseq.compat import causal_conv1d as cc  # noqa: E402

# relative tolerance of outputs and of the x / initial_states gradients per input dtype (the
# result is rounded to it); weight and bias gradients stay float32 parameters
TOL = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def _rel(got, want):
    got, want = got.detach().double(), want.detach().double()
    return (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)


# ------------------------------------------------------------------------------------------
# float64 definitions
# ------------------------------------------------------------------------------------------

def conv_def(x, weight, bias=None, prev=None, silu=False, seq_idx=None):
    """y[b,d,t] = act(bias[d] + sum_j weight[d,j] * s[b,d,t-W+1+j]) over s = prev ++ x
    (prev: the W-1 inputs before x, zeros when None); with seq_idx a tap counts only when
    its token carries the output token's index, and an output with a negative index is 0.
    Returns (y, the last W-1 entries of s). Everything in float64, differentiable."""
    x = x.double()
    batch, dim, seqlen = x.shape
    W = weight.shape[1]
    if prev is None:
        prev = torch.zeros(batch, dim, W - 1, dtype=torch.float64)
    s = torch.cat([prev.double(), x], dim=2)
    cols = []
    for t in range(seqlen):
        acc = torch.zeros(batch, dim, dtype=torch.float64)
        if bias is not None:
            acc = acc + bias.double()
        for j in range(W):
            src = t - W + 1 + j                      # token index of this tap
            tap = weight[:, j].double() * s[:, :, t + j]
            if seq_idx is not None:
                same = seq_idx[:, src] == seq_idx[:, t] if src >= 0 else \
                    torch.zeros(batch, dtype=torch.bool)
                tap = tap * same[:, None].double()
            acc = acc + tap
        if silu:
            acc = acc * torch.sigmoid(acc)
        if seq_idx is not None:
            acc = acc * (seq_idx[:, t] >= 0)[:, None].double()
        cols.append(acc)
    return torch.stack(cols, dim=2), s[:, :, s.shape[2] - (W - 1):]


def update_def(x, rows_state, weight, bias, silu, cache_seqlens):
    """Decode of seqlen tokens per request on its own state row [d, S] (float64 copies):
    the row read in time order (a circular row starts at its next write position
    cache_seqlen % S, its oldest entry), the tokens appended, the conv over the last W-1
    entries and the tokens; the row after: the last S entries in time order, written back
    in its own storage order. Returns (y [b, d, l], the new rows [b, d, S])."""
    batch, dim, seqlen = x.shape
    S, W = rows_state.shape[2], weight.shape[1]
    ys, new_rows = [], []
    for b in range(batch):
        row = rows_state[b].double()
        shift = 0 if cache_seqlens is None else int(cache_seqlens[b]) % S
        ordered = torch.roll(row, -shift, dims=1)    # oldest first
        s = torch.cat([ordered, x[b].double()], dim=1)
        y, _ = conv_def(x[b:b + 1], weight, bias, prev=ordered[None, :, S - (W - 1):],
                        silu=silu)
        ys.append(y[0])
        new_rows.append(torch.roll(s[:, -S:], shift + seqlen, dims=1) if cache_seqlens is not
                        None else s[:, -S:])
    return torch.stack(ys), torch.stack(new_rows)


def _x(batch, dim, seqlen, dtype, channel_last, gen):
    if channel_last:  # a transposed [batch, seqlen, dim] view, as Mamba layers pass it
        return torch.randn(batch, seqlen, dim, generator=gen).to(dtype).transpose(1, 2)
    return torch.randn(batch, dim, seqlen, generator=gen).to(dtype)


# ------------------------------------------------------------------------------------------
# causal_conv1d_fn
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channel_last", [False, True])
@pytest.mark.parametrize("has_initial,return_final", [(False, False), (True, False),
                                                      (False, True), (True, True)])
@pytest.mark.parametrize("activation", [None, "silu", "swish"])
@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("width", [2, 3, 4])
def test_fn_forward_backward(dtype, channel_last, has_initial, return_final, activation,
                             has_bias, width):
    gen = torch.Generator().manual_seed(width * 7 + has_bias)
    batch, dim, seqlen = 2, 6, 11
    x = _x(batch, dim, seqlen, dtype, channel_last, gen).requires_grad_()
    weight = torch.randn(dim, width, generator=gen, requires_grad=True)
    bias = torch.randn(dim, generator=gen, requires_grad=True) if has_bias else None
    init = (torch.randn(batch, dim, width - 1, generator=gen).to(dtype).requires_grad_()
            if has_initial else None)
    res = cc.causal_conv1d_fn(x, weight, bias, initial_states=init,
                              return_final_states=return_final, activation=activation)
    out, final = res if return_final else (res, None)
    y_def, final_def = conv_def(x, weight, bias, init, silu=activation is not None)

    assert out.shape == (batch, dim, seqlen) and out.dtype == dtype
    assert (out.stride(1) == 1) == channel_last   # x's layout, as causal-conv1d allocates
    assert _rel(out, y_def) <= TOL[dtype]
    if return_final:
        assert final.shape == (batch, dim, width - 1) and final.dtype == dtype
        assert torch.equal(final.double(), final_def.to(dtype).double())  # a copy of inputs

    gen_up = torch.Generator().manual_seed(3)
    d_out = torch.randn(out.shape, generator=gen_up)
    loss = (out.double() * d_out).sum()
    loss_def = (y_def * d_out).sum()
    if return_final:  # the final states are differentiable, as in causal-conv1d
        d_fin = torch.randn(final.shape, generator=gen_up)
        loss = loss + (final.double() * d_fin).sum()
        loss_def = loss_def + (final_def * d_fin).sum()
    inputs = [t for t in (x, weight, bias, init) if t is not None]
    got = torch.autograd.grad(loss, inputs)
    want = torch.autograd.grad(loss_def, inputs)
    for t, g, w in zip(inputs, got, want):
        assert g.dtype == t.dtype and g.shape == t.shape
        tol = TOL[dtype] if t.dtype == dtype else 4 * TOL[dtype] if dtype != torch.float32 \
            else 2e-5
        assert _rel(g, w) <= tol


@pytest.mark.parametrize("width", [1, 6])
def test_fn_widths_beyond_the_peers(width):
    """causal-conv1d takes widths 2..4; linseq any width >= 1 (documented)."""
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(2, 5, 9, generator=gen)
    weight = torch.randn(5, width, generator=gen)
    out, final = cc.causal_conv1d_fn(x, weight, return_final_states=True, activation="silu")
    y_def, final_def = conv_def(x, weight, silu=True)
    assert _rel(out, y_def) <= 2e-5 and final.shape == (2, 5, width - 1)
    assert torch.equal(final.double(), final_def)
    for cache in (None, torch.tensor([3, 8], dtype=torch.int32)):
        state = torch.randn(2, 5, width - 1 + 2, generator=gen)
        before = state.clone()
        y = cc.causal_conv1d_update(x[:, :, :3], state, weight, cache_seqlens=cache)
        y_def, rows_def = update_def(x[:, :, :3], before, weight, None, False, cache)
        assert _rel(y, y_def) <= 2e-5 and torch.equal(state.double(), rows_def)


def test_update_width_one_keeps_no_state():
    """Width 1 with an empty conv_state [entries, dim, 0]: out = bias + weight * x for the
    named requests, 0 for padding ones, nothing to keep."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(3, 4, 2, generator=gen)
    weight, bias = torch.randn(4, 1, generator=gen), torch.randn(4, generator=gen)
    state = torch.zeros(5, 4, 0)
    rows = torch.tensor([4, -1, 0], dtype=torch.int32)
    out = cc.causal_conv1d_update(x, state, weight, bias, conv_state_indices=rows)
    want = bias[:, None] + weight * x
    assert _rel(out[[0, 2]], want[[0, 2]]) <= 2e-6 and torch.all(out[1] == 0)


def test_fn_writes_final_states_out():
    gen = torch.Generator().manual_seed(1)
    x = _x(2, 4, 7, torch.float32, True, gen)
    weight = torch.randn(4, 3, generator=gen)
    given = torch.full((2, 4, 2), 9.0)
    out, final = cc.causal_conv1d_fn(x, weight, return_final_states=True,
                                     final_states_out=given)
    assert final is given
    assert torch.equal(given.double(), conv_def(x, weight)[1])


def _runs(batch, seqlen, gen, padding):
    """seq_idx rows of increasing runs, optionally ending in padding (-1)."""
    rows = []
    for _ in range(batch):
        cuts = sorted(torch.randperm(seqlen - 1, generator=gen)[:3].add(1).tolist())
        row = torch.zeros(seqlen, dtype=torch.int32)
        for i, c in enumerate(cuts):
            row[c:] = i + 1
        if padding:
            row[seqlen - 3:] = -1
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channel_last", [False, True])
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("width", [2, 4])
def test_fn_seq_idx(dtype, channel_last, padding, width):
    gen = torch.Generator().manual_seed(width + 10 * padding)
    batch, dim, seqlen = 2, 5, 17
    seq_idx = _runs(batch, seqlen, gen, padding)
    x = _x(batch, dim, seqlen, dtype, channel_last, gen).requires_grad_()
    weight = torch.randn(dim, width, generator=gen, requires_grad=True)
    bias = torch.randn(dim, generator=gen, requires_grad=True)
    out = cc.causal_conv1d_fn(x, weight, bias, seq_idx=seq_idx, activation="silu")
    y_def, _ = conv_def(x, weight, bias, silu=True, seq_idx=seq_idx)
    assert out.dtype == dtype and _rel(out, y_def) <= TOL[dtype]
    if padding:
        assert torch.all(out[:, :, seqlen - 3:] == 0)
    d_out = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad((out.double() * d_out).sum(), (x, weight, bias))
    want = torch.autograd.grad((y_def * d_out).sum(), (x, weight, bias))
    for g, w in zip(got, want):
        assert _rel(g, w) <= (TOL[dtype] if dtype == torch.float32 else 4 * TOL[dtype])


def test_fn_seq_idx_refusals():
    x = torch.randn(1, 3, 8)
    weight = torch.randn(3, 4)
    back_again = torch.tensor([[0, 0, 1, 0, 0, 0, 0, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match="seq_idx"):
        cc.causal_conv1d_fn(x, weight, seq_idx=back_again)
    later = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0]], dtype=torch.int32)  # beyond width-1
    out = cc.causal_conv1d_fn(x, weight, seq_idx=later)
    assert _rel(out, conv_def(x, weight, seq_idx=later)[0]) <= 2e-5
    ok = torch.zeros(1, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="initial_states"):
        cc.causal_conv1d_fn(x, weight, seq_idx=ok, initial_states=torch.zeros(1, 3, 3))
    with pytest.raises(ValueError, match="return_final_states"):
        cc.causal_conv1d_fn(x, weight, seq_idx=ok, return_final_states=True)
    with pytest.raises(ValueError, match="seq_idx"):
        cc.causal_conv1d_fn(x, weight, seq_idx=torch.zeros(1, 7, dtype=torch.int32))
    with pytest.raises(TypeError, match="seq_idx"):
        cc.causal_conv1d_fn(x, weight, seq_idx=torch.zeros(1, 8))


# ------------------------------------------------------------------------------------------
# causal_conv1d_update
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("circular", [False, True])
@pytest.mark.parametrize("seqlen", [None, 1, 4, 5])
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("pool", ["batch", "rows", "rows+padding"])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_update(dtype, circular, seqlen, width, pool, activation):
    gen = torch.Generator().manual_seed(width * 13 + (seqlen or 0))
    batch, dim = 6, 8
    state_len = width - 1 + int(torch.randint(0, 4, (1,), generator=gen))
    entries = batch if pool == "batch" else 4 * batch
    x = torch.randn(batch, seqlen or 1, dim, generator=gen).to(dtype).transpose(1, 2)
    if seqlen is None:
        x = x[:, :, 0]                                   # [batch, dim]: one token
    conv_state = torch.randn(entries, state_len, dim, generator=gen).to(dtype).transpose(1, 2)
    weight = torch.randn(dim, width, generator=gen)
    bias = torch.randn(dim, generator=gen)
    rows = None
    if pool != "batch":
        rows = torch.randperm(entries, generator=gen)[:batch].to(torch.int32)
        if pool == "rows+padding":
            rows[::2] = -1
    cache = (torch.randint(0, 1024, (batch,), generator=gen, dtype=torch.int32)
             if circular else None)
    before = conv_state.clone()
    out = cc.causal_conv1d_update(x, conv_state, weight, bias, activation=activation,
                                  cache_seqlens=cache, conv_state_indices=rows)

    assert out.shape == x.shape and out.dtype == dtype
    x3 = x if seqlen is not None else x[:, :, None]
    idx = torch.arange(batch) if rows is None else rows.long()
    live = idx >= 0
    y_def, rows_def = update_def(x3[live], before[idx[live]], weight, bias,
                                 activation is not None, None if cache is None else cache[live])
    out3 = out if seqlen is not None else out[:, :, None]
    assert _rel(out3[live], y_def) <= TOL[dtype]
    assert torch.all(out3[~live] == 0)                     # padding requests
    assert torch.equal(conv_state[idx[live]].double(), rows_def)  # rows updated in place
    untouched = torch.ones(entries, dtype=torch.bool)
    untouched[idx[live]] = False
    assert torch.equal(conv_state[untouched], before[untouched])


def test_update_matches_a_sequence_run_in_one_call():
    """Decoding token by token from a circular row gives causal_conv1d_fn's outputs."""
    gen = torch.Generator().manual_seed(5)
    dim, width, state_len, seqlen = 4, 4, 5, 12
    x = torch.randn(1, dim, seqlen, generator=gen)
    weight = torch.randn(dim, width, generator=gen)
    full = cc.causal_conv1d_fn(x, weight, activation="silu")
    state = torch.zeros(1, dim, state_len)
    outs = [cc.causal_conv1d_update(x[:, :, t], state, weight, activation="silu",
                                    cache_seqlens=torch.tensor([t], dtype=torch.int32))
            for t in range(seqlen)]
    assert _rel(torch.stack(outs, dim=2), full) <= 2e-6


def test_update_refusals():
    x = torch.randn(2, 4)
    state = torch.zeros(2, 4, 3)
    w = torch.randn(4, 4)
    with pytest.raises(NotImplementedError, match="activation"):
        cc.causal_conv1d_update(x, state, w, activation="relu")
    with pytest.raises(ValueError, match="conv_state"):
        cc.causal_conv1d_update(x, torch.zeros(2, 4, 2), w)          # state_len < W-1
    with pytest.raises(ValueError, match="conv_state"):
        cc.causal_conv1d_update(x, torch.zeros(3, 4, 3), w)          # rows != batch
    with pytest.raises(TypeError, match="conv_state_indices"):
        cc.causal_conv1d_update(x, state, w, conv_state_indices=torch.zeros(2))
    with pytest.raises(ValueError, match="conv_state_indices"):
        cc.causal_conv1d_update(x, state, w, conv_state_indices=torch.tensor([0, 2]))
    for pool in (state, state.to(torch.float16)):    # a row shared by two requests
        with pytest.raises(ValueError, match="conv_state_indices: two requests"):
            cc.causal_conv1d_update(x, pool, w, conv_state_indices=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="cache_seqlens"):
        cc.causal_conv1d_update(x, state, w, cache_seqlens=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="weight"):
        cc.causal_conv1d_update(x, state, torch.randn(5, 4))
    with pytest.raises(ValueError, match="bias"):
        cc.causal_conv1d_update(x, state, w, bias=torch.zeros(3))
    assert torch.equal(state, torch.zeros(2, 4, 3))                 # nothing written


def test_fn_refusals():
    x = torch.randn(2, 4, 6)
    w = torch.randn(4, 3)
    with pytest.raises(NotImplementedError, match="activation"):
        cc.causal_conv1d_fn(x, w, activation="gelu")
    with pytest.raises(ValueError, match="x"):
        cc.causal_conv1d_fn(x[0], w)
    with pytest.raises(ValueError, match="weight"):
        cc.causal_conv1d_fn(x, torch.randn(3, 3))
    with pytest.raises(ValueError, match="initial_states"):
        cc.causal_conv1d_fn(x, w, initial_states=torch.zeros(2, 4, 3))
    with pytest.raises(ValueError, match="final_states_out"):
        cc.causal_conv1d_fn(x, w, return_final_states=True,
                            final_states_out=torch.zeros(2, 4, 3))
    with pytest.raises(ValueError, match="bias"):
        cc.causal_conv1d_fn(x, w, bias=torch.zeros(5))


# ------------------------------------------------------------------------------------------
# causal_conv1d_varlen_states
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("state_len", [1, 3, 20])
def test_varlen_states(dtype, state_len):
    gen = torch.Generator().manual_seed(state_len)
    seqlens = torch.randint(0, 12, (9,), generator=gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), seqlens.cumsum(0)])
    x = torch.randn(int(cu[-1]), 7, generator=gen).to(dtype)
    states = cc.causal_conv1d_varlen_states(x, cu, state_len)
    assert states.shape == (9, 7, state_len) and states.dtype == dtype
    for i, (lo, hi) in enumerate(itertools.pairwise(cu.tolist())):
        want = torch.zeros(7, state_len, dtype=dtype)
        n = min(hi - lo, state_len)
        if n:
            want[:, state_len - n:] = x[hi - n:hi].T
        assert torch.equal(states[i], want)


def test_varlen_states_refusals():
    x = torch.randn(10, 3)
    with pytest.raises(ValueError, match="cu_seqlens"):
        cc.causal_conv1d_varlen_states(x, torch.tensor([0, 5, 4]), 2)
    with pytest.raises(ValueError, match="cu_seqlens"):
        cc.causal_conv1d_varlen_states(x, torch.tensor([0, 11]), 2)
    with pytest.raises(ValueError, match="state_len"):
        cc.causal_conv1d_varlen_states(x, torch.tensor([0, 10]), 0)


# ------------------------------------------------------------------------------------------
# The caller's memory: what the kernel reads and writes is the caller's tensors themselves
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["contiguous", "channel-last view", "xz half"])
def test_fn_reads_and_writes_the_callers_memory(kernel_calls, layout):
    """A float32 x, contiguous [b, d, l], a transposed [b, l, d] tensor or one half of
    xz.chunk(2, dim=1), reaches the kernel as the caller's memory; out and dx are the
    arrays the kernel wrote, in x's layout: nothing transposed or copied."""
    gen = torch.Generator().manual_seed(6)
    batch, dim, seqlen, width = 2, 6, 13, 4
    if layout == "xz half":
        xz = torch.randn(batch, 2 * dim, seqlen, generator=gen).requires_grad_()
        x = xz.chunk(2, dim=1)[0]
    else:
        x = _x(batch, dim, seqlen, torch.float32, layout != "contiguous", gen).requires_grad_()
    weight = torch.randn(dim, width, generator=gen)
    bias = torch.randn(dim, generator=gen)
    out = cc.causal_conv1d_fn(x, weight, bias, activation="silu")
    d_out = torch.randn(out.shape, generator=gen)
    (dx,) = torch.autograd.grad((out * d_out).sum(), (x,))

    assert len(kernel_calls["Conv1dInputs"]) == 2  # the forward's problem, the backward's
    for inputs in kernel_calls["Conv1dInputs"]:
        assert inputs.problem.x == x.data_ptr()
        assert inputs.channel_first == (layout != "channel-last view")
    assert out.data_ptr() == kernel_calls["conv1d_forward"][0].ctypes.data
    if layout == "channel-last view":   # x's layout, as causal-conv1d allocates
        assert out.stride(1) == 1
    else:
        assert out.is_contiguous()
    if layout != "xz half":
        assert dx.data_ptr() == kernel_calls["conv1d_backward"][0]["dx"].ctypes.data
    assert _rel(out, conv_def(x, weight, bias, silu=True)[0]) <= 2e-5
    assert torch.equal(cc.causal_conv1d_fn(x.detach().contiguous(), weight, bias,
                                           activation="silu"), out.detach())


@pytest.mark.parametrize("circular", [False, True])
def test_update_decodes_in_the_callers_pool(kernel_calls, circular):
    """A float32 C-contiguous conv_state is the pool the kernel updates (no gather, no
    scatter; int32 rows and cache_seqlens passed on as int64) and x is read where it lies;
    a transposed or half-precision pool goes through a float32 copy of the named rows."""
    gen = torch.Generator().manual_seed(8)
    batch, dim, width, state_len, entries = 3, 5, 4, 6, 7
    x = torch.randn(batch, 2, dim, generator=gen).transpose(1, 2)
    conv_state = torch.randn(entries, dim, state_len, generator=gen)
    weight, bias = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    rows = torch.tensor([4, -1, 1], dtype=torch.int32)
    cache = torch.tensor([3, 0, 11], dtype=torch.int32) if circular else None
    before = conv_state.clone()
    out = cc.causal_conv1d_update(x, conv_state, weight, bias, "silu", cache, rows)
    assert kernel_calls["conv1d_decode"] == [conv_state.data_ptr()]
    assert kernel_calls["Conv1dInputs"][0].problem.x == x.data_ptr()
    live = rows >= 0
    y_def, rows_def = update_def(x[live], before[rows[live].long()], weight, bias, True,
                                 None if cache is None else cache[live])
    assert _rel(out[live], y_def) <= 2e-5 and torch.all(out[~live] == 0)
    assert torch.equal(conv_state[rows[live].long()].double(), rows_def)
    for other in (before.transpose(1, 2).contiguous().transpose(1, 2),
                  before.to(torch.float16)):
        out_other = cc.causal_conv1d_update(x, other, weight, bias, "silu", cache, rows)
        assert kernel_calls["conv1d_decode"][-1] != other.data_ptr()
        assert _rel(out_other, out) <= 2e-3 and _rel(other, conv_state) <= 2e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_update_every_request_padding(dtype):
    """Only padding requests: out is 0 and the pool is untouched, whatever its dtype."""
    gen = torch.Generator().manual_seed(10)
    state = torch.randn(3, 4, 5, generator=gen).to(dtype)
    before = state.clone()
    out = cc.causal_conv1d_update(torch.randn(2, 4, generator=gen), state,
                                  torch.randn(4, 3, generator=gen),
                                  conv_state_indices=torch.tensor([-1, -1]))
    assert torch.all(out == 0) and torch.equal(state, before)
