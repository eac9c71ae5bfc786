"""bfloat16 storage through the Python front ends: KDA's inference forward (chunked and
recurrent) and decode take PyTorch torch.bfloat16 tensors and NumPy arrays of ml_dtypes'
bfloat16 as they lie, and return o in bfloat16.

The property (the library's, include/linseq.h): o equals the float32 call on the same values
widened to float32, rounded once to bfloat16 (torch's .to(torch.bfloat16) and ml_dtypes'
astype round to nearest even), and the final state equals the float32 call's, bit for bit.
The C call is spied on: it receives the caller's own data pointers and LINSEQ_DTYPE_BF16.
When a gradient is needed, or the per-token inputs are not all bfloat16, the float32 path
runs as before."""

import ctypes

import numpy as np
import pytest

from conftest import python_decode_bodies, require

torch = require("torch")
ml_dtypes = require("ml_dtypes")
import linseq  # noqa: E402
import linseq.torch as lt  # noqa: E402
from linseq import _lib, _torch_backend, _torch_ops, api, ops  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
TOKEN = ("q", "k", "v", "beta", "g")


@pytest.fixture
def c_calls(monkeypatch):
    """Per C entry (KDA's forward, training forward and decode), one dict per call: the
    pointers of the per-token inputs and of o as the library received them, and
    exec->dtype."""
    seen = {"linseq_kda_forward": [], "linseq_kda_forward_train": [], "linseq_kda_decode": []}

    def spy(name, o_index):
        real = getattr(_lib.lib, name)

        def call(problem, ex, *rest):
            p, e = problem._obj, ex._obj
            seen[name].append(dict({n: getattr(p, n) for n in TOKEN}, dtype=e.dtype,
                                   o=rest[o_index]))
            return real(problem, ex, *rest)
        monkeypatch.setattr(_lib.lib, name, call)

    spy("linseq_kda_forward", 0)
    spy("linseq_kda_forward_train", 0)
    spy("linseq_kda_decode", 3)
    python_decode_bodies(monkeypatch)
    return seen


def _values(B=2, T=21, H=2, HV=4, K=8, V=4, per_channel=True, seed=0):
    """Random float64 inputs (the callers round them to bfloat16; the reference then widens
    exactly the values the bfloat16 call reads)."""
    rng = np.random.default_rng(seed)
    g_shape = (B, T, HV, K) if per_channel else (B, T, HV)
    return dict(q=rng.standard_normal((B, T, H, K)), k=rng.standard_normal((B, T, H, K)),
                v=rng.standard_normal((B, T, HV, V)), beta=rng.random((B, T, HV)),
                g=-0.3 * rng.random(g_shape))


def _torch_bf16(values):
    return {n: torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
            for n, a in values.items()}


def _numpy_bf16(values):
    return {n: a.astype(np.float32).astype(BF16) for n, a in values.items()}


def _widened(arrays):
    if isinstance(arrays["q"], torch.Tensor):
        return {n: a.float() for n, a in arrays.items()}
    return {n: a.astype(np.float32) for n, a in arrays.items()}


def _bits(x):
    """The bfloat16 bits of a torch or NumPy bfloat16 array, for a bitwise comparison (NaN
    safe, -0 distinct from 0)."""
    if isinstance(x, torch.Tensor):
        assert x.dtype == torch.bfloat16
        return x.view(torch.int16).numpy()
    assert x.dtype == BF16
    return x.view(np.int16)


def _rounded(x):
    return x.to(torch.bfloat16) if isinstance(x, torch.Tensor) else x.astype(BF16)


def _assert_caller_pointers(call, arrays, o):
    assert call["dtype"] == ops.DTYPE_BF16
    for n in TOKEN:
        assert call[n] == linseq.data_pointer(arrays[n]), n
    assert call["o"] == linseq.data_pointer(o)


def _fla(mode, a, h0=None, cu=None):
    fn = lt.chunk_kda if mode == "chunked" else lt.fused_recurrent_kda
    if isinstance(a["q"], np.ndarray):
        fn = api.chunk_kda if mode == "chunked" else api.fused_recurrent_kda
    return fn(a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=h0,
              output_final_state=True, cu_seqlens=cu)


