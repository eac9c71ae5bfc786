"""linseq.kernel_delta_attention keeps the kernel-level contract the package was released
with: `output, state = kernel_delta_attention(q, k, v, beta, decay, chunk_size=16)`, the
pair always, for one batch row and for several (where unpacking the output alone would raise
or silently split the batch), in NumPy, PyTorch and JAX, through the top-level name and
through linseq.torch's and linseq.jax's. ejkernel's module-level contract (the output
alone) stays with linseq.compat.ejkernel. Values against the float64 loop of naive.py."""

import numpy as np
import pytest

from conftest import require

torch = require("torch")
import linseq  # noqa: E402
import linseq.torch  # noqa: E402
import naive  # noqa: E402
from linseq.compat import ejkernel  # noqa: E402

f32 = np.float32
T, H, K, V = 23, 2, 8, 6


def inputs(B, seed=0):
    rng = np.random.default_rng(seed)
    return dict(q=rng.standard_normal((B, T, H, K)).astype(f32),
                k=rng.standard_normal((B, T, H, K)).astype(f32),
                v=rng.standard_normal((B, T, H, V)).astype(f32),
                beta=rng.uniform(0.1, 0.9, (B, T, H)).astype(f32),
                decay=(-0.5 * rng.random((B, T, H, K))).astype(f32))


def reference(a):
    t = {n: torch.as_tensor(x) for n, x in a.items()}
    return naive.kda(t["q"], t["k"], t["v"], t["decay"], t["beta"], l2=True)


def close(name, got, want, tol=2e-5):
    got = (got if isinstance(got, torch.Tensor) else torch.as_tensor(np.array(got))).double()
    assert tuple(got.shape) == tuple(want.shape), f"{name}: shape {tuple(got.shape)} != " \
                                                  f"{tuple(want.shape)}"
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    assert err <= tol, f"{name}: max rel err {err:.3g} > {tol}"


def _seed_example(fn, q, k, v, beta, decay):
    """The call as the package's first documentation wrote it."""
    output, state = fn(q, k, v, beta, decay, chunk_size=16)
    return output, state


@pytest.mark.parametrize("B", [1, 2])
def test_numpy(B):
    a = inputs(B)
    o_ref, h_ref = reference(a)
    output, state = _seed_example(linseq.kernel_delta_attention, a["q"], a["k"], a["v"],
                                  a["beta"], a["decay"])
    assert isinstance(output, np.ndarray) and output.dtype == f32
    close("output", output, o_ref)
    close("state", state, h_ref)


@pytest.mark.parametrize("B", [1, 2])
@pytest.mark.parametrize("name", ["linseq", "linseq.torch"])
def test_torch(B, name):
    a = inputs(B, seed=1)
    fn = linseq.kernel_delta_attention if name == "linseq" else \
        linseq.torch.kernel_delta_attention
    t = {n: torch.tensor(x, requires_grad=True) for n, x in a.items()}
    output, state = _seed_example(fn, t["q"], t["k"], t["v"], t["beta"], t["decay"])
    o_ref, h_ref = reference(a)
    close("output", output.detach(), o_ref)
    close("state", state.detach(), h_ref)
    (output.sum() + state.sum()).backward()   # both halves of the pair are differentiable
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in t.values())


@pytest.mark.parametrize("B", [1, 2])
@pytest.mark.parametrize("name", ["linseq", "linseq.jax"])
def test_jax(B, name):
    jnp = require("jax.numpy")
    import linseq.jax
    a = inputs(B, seed=2)
    fn = linseq.kernel_delta_attention if name == "linseq" else linseq.jax.kernel_delta_attention
    j = {n: jnp.asarray(x) for n, x in a.items()}
    output, state = _seed_example(fn, j["q"], j["k"], j["v"], j["beta"], j["decay"])
    o_ref, h_ref = reference(a)
    close("output", output, o_ref)
    close("state", state, h_ref)


def test_kda_is_the_same_contract():
    a = inputs(2, seed=3)
    args = (a["q"], a["k"], a["v"], a["beta"], a["decay"])
    pair = linseq.kernel_delta_attention(*args, use_chunked=False)
    np.testing.assert_array_equal(pair[0], linseq.kda(*args, use_chunked=False)[0])
    np.testing.assert_array_equal(pair[1], linseq.kda(*args, use_chunked=False)[1])


def test_module_level_contract_stays_in_compat_ejkernel():
    a = inputs(2, seed=4)
    args = (a["q"], a["k"], a["v"], a["beta"], a["decay"])
    assert linseq.kernel_delta_attention is not ejkernel.kernel_delta_attention
    o_ref, h_ref = reference(a)
    out = ejkernel.kernel_delta_attention(*args, chunk_size=16)
    assert isinstance(out, np.ndarray)
    close("output", out, o_ref)
    out, state = ejkernel.kernel_delta_attention(*args, return_state=True)
    close("state", state, h_ref)
    # the module-level keywords at the top-level name: refused, saying where they belong
    for keyword in ("return_state", "platform", "cfg"):
        with pytest.raises(TypeError, match="linseq.compat.ejkernel"):
            linseq.kernel_delta_attention(*args, **{keyword: None})
