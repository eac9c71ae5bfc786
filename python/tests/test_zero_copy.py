"""Contiguous float32 inputs reach the kernels without a copy, from NumPy, PyTorch and JAX:
the pointer the C library receives is the caller's own. Anything else is converted once."""

import numpy as np

import linseq
from linseq import ops
from conftest import require


def _kda_inputs(make, B=2, T=9, H=2, K=8, V=4):
    rng = np.random.default_rng(0)
    arrays = dict(q=rng.standard_normal((B, T, H, K)), k=rng.standard_normal((B, T, H, K)),
                  v=rng.standard_normal((B, T, H, V)), g=-rng.random((B, T, H, K)),
                  beta=rng.random((B, T, H)))
    return {n: make(a.astype(np.float32)) for n, a in arrays.items()}


def _run(a):
    return linseq.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"])


def test_numpy_arrays_are_not_copied(seen_pointers):
    a = _kda_inputs(lambda x: x)
    _run(a)
    for name, arr in a.items():
        assert linseq.data_pointer(arr) in seen_pointers, name


def test_torch_tensors_are_not_copied(seen_pointers):
    torch = require("torch")
    a = _kda_inputs(torch.from_numpy)
    a["q"].requires_grad_(True)  # still shared: the kernels read the detached storage
    o, _ = _run(a)
    for name, t in a.items():
        assert t.data_ptr() in seen_pointers, name
    assert isinstance(o, torch.Tensor)


def test_jax_arrays_are_not_copied(seen_pointers):
    jnp = require("jax.numpy")
    a = _kda_inputs(jnp.asarray)
    arrays = {n: ops.as_f32(x, n) for n, x in a.items()}
    for name, x in a.items():
        assert linseq.data_pointer(arrays[name]) == x.unsafe_buffer_pointer(), name
    o, _ = linseq.ops.kda_forward(ops.KdaInputs(arrays["q"], arrays["k"], arrays["v"],
                                                arrays["beta"], arrays["g"]))
    for name, x in a.items():
        assert x.unsafe_buffer_pointer() in seen_pointers, name


def test_other_layouts_and_dtypes_are_converted_once():
    a = _kda_inputs(lambda x: x)
    want, _ = _run(a)
    q64 = a["q"].astype(np.float64)
    q_strided = np.asfortranarray(a["q"])
    for q in (q64, q_strided, a["q"].astype(np.float16).astype(np.float32)[...]):
        conv = ops.as_f32(q, "q")
        assert conv.dtype == np.float32 and conv.flags.c_contiguous
    got, _ = linseq.chunk_kda(q64, a["k"], a["v"], a["g"], a["beta"])
    np.testing.assert_array_equal(got, want)
    got, _ = linseq.chunk_kda(q_strided, a["k"], a["v"], a["g"], a["beta"])
    np.testing.assert_array_equal(got, want)


def test_torch_bfloat16_and_noncontiguous():
    torch = require("torch")
    a = _kda_inputs(torch.from_numpy)
    want, _ = _run(a)
    q_t = a["q"].transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    assert not q_t.is_contiguous()
    got, _ = linseq.chunk_kda(q_t, a["k"], a["v"], a["g"], a["beta"])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    bf = {n: t.to(torch.bfloat16) for n, t in a.items()}
    o, _ = linseq.chunk_kda(bf["q"], bf["k"], bf["v"], bf["g"], bf["beta"])
    assert o.dtype == torch.bfloat16  # fla's rule: o in v's dtype
    ref, _ = linseq.chunk_kda(*(bf[n].float() for n in ("q", "k", "v", "g", "beta")))
    torch.testing.assert_close(o.float(), ref, rtol=1e-2, atol=1e-2)


def test_decode_updates_the_callers_pool_in_place():
    torch = require("torch")
    rng = np.random.default_rng(3)
    R, B, H, K, V = 5, 3, 2, 8, 4
    pool = torch.from_numpy(rng.standard_normal((R, H, K, V)).astype(np.float32))
    ptr_before = pool.data_ptr()
    before = pool.clone()
    step = _kda_inputs(torch.from_numpy, B=B, T=1, H=H, K=K, V=V)
    rows = torch.tensor([4, -1, 1])
    o, out_pool = linseq.kda_decode(step["q"], step["k"], step["v"], step["g"], step["beta"],
                                    pool, rows, inplace=True)
    assert out_pool is pool and pool.data_ptr() == ptr_before
    assert not torch.equal(pool[4], before[4]) and not torch.equal(pool[1], before[1])
    for untouched in (0, 2, 3):
        assert torch.equal(pool[untouched], before[untouched])
    assert torch.count_nonzero(o[1]) == 0  # a padding request's output is zero