# ------------------------------------------------------------------------------------------
# the forward: equal to float32 on the widened values, rounded once; no copy
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("framework", ["torch", "numpy"])
@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
@pytest.mark.parametrize("per_channel", [True, False])
def test_forward_is_the_float32_forward_rounded_once(c_calls, framework, mode, per_channel):
    values = _values(per_channel=per_channel)
    a = (_torch_bf16 if framework == "torch" else _numpy_bf16)(values)
    h0 = np.random.default_rng(1).standard_normal((2, 4, 8, 4)).astype(np.float32)
    if framework == "torch":
        h0 = torch.from_numpy(h0)
    o, ht = _fla(mode, a, h0)
    _assert_caller_pointers(c_calls["linseq_kda_forward"][-1], a, o)
    o32, ht32 = _fla(mode, _widened(a), h0)
    assert c_calls["linseq_kda_forward"][-1]["dtype"] == ops.DTYPE_F32
    np.testing.assert_array_equal(_bits(o), _bits(_rounded(o32)))
    assert ht.dtype == ht32.dtype and str(ht.dtype).endswith("float32")
    np.testing.assert_array_equal(np.asarray(ht), np.asarray(ht32))


@pytest.mark.parametrize("framework", ["torch", "numpy"])
@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
def test_packed_sequences(c_calls, framework, mode):
    a = (_torch_bf16 if framework == "torch" else _numpy_bf16)(_values(B=1, T=30))
    cu = np.array([0, 7, 7, 30])
    if framework == "torch":
        cu = torch.from_numpy(cu)
    o, ht = _fla(mode, a, cu=cu)
    _assert_caller_pointers(c_calls["linseq_kda_forward"][-1], a, o)
    o32, ht32 = _fla(mode, _widened(a), cu=cu)
    np.testing.assert_array_equal(_bits(o), _bits(_rounded(o32)))
    assert tuple(ht.shape) == (3, 4, 8, 4)
    np.testing.assert_array_equal(np.asarray(ht), np.asarray(ht32))


def test_ejkernel_signature_answers_in_bfloat16(c_calls):
    """linseq.kda (ejkernel's signature) on NumPy bfloat16, with its in-kernel L2 norm."""
    a = _numpy_bf16(_values())
    o, ht = linseq.kda(a["q"], a["k"], a["v"], a["beta"], a["g"])
    _assert_caller_pointers(c_calls["linseq_kda_forward"][-1], a, o)
    w = _widened(a)
    o32, ht32 = linseq.kda(w["q"], w["k"], w["v"], w["beta"], w["g"])
    np.testing.assert_array_equal(_bits(o), _bits(o32.astype(BF16)))
    np.testing.assert_array_equal(ht, ht32)


def test_strided_bf16_is_copied_once_and_still_exact(c_calls):
    """A transposed bfloat16 tensor is made contiguous (no rounding: still bfloat16)."""
    a = _torch_bf16(_values())
    a["k"] = a["k"].transpose(0, 1).contiguous().transpose(0, 1)
    assert not a["k"].is_contiguous()
    o, _ = _fla("chunked", a)
    call = c_calls["linseq_kda_forward"][-1]
    assert call["dtype"] == ops.DTYPE_BF16 and call["k"] != a["k"].data_ptr()
    o32, _ = _fla("chunked", _widened(a))
    np.testing.assert_array_equal(_bits(o), _bits(o32.to(torch.bfloat16)))


@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
def test_options_in_the_kernel(c_calls, mode):
    """The raw gate with A_log, dt_bias (float32 parameters), the in-kernel L2 norm, logit
    beta and the state as [N,HV,V,K], through fla's keywords."""
    a = _torch_bf16(_values())
    rng = np.random.default_rng(3)
    params = dict(A_log=torch.from_numpy(rng.standard_normal(4).astype(np.float32)),
                  dt_bias=torch.from_numpy(rng.standard_normal(32).astype(np.float32)))
    fn = lt.chunk_kda if mode == "chunked" else lt.fused_recurrent_kda

    def run(x):
        return fn(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True,
                  use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                  use_beta_sigmoid_in_kernel=True, state_v_first=True, **params)
    o, ht = run(a)
    _assert_caller_pointers(c_calls["linseq_kda_forward"][-1], a, o)
    o32, ht32 = run(_widened(a))
    np.testing.assert_array_equal(_bits(o), _bits(o32.to(torch.bfloat16)))
    np.testing.assert_array_equal(ht.numpy(), ht32.numpy())


