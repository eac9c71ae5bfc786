"""torch.func over linseq's PyTorch functions: grad, vmap, vmap of grad (per-sample
gradients) and jacrev give what plain autograd and per-sample calls give; what is not
available (a second derivative, forward mode) is refused with a linseq error that names it."""

import pytest

from conftest import require

torch = require("torch")
import linseq  # noqa: E402

B, T, H, K, V = 1, 13, 2, 8, 6
NAMES = ("q", "k", "v", "g", "beta")


def _inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    return dict(q=torch.randn(B, T, H, K, generator=gen), k=torch.randn(B, T, H, K, generator=gen),
                v=torch.randn(B, T, H, V, generator=gen),
                g=-torch.rand(B, T, H, K, generator=gen),
                beta=torch.rand(B, T, H, generator=gen))


def _loss(q, k, v, g, beta):
    o, h = linseq.chunk_kda(q, k, v, g, beta, output_final_state=True,
                            use_qk_l2norm_in_kernel=True, chunk_size=16)
    return (o * o).sum() + (h * torch.linspace(-1, 1, h.numel()).reshape(h.shape)).sum()


def _autograd(fn, a):
    leaves = [a[n].clone().requires_grad_() for n in NAMES]
    return torch.autograd.grad(fn(*leaves), leaves)


def test_grad_equals_autograd():
    a = _inputs(0)
    got = torch.func.grad(_loss, argnums=tuple(range(5)))(*(a[n] for n in NAMES))
    for name, x, y in zip(NAMES, got, _autograd(_loss, a)):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def test_grad_of_the_ejkernel_name():
    a = _inputs(1)

    def loss(q, v):
        o, h = linseq.kernel_delta_attention(q, a["k"], v, a["beta"], a["g"])
        return (o * o).sum() + h.sum()
    dq, dv = torch.func.grad(loss, argnums=(0, 1))(a["q"], a["v"])
    q, v = a["q"].clone().requires_grad_(), a["v"].clone().requires_grad_()
    want = torch.autograd.grad(loss(q, v), (q, v))
    torch.testing.assert_close(dq, want[0], rtol=0, atol=0)
    torch.testing.assert_close(dv, want[1], rtol=0, atol=0)


def test_vmap_equals_per_sample_calls():
    samples = [_inputs(s) for s in (2, 3, 4)]
    stacked = {n: torch.stack([s[n] for s in samples]) for n in NAMES}

    def run(q, k, v, g, beta):
        return linseq.chunk_kda(q, k, v, g, beta, output_final_state=True)
    o, h = torch.func.vmap(run)(*(stacked[n] for n in NAMES))
    for i, s in enumerate(samples):
        want_o, want_h = run(*(s[n] for n in NAMES))
        torch.testing.assert_close(o[i], want_o, rtol=0, atol=0)
        torch.testing.assert_close(h[i], want_h, rtol=0, atol=0)
    # a shared (unmapped) argument
    o2, _ = torch.func.vmap(run, in_dims=(0, None, None, None, None))(
        stacked["q"], *(samples[0][n] for n in NAMES[1:]))
    torch.testing.assert_close(o2[2], run(samples[2]["q"], *(samples[0][n] for n in NAMES[1:]))[0],
                               rtol=0, atol=0)


def test_per_sample_gradients():
    samples = [_inputs(s) for s in (5, 6)]
    stacked = [torch.stack([s[n] for s in samples]) for n in NAMES]
    grads = torch.func.vmap(torch.func.grad(_loss, argnums=(0, 3)))(*stacked)
    for i, s in enumerate(samples):
        want = _autograd(_loss, s)
        torch.testing.assert_close(grads[0][i], want[0], rtol=0, atol=0)
        torch.testing.assert_close(grads[1][i], want[3], rtol=0, atol=0)


def test_jacrev():
    a = _inputs(7)

    def out(v):
        return linseq.chunk_kda(a["q"], a["k"], v, a["g"], a["beta"])[0][0, -1, 0]
    jac = torch.func.jacrev(out)(a["v"])
    v = a["v"].clone().requires_grad_()
    o = out(v)
    for j in range(V):
        (row,) = torch.autograd.grad(o[j], v, retain_graph=True)
        torch.testing.assert_close(jac[j], row, rtol=0, atol=0)


def test_what_is_not_available_is_named():
    a = _inputs(8)
    with pytest.raises(RuntimeError, match="linseq: a second derivative"):
        torch.func.grad(lambda q: torch.func.grad(_loss)(q, a["k"], a["v"], a["g"],
                                                         a["beta"]).sum())(a["q"])
    with pytest.raises(NotImplementedError, match="linseq: forward-mode"):
        torch.func.jvp(lambda q: _loss(q, a["k"], a["v"], a["g"], a["beta"]), (a["q"],),
                       (a["q"],))
