"""The top-level functions that build ctypes structs in their checks (linseq.kda_decode,
linseq.kda, linseq.kernel_delta_attention) compile under torch.compile(fullgraph=True) with
PyTorch tensors, as linseq.torch's do: they run as non-strict traced blocks over linseq's
custom ops, with the results of eager calls (the decode pool updated in place)."""

import pytest

from conftest import require

torch = require("torch")
import linseq  # noqa: E402
from linseq import _torch_ops  # noqa: E402

pytestmark = pytest.mark.skipif(not _torch_ops.AVAILABLE,
                                reason="torch.library.custom_op needs PyTorch 2.4+")

B, H, K, V = 3, 2, 8, 6


def _tokens(T, seed, grad=False):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen)
    g = -torch.rand(B, T, H, K, generator=gen)
    beta = torch.rand(B, T, H, generator=gen)
    return [x.requires_grad_(grad) for x in (q, k, v, g, beta)]


def test_kda_decode_in_place_compiles():
    q, k, v, g, beta = (x[:, 0] for x in _tokens(1, seed=0))
    pool = 0.3 * torch.randn(5, H, K, V, generator=torch.Generator().manual_seed(1))
    rows = torch.tensor([4, -1, 1])
    want_pool = pool.clone()
    want_o, _ = linseq.kda_decode(q, k, v, g, beta, want_pool, rows, inplace=True,
                                  use_qk_l2norm_in_kernel=True)

    def step(q, k, v, g, beta, state):
        o, new = linseq.kda_decode(q, k, v, g, beta, state, rows, inplace=True,
                                   use_qk_l2norm_in_kernel=True)
        return o * 1.0, new

    torch._dynamo.reset()
    o, new = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, g, beta, pool)
    torch.testing.assert_close(o, want_o, rtol=0, atol=0)
    torch.testing.assert_close(pool, want_pool, rtol=0, atol=0)
    assert new.data_ptr() == pool.data_ptr()


def test_kda_decode_new_pool_compiles():
    q, k, v, g, beta = (x[:, 0] for x in _tokens(1, seed=2))
    pool = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(3))
    before = pool.clone()
    want_o, want_pool = linseq.kda_decode(q, k, v, g, beta, pool)
    torch._dynamo.reset()
    o, new = torch.compile(lambda *a: linseq.kda_decode(*a), fullgraph=True,
                           backend="aot_eager")(q, k, v, g, beta, pool)
    torch.testing.assert_close(o, want_o, rtol=0, atol=0)
    torch.testing.assert_close(new, want_pool, rtol=0, atol=0)
    torch.testing.assert_close(pool, before, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["kda", "kernel_delta_attention"])
def test_kda_compiles_forward_and_backward(name):
    args = _tokens(19, seed=4, grad=True)
    fn = getattr(linseq, name)

    def step(q, k, v, g, beta):
        o, h = fn(q, k, v, beta, g, chunk_size=16)
        return (o * o).sum() + h.sum()

    want = step(*args)
    want_grads = torch.autograd.grad(want, args)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*args)
    got_grads = torch.autograd.grad(got, args)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)