def test_eager_autograd_function_keeps_bf16(c_calls):
    """The path of PyTorch without torch.library.custom_op: the same rule."""
    a = _torch_bf16(_values())
    tensors = [a.get(n) for n in linseq._opspec.KDA.arrays]
    eager = _torch_backend._LinseqOp.apply
    o, ht = eager(linseq._opspec.KDA, api.KdaOptions(), False, None, *tensors)
    _assert_caller_pointers(c_calls["linseq_kda_forward"][-1], a, o)
    o32, _ = eager(linseq._opspec.KDA, api.KdaOptions(), False, None,
                   *[t if t is None else t.float() for t in tensors])
    np.testing.assert_array_equal(_bits(o), _bits(o32.to(torch.bfloat16)))


# ------------------------------------------------------------------------------------------
# decode in place
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("framework", ["torch", "numpy"])
def test_decode_in_place(c_calls, framework):
    values = _values(B=3, T=1)
    a = (_torch_bf16 if framework == "torch" else _numpy_bf16)(values)
    pool = np.random.default_rng(2).standard_normal((5, 4, 8, 4)).astype(np.float32)
    rows = np.array([4, -1, 0])
    before, pool32 = pool.copy(), pool.copy()
    if framework == "torch":
        pool, pool32, rows = (torch.from_numpy(x) for x in (pool, pool32, rows))
    o, state = linseq.kda_decode(a["q"], a["k"], a["v"], a["g"], a["beta"], pool, rows,
                                 inplace=True, _framework=framework)
    assert state is pool
    _assert_caller_pointers(c_calls["linseq_kda_decode"][-1], a, o)
    w = _widened(a)
    o32, _ = linseq.kda_decode(w["q"], w["k"], w["v"], w["g"], w["beta"], pool32, rows,
                               inplace=True, _framework=framework)
    assert c_calls["linseq_kda_decode"][-1]["dtype"] == ops.DTYPE_F32
    np.testing.assert_array_equal(_bits(o), _bits(_rounded(o32)))
    np.testing.assert_array_equal(np.asarray(pool), np.asarray(pool32))
    changed = [not np.array_equal(np.asarray(pool)[r], before[r]) for r in range(5)]
    assert changed == [True, False, False, False, True]  # rows 4 and 0; -1 is padding


# ------------------------------------------------------------------------------------------
# the float32 path: gradients, mixed dtypes; shapes still checked
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
def test_requires_grad_runs_float32_and_gradients_flow(c_calls, mode):
    a = _torch_bf16(_values(T=9))
    a["q"].requires_grad_(True)
    o, _ = _fla(mode, a)
    assert c_calls["linseq_kda_forward"] == []
    assert [c["dtype"] for c in c_calls["linseq_kda_forward_train"]] == [ops.DTYPE_F32]
    assert o.dtype == torch.bfloat16  # fla returns o in q's dtype
    o.float().square().sum().backward()
    ref = {n: t.detach().float() for n, t in a.items()}
    ref["q"].requires_grad_(True)
    o32, _ = _fla(mode, ref)
    o32.to(torch.bfloat16).float().square().sum().backward()
    assert a["q"].grad is not None and a["q"].grad.dtype == torch.bfloat16
    np.testing.assert_array_equal(_bits(a["q"].grad), _bits(ref["q"].grad.to(torch.bfloat16)))


def test_requires_grad_under_no_grad_takes_the_bf16_path(c_calls):
    a = _torch_bf16(_values())
    a["v"].requires_grad_(True)
    with torch.no_grad():
        o, _ = _fla("chunked", a)
    assert c_calls["linseq_kda_forward"][-1]["dtype"] == ops.DTYPE_BF16
    assert o.dtype == torch.bfloat16


@pytest.mark.parametrize("framework", ["torch", "numpy"])
def test_mixed_dtypes_run_float32(c_calls, framework):
    """g in float32 with the rest in bfloat16: nothing is rounded to bfloat16 on the way in,
    the float32 path runs on the widened values and linseq.kda answers in float32."""
    a = (_torch_bf16 if framework == "torch" else _numpy_bf16)(_values())
    a["g"] = _widened(a)["g"]
    o, ht = linseq.kda(a["q"], a["k"], a["v"], a["beta"], a["g"], _framework=framework)
    assert c_calls["linseq_kda_forward"][-1]["dtype"] == ops.DTYPE_F32
    w = _widened(a)
    o32, _ = linseq.kda(w["q"], w["k"], w["v"], w["beta"], w["g"], _framework=framework)
    assert str(o.dtype).endswith("float32")
    np.testing.assert_array_equal(np.asarray(o), np.asarray(o32))


