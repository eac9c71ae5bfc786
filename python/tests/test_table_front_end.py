"""The front end of an op from its table description alone (_opspec.generic): linseq.run,
linseq.torch.run and linseq.jax.run reach every op of the library's table, a new one
included, with no Python written for it. Checked on SSD (Mamba2) and the template EMA: the
framework calls give the bits of the NumPy table path (linseq.ops), which the reference
cases judge against float64; gradients through torch autograd and jax.grad are the table's
backward; torch.compile(fullgraph=True) runs the custom op without a graph break."""
import numpy as np
import pytest

import linseq
from conftest import require


def ssd_arrays(seed=0, B=2, T=37, H=4, P=8, N=4, G=2, z=True):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    a = dict(x=f(B, T, H, P), dt=rng.uniform(0.01, 0.2, (B, T, H)).astype(np.float32),
             A=-rng.uniform(0.5, 4, H).astype(np.float32), B=f(B, T, G, N), C=f(B, T, G, N),
             D=f(H), h0=f(B, H, P, N))
    if z:
        a["z"] = f(B, T, H, P)
    return a


def numpy_grads(op, arrays, outs, d_outs, **options):
    ups = [t["name"] for t in linseq._lib.op_tensors(op, "upstream")]
    return linseq.ops.backward(op, arrays, dict(zip(ups, d_outs)), **options)


def test_numpy_run_is_the_table_path():
    a = ssd_arrays()
    for got, want in zip(linseq.run("ssd", a), linseq.ops.run("ssd", a)):
        np.testing.assert_array_equal(got, want)
    # the options reach the library: the recurrent and chunked forms agree to rounding
    y_rec, _ = linseq.run("ssd", a, mode="recurrent")
    y_chk, _ = linseq.run("ssd", a, chunk_size=16)
    np.testing.assert_allclose(y_rec, y_chk, rtol=1e-4, atol=1e-5)
    x = np.random.default_rng(1).standard_normal((2, 5, 3)).astype(np.float32)
    y, hT = linseq.run("ema", {"x": x, "a": np.full(3, 0.5, np.float32)})
    np.testing.assert_array_equal(y, linseq.ops.run("ema", {"x": x,
                                                            "a": np.full(3, 0.5, np.float32)})[0])
    with pytest.raises(ValueError, match="mode"):
        linseq.run("ssd", a, mode="sideways")
    with pytest.raises(TypeError):
        linseq.run("ssd", a, no_such_option=True)


def test_torch_forward_and_backward_are_the_table_path():
    torch = require("torch")
    import linseq.torch as lt
    a = ssd_arrays(seed=2)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in a.items()}
    y, hT = lt.run("ssd", t, dt_softplus=False, D_per_channel=False)
    want = linseq.ops.run("ssd", a)
    assert np.array_equal(y.detach().numpy(), want[0])
    assert np.array_equal(hT.detach().numpy(), want[1])
    d_y, d_hT = np.ones_like(want[0]), np.full_like(want[1], 0.5)
    (y.sum() + 0.5 * hT.sum()).backward()
    g = numpy_grads("ssd", a, want, [d_y, d_hT])
    for name, tensor in t.items():
        assert np.array_equal(tensor.grad.numpy(), g["d" + name]), name


def test_torch_compile_fullgraph():
    torch = require("torch")
    import linseq.torch as lt
    a = {k: torch.tensor(v) for k, v in ssd_arrays(seed=3, z=False).items()}
    fn = torch.compile(lambda arrs: lt.run("ssd", arrs)[0] * 2, fullgraph=True)
    np.testing.assert_array_equal(fn(a).numpy(), 2 * linseq.ops.run(
        "ssd", {k: v.numpy() for k, v in a.items()})[0])


def test_torch_opcheck():
    torch = require("torch")
    from linseq import _opspec, _torch_ops
    if not _torch_ops.AVAILABLE:
        pytest.skip("this PyTorch has no torch.library.custom_op")
    spec = _opspec.SPECS["ssd"]
    arrays = {k: torch.tensor(v, requires_grad=True) for k, v in ssd_arrays(seed=4).items()}
    layout = _torch_ops.OPS[spec].layout
    args = tuple(layout.pack({n: arrays.get(n) for n in spec.arrays}, None, spec.options()))
    torch.library.opcheck(torch.ops.linseq.ssd.default, args + (True,))


def test_jax_forward_and_grad_are_the_table_path():
    require("jax")
    import jax
    import jax.numpy as jnp
    import linseq.jax as lj
    a = ssd_arrays(seed=5)
    j = {k: jnp.asarray(v) for k, v in a.items()}
    y, hT = lj.run("ssd", j)
    want = linseq.ops.run("ssd", a)
    assert np.array_equal(np.asarray(y), want[0]) and np.array_equal(np.asarray(hT), want[1])
    grads = jax.grad(lambda arrs: lj.run("ssd", arrs)[0].sum())(j)
    g = numpy_grads("ssd", a, want, [np.ones_like(want[0])])
    for name in a:
        assert np.array_equal(np.asarray(grads[name]), g["d" + name]), name
    jitted = jax.jit(lambda arrs: lj.run("ssd", arrs, chunk_size=32)[0])
    np.testing.assert_array_equal(np.asarray(jitted(j)),
                                  linseq.run("ssd", a, chunk_size=32)[0])
