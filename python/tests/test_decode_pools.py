"""A state pool updated in place must give every row memory of its own: a pool whose rows
(or the elements of a row) share memory, such as torch.zeros(1, D, W-1).expand(3, D, W-1),
is refused by every decode surface with a ValueError naming it, and nothing is written.
Before, the drop-ins took such a pool through a float32 copy of its rows: each request
started from the shared row, and the row kept the last request's new state. Dense, sliced
and transposed pools are still taken."""

import numpy as np
import pytest

import linseq
from linseq import ops
from conftest import require

SHARED = r"^{}: a pool whose rows share memory"

b, d, n, W = 3, 6, 4, 4


def _views(torch, shape):
    """Pools whose elements share memory, over a fresh storage each: (description, pool)."""
    R, rest = shape[0], shape[1:]
    row = int(np.prod(rest))
    return [
        ("expanded rows", torch.randn(1, *rest).expand(*shape)),
        ("overlapping rows", torch.as_strided(torch.randn(row + R), shape,
                                              (1,) + torch.empty(rest).stride())),
        ("expanded channels", torch.randn(R, 1, *rest[1:]).expand(*shape)),
    ]


@pytest.mark.parametrize("rows", [False, True])
def test_causal_conv1d_update_refuses_a_shared_pool(rows):
    torch = require("torch")
    from linseq.compat.causal_conv1d import causal_conv1d_update
    x, weight = torch.randn(b, d), torch.randn(d, W)
    for what, pool in _views(torch, (b, d, W - 1)):
        before = pool.clone()
        kwargs = dict(conv_state_indices=torch.tensor([2, 0, 1])) if rows else {}
        with pytest.raises(ValueError, match=SHARED.format("conv_state")):
            causal_conv1d_update(x, pool, weight, activation="silu", **kwargs)
        assert torch.equal(pool, before), what


@pytest.mark.parametrize("heads", [False, True])
@pytest.mark.parametrize("rows", [False, True])
def test_selective_state_update_refuses_a_shared_pool(heads, rows):
    torch = require("torch")
    from linseq.compat.mamba_ssm import selective_state_update
    shape = (b, 2, d, n) if heads else (b, d, n)
    lead = (b, 2) if heads else (b,)
    x, dt = torch.randn(*lead, d), torch.rand(*lead, d)
    A = -torch.rand(*shape[1:])
    B, C = torch.randn(b, n), torch.randn(b, n)
    for what, pool in _views(torch, shape):
        before = pool.clone()
        kwargs = dict(state_batch_indices=torch.tensor([1, 2, 0])) if rows else {}
        with pytest.raises(ValueError, match=SHARED.format("state")):
            selective_state_update(pool, x, dt, A, B, C, **kwargs)
        assert torch.equal(pool, before), what


def test_kda_decode_refuses_a_shared_pool_by_the_same_check():
    torch = require("torch")
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((b, 1, 2, 4)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((b, 1, 2, 3)).astype(np.float32)
    g, beta = -rng.random((b, 1, 2, 4)).astype(np.float32), rng.random((b, 1, 2)).astype(
        np.float32)
    for what, pool in _views(torch, (b, 2, 4, 3)):
        for given in (pool, pool.numpy()):
            with pytest.raises(ValueError, match=SHARED.format("state")):
                linseq.kda_decode(q, k, v, g, beta, given, inplace=True)


def test_numpy_decodes_refuse_a_shared_pool():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((b, 1, d)).astype(np.float32)
    pool = np.broadcast_to(np.zeros((1, d), np.float32), (b, d))
    with pytest.raises(ValueError, match=SHARED.format("state")):
        ops.decode("ema", {"x": x, "a": np.full(d, 0.5, np.float32)}, pool)
    inputs = ops.Ssm1Inputs(x, rng.random((b, 1, d)).astype(np.float32),
                            -rng.random((d, n)).astype(np.float32),
                            rng.standard_normal((b, 1, n)).astype(np.float32),
                            rng.standard_normal((b, 1, n)).astype(np.float32))
    with pytest.raises(ValueError, match=SHARED.format("state")):
        ops.ssm1_decode(inputs, np.broadcast_to(np.zeros((1, d, n), np.float32), (b, d, n)))
    conv = ops.Conv1dInputs(x, rng.standard_normal((d, W)).astype(np.float32))
    with pytest.raises(ValueError, match=SHARED.format("state")):
        ops.conv1d_decode(conv, np.broadcast_to(np.zeros((1, d, W), np.float32), (b, d, W)))


def test_sliced_and_transposed_pools_are_taken():
    """The check refuses shared memory only: a pool sliced out of a larger buffer, or
    causal-conv1d's channel-last conv_state, is updated where it lies, with the bits of a
    dense copy."""
    torch = require("torch")
    from linseq.compat.causal_conv1d import causal_conv1d_update
    from linseq.compat.mamba_ssm import selective_state_update
    g = torch.Generator().manual_seed(3)
    x, weight = torch.randn(b, d, generator=g), torch.randn(d, W, generator=g)
    for pool in (torch.randn(b, d + 2, W + 1, generator=g)[:, 1:-1, 1:],
                 torch.randn(b, W - 1, d, generator=g).transpose(1, 2)):
        dense = pool.clone()
        y = causal_conv1d_update(x, pool, weight, activation="silu")
        want = causal_conv1d_update(x, dense, weight, activation="silu")
        assert torch.equal(y, want) and torch.equal(pool, dense)
    A, B = -torch.rand(d, n, generator=g), torch.randn(b, n, generator=g)
    pool = torch.randn(2 * b, d, n, generator=g)[::2]
    dense = pool.clone()
    y = selective_state_update(pool, x, x.abs(), A, B, B)
    want = selective_state_update(dense, x, x.abs(), A, B, B)
    assert torch.equal(y, want) and torch.equal(pool, dense)