@pytest.mark.parametrize("framework", ["torch", "numpy"])
def test_wrong_shapes_are_refused(c_calls, framework):
    a = (_torch_bf16 if framework == "torch" else _numpy_bf16)(_values())
    bad = dict(a, k=a["k"][:, :-1])
    with pytest.raises(ValueError, match="k: expected shape"):
        linseq.kda(bad["q"], bad["k"], bad["v"], bad["beta"], bad["g"], _framework=framework)
    bad = dict(a, g=a["g"][..., :-1])
    with pytest.raises(ValueError, match="g: expected shape"):
        linseq.kda(bad["q"], bad["k"], bad["v"], bad["beta"], bad["g"], _framework=framework)
    with pytest.raises(ValueError, match="q: expected q of shape"):
        linseq.kda(a["q"][0], a["k"], a["v"], a["beta"], a["g"], _framework=framework)
    assert c_calls["linseq_kda_forward"] == []


def test_training_entries_refuse_bf16_storage():
    a = _numpy_bf16(_values())
    inputs = ops.KdaInputs(a["q"], a["k"], a["v"], a["beta"], a["g"], bf16=True)
    assert inputs.bf16
    with pytest.raises(ValueError, match="kda_forward_train: takes float32"):
        ops.kda_forward_train(inputs)
    with pytest.raises(ValueError, match="kda_backward: takes float32"):
        ops.kda_backward(inputs, np.zeros((2, 21, 4, 4), np.float32))
    assert not ops.KdaInputs(a["q"], a["k"], a["v"], a["beta"], a["g"]).bf16


# ------------------------------------------------------------------------------------------
# torch.library: the fake implementations declare bfloat16; torch.compile agrees with eager
# ------------------------------------------------------------------------------------------

needs_custom_ops = pytest.mark.skipif(not _torch_ops.AVAILABLE,
                                    reason="torch.library.custom_op needs PyTorch 2.4+")


@needs_custom_ops
def test_opcheck_kda_and_decode_in_bf16():
    layout = _torch_ops.OPS[linseq._opspec.KDA].layout
    a = _torch_bf16(_values())
    arrays = dict(a, h0=None, A_log=None, dt_bias=None)
    opts = api.KdaOptions(scale=0.5)
    torch.library.opcheck(torch.ops.linseq.kda.default,
                          tuple(layout.pack(arrays, None, opts)) + (False,))
    o, _, _ = torch.ops.linseq.kda(*layout.pack(arrays, None, opts), False)
    assert o.dtype == torch.bfloat16
    d = _torch_bf16(_values(B=2, T=1))
    pool = torch.zeros(2, 4, 8, 4)
    args = ([d.get(n) for n in layout.spec.arrays] + [pool, None]
            + [getattr(api.KdaOptions(mode="recurrent"), f) for f in layout.fields])
    torch.library.opcheck(torch.ops.linseq.kda_decode.default, tuple(args))


@needs_custom_ops
def test_compiled_forward_matches_eager_in_bf16():
    a = _torch_bf16(_values())

    def f(q, k, v, g, beta):
        return lt.chunk_kda(q, k, v, g, beta, output_final_state=True)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    o, ht = compiled(a["q"], a["k"], a["v"], a["g"], a["beta"])
    o_eager, ht_eager = f(a["q"], a["k"], a["v"], a["g"], a["beta"])
    assert o.dtype == torch.bfloat16 and ht.dtype == torch.float32
    np.testing.assert_array_equal(_bits(o), _bits(o_eager))
    np.testing.assert_array_equal(ht.numpy(), ht_eager.numpy())


def test_exec_dtype_field_is_where_the_library_reads_it():
    """ops.DTYPE_BF16 is LINSEQ_DTYPE_BF16: an exec with it is refused by an entry that takes
    float32 only on the CPU, which names the dtype."""
    a = _numpy_bf16(_values())
    inputs = ops.KdaInputs(a["q"], a["k"], a["v"], a["beta"], a["g"])
    ex = ops.make_exec(bf16=True)
    size = ctypes.c_size_t(0)
    status = _lib.lib.linseq_kda_saved_size(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                            ctypes.byref(size))
    assert status != _lib.OK
    assert b"BF16" in _lib.lib.linseq_last_error()
