"""The decode custom ops' C++ CPU kernels (linseq._torch_native) give the results of the ops'
Python bodies bit for bit, outputs and updated pools; refuse what those refuse, by the
argument's name and without writing to the pool; and leave fake tensors, torch.compile and
the Python bodies without them (LINSEQ_TORCH_NATIVE=0, a first-use build) working."""

import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import linseq  # noqa: E402
from linseq import _torch_native, _torch_ops  # noqa: E402,F401  (defines linseq::kda_decode)
from linseq.compat import causal_conv1d as cc  # noqa: E402
from linseq.compat import mamba_ssm as ms  # noqa: E402

pytestmark = pytest.mark.skipif(not _torch_native.AVAILABLE,
                                reason=f"no C++ kernels: {_torch_native.WHY_NOT}")

OPS = ("kda_decode", "conv_state_update", "mamba_state_update")


def _both(name, pool_index, args):
    """(output, pool) of the op (its C++ kernel) and of its Python body, each on its own copy
    of the pool; asserts the C++ kernel took the call itself."""
    results = []
    for op in (getattr(torch.ops.linseq, name), getattr(torch.ops.linseq, name + "_fallback")):
        given = list(args)
        given[pool_index] = args[pool_index].clone()
        before = _torch_native.passed_on()
        results.append((op(*given), given[pool_index]))
        if op is getattr(torch.ops.linseq, name):
            assert _torch_native.passed_on() == before, "passed on to the Python body"
    return results


def _assert_same(results):
    (o1, pool1), (o2, pool2) = results
    assert o1.dtype == o2.dtype and o1.shape == o2.shape and o1.stride() == o2.stride()
    assert torch.equal(o1, o2) and torch.equal(pool1, pool2)


def test_the_cpu_kernels_are_the_cpp_ones():
    for name in OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"linseq::{name}", "CPU"), name


def _rand(gen, *shape):
    return torch.randn(*shape, generator=gen)


def _rows(padding, batch, entries):
    rows = torch.randperm(entries, generator=torch.Generator().manual_seed(3))[:batch]
    if padding:
        rows[0] = -1
    return rows


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("form", ["plain", "seqlens", "channel_last", "no_bias"])
def test_conv_state_update_equals_the_python_body(form, padding):
    gen = torch.Generator().manual_seed(0)
    b, d, l, width, entries, state_len = 3, 10, 2, 4, 5, 6
    x = _rand(gen, b, d, l)
    if form == "channel_last":
        x = _rand(gen, b, l, d).transpose(1, 2)
    pool = _rand(gen, entries, d, state_len)
    weight, bias = _rand(gen, d, width), None if form == "no_bias" else _rand(gen, d)
    seqlens = torch.tensor([0, 7, 3]) if form == "seqlens" else None
    args = (x, pool, weight, bias, "silu", seqlens, _rows(padding, b, entries))
    _assert_same(_both("conv_state_update", 1, args))


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("groups,gate,skip", [(1, True, True), (2, False, True),
                                              (2, True, False)])
def test_mamba_state_update_equals_the_python_body(groups, gate, skip, padding):
    gen = torch.Generator().manual_seed(1)
    b, heads, p, n, entries = 3, 2, 4, 5, 4
    d = heads * p
    args = (_rand(gen, entries, heads, p, n), _rows(padding, b, entries), _rand(gen, b, d),
            _rand(gen, b, d) * 0.3, -torch.rand(d, n, generator=gen), _rand(gen, b, groups, n),
            _rand(gen, b, groups, n), _rand(gen, d) if skip else None,
            _rand(gen, b, d) if gate else None, _rand(gen, d) * 0.1, True)
    _assert_same(_both("mamba_state_update", 0, args))


def _kda_args(dtype, per_channel, v_first, padding, gen=None):
    gen = gen or torch.Generator().manual_seed(2)
    b, h, hv, k, v, entries = 3, 2, 4, 6, 5, 5
    q, kk = _rand(gen, b, 1, h, k), _rand(gen, b, 1, h, k)
    vv = _rand(gen, b, 1, hv, v)
    g = -torch.rand(b, 1, hv, *((k,) if per_channel else ()), generator=gen)
    beta = torch.rand(b, 1, hv, generator=gen)
    pool = _rand(gen, entries, hv, *((v, k) if v_first else (k, v))) * 0.2
    per_token = [t.to(dtype) for t in (q, kk, vv, beta, g)]
    return (*per_token, None, None, None, pool, _rows(padding, b, entries), None, True, False,
            v_first, False, None, "recurrent", 64, False)


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("dtype,per_channel,v_first", [
    (torch.float32, True, False), (torch.float32, False, True), (torch.bfloat16, True, False)])
def test_kda_decode_equals_the_python_body(dtype, per_channel, v_first, padding):
    _assert_same(_both("kda_decode", 8, _kda_args(dtype, per_channel, v_first, padding)))


def test_a_call_of_another_form_goes_to_the_python_body():
    """A float64 x is converted by the Python body; the result is the same as there."""
    gen = torch.Generator().manual_seed(4)
    pool, weight = _rand(gen, 2, 6, 3), _rand(gen, 6, 4)
    x = _rand(gen, 2, 6, 1).double()
    before = _torch_native.passed_on()
    got = torch.ops.linseq.conv_state_update(x, pool.clone(), weight, None, None, None,
                                             torch.arange(2))
    assert _torch_native.passed_on() == before + 1
    want = torch.ops.linseq.conv_state_update_fallback(x, pool.clone(), weight, None, None,
                                                       None, torch.arange(2))
    assert torch.equal(got, want)


def _spy(monkeypatch, module, name):
    """A list that gets, per call of the C++ step module.<name>, whether it took the call."""
    taken, real = [], getattr(module, name)

    def spy(*args):
        result = real(*args)
        taken.append(bool(result))
        return result
    monkeypatch.setattr(module, name, spy)
    return taken


def _through_step_and_python(monkeypatch, call, pool, without_step):
    """(out, pool after) of call(pool copy) with the drop-in's C++ step, then without it and
    with its op's Python body instead of the C++ kernel (without_step: the attributes to set
    for that, on the drop-in's module)."""
    results = []
    for patch in ({}, without_step):
        with monkeypatch.context() as m:
            for name, value in patch.items():
                m.setattr(*name, value)
            given = pool.clone()
            with torch.no_grad():
                results.append((call(given), given))
    return results


def _mamba1_call(form, gen):
    b, d, n = 3, 37, 16
    state = _rand(gen, b, d, n)
    x, dt, z = _rand(gen, b, d), _rand(gen, b, d) * 0.3, _rand(gen, b, d)
    A, B, C = -torch.rand(d, n, generator=gen), _rand(gen, b, n), _rand(gen, b, n)
    D, dt_bias = _rand(gen, d), _rand(gen, d) * 0.1
    kwargs = dict(D=D, z=z, dt_bias=dt_bias, dt_softplus=True)
    if form == "no_gate_no_skip":
        kwargs.update(D=None, z=None)
    elif form == "strided_x":
        x = _rand(gen, b, 2 * d)[:, ::2]
    elif form == "bf16_x":
        x = x.bfloat16()
    elif form == "bias_without_softplus":
        kwargs.update(dt_softplus=False)
    elif form == "transposed_state":
        state = _rand(gen, b, n, d).transpose(1, 2)
    return state, lambda pool: ms.selective_state_update(pool, x, dt, A, B, C, **kwargs)


@pytest.mark.parametrize("form,taken", [
    ("plain", True), ("no_gate_no_skip", True), ("strided_x", True), ("bf16_x", False),
    ("bias_without_softplus", False), ("transposed_state", False)])
def test_mamba1_decode_call_in_cpp_has_the_python_bodys_bits(monkeypatch, form, taken):
    """mamba-ssm's selective_state_update in Mamba1's shapes goes to linseq::mamba1_token_step
    (its checks and the kernel in one C++ call); another form falls through to the drop-in's
    Python; either way the output and the new state are the op's Python body's, bit for
    bit."""
    state, call = _mamba1_call(form, torch.Generator().manual_seed(12))
    spied = _spy(monkeypatch, ms, "_MAMBA1_STEP")
    (y, pool), (y_ref, pool_ref) = _through_step_and_python(
        monkeypatch, call, state,
        {(ms, "_MAMBA1_STEP"): None, (ms, "_SCAN_EAGER"): ms._scan_decode})
    assert spied == [taken]
    assert y.dtype == y_ref.dtype and torch.equal(y, y_ref) and torch.equal(pool, pool_ref)


def _conv_call(form, gen):
    b, d, width = 3, 21, 4
    state_len = width if form == "whole_window_rows" else width - 1
    pool = _rand(gen, b, d, state_len)
    x, weight, bias = _rand(gen, b, d, 1), _rand(gen, d, width), _rand(gen, d)
    activation = "silu"
    if form == "two_dims":
        x = x[:, :, 0]
    elif form == "two_tokens":
        x = _rand(gen, b, d, 2)
    elif form == "no_bias_no_activation":
        bias, activation = None, None
    elif form == "swish":
        activation = "swish"
    elif form == "bf16_x":
        x = x.bfloat16()
    elif form == "transposed_state":
        pool = _rand(gen, b, state_len, d).transpose(1, 2)
    return pool, lambda rows: cc.causal_conv1d_update(x, rows, weight, bias, activation)


@pytest.mark.parametrize("form,taken", [
    ("plain", True), ("whole_window_rows", True), ("two_dims", True), ("two_tokens", True),
    ("no_bias_no_activation", True), ("swish", True), ("bf16_x", False),
    ("transposed_state", False)])
def test_conv_decode_call_in_cpp_has_the_python_bodys_bits(monkeypatch, form, taken):
    """causal-conv1d's causal_conv1d_update without cache_seqlens or conv_state_indices goes to
    linseq::conv_token_step; another form falls through to the drop-in's Python; either way
    out (in x's shape and dtype) and the shifted rows are the op's Python body's."""
    pool, call = _conv_call(form, torch.Generator().manual_seed(13))
    spied = _spy(monkeypatch, cc, "_CONV_STEP")
    (y, rows), (y_ref, rows_ref) = _through_step_and_python(
        monkeypatch, call, pool,
        {(cc, "_CONV_STEP"): None, (cc, "_CONV_EAGER"): cc._conv_decode})
    assert spied == [taken]
    assert y.shape == y_ref.shape and y.dtype == y_ref.dtype
    assert torch.equal(y, y_ref) and torch.equal(rows, rows_ref)


def test_conv_decode_calls_with_positions_or_rows_stay_in_python(monkeypatch):
    gen = torch.Generator().manual_seed(14)
    pool, x, weight = _rand(gen, 4, 6, 3), _rand(gen, 2, 6, 1), _rand(gen, 6, 4)
    spied = _spy(monkeypatch, cc, "_CONV_STEP")
    with torch.no_grad():
        cc.causal_conv1d_update(x, pool, weight, None, "silu",
                                conv_state_indices=torch.tensor([3, 1]))
        cc.causal_conv1d_update(x, pool[:2].clone(), weight, None, "silu",
                                cache_seqlens=torch.tensor([1, 5]))
    assert spied == []


def _refused(call, pool, match):
    before = pool.clone()
    with pytest.raises(ValueError, match=match):
        call()
    assert torch.equal(pool, before)


def test_bad_sizes_and_rows_are_refused_by_name_and_nothing_is_written():
    gen = torch.Generator().manual_seed(5)
    pool, x, weight = _rand(gen, 3, 6, 3), _rand(gen, 2, 6, 1), _rand(gen, 6, 4)
    conv = torch.ops.linseq.conv_state_update
    _refused(lambda: conv(x, pool, weight, None, "silu", None, torch.tensor([0, 3])), pool,
             "conv_state_indices: rows must be <")
    _refused(lambda: conv(x, pool, weight, None, "silu", None, torch.tensor([1, 1])), pool,
             "conv_state_indices: two requests name the same row")
    _refused(lambda: conv(x, pool, _rand(gen, 5, 4), None, "silu", None, torch.arange(2)),
             pool, "weight")
    args = list(_kda_args(torch.float32, True, False, False))
    args[8] = args[8][:, :, :, :4]  # the pool's rows are [HV, K, V - 1]
    args[8] = args[8].contiguous()
    _refused(lambda: torch.ops.linseq.kda_decode(*args), args[8],
             r"state: expected a pool of shape \[R,4,6,5\]")


def test_a_refusal_of_the_library_carries_its_message():
    """A positive log decay: the C++ kernel calls the library, which refuses it naming g
    before writing; the message reaches Python as a ValueError."""
    args = list(_kda_args(torch.float32, True, False, False))
    args[4] = args[4].abs() + 0.5
    before = _torch_native.passed_on()
    _refused(lambda: torch.ops.linseq.kda_decode(*args), args[8], "'g'")
    assert _torch_native.passed_on() == before


def test_fake_tensors_propagate_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                for a in _kda_args(torch.bfloat16, True, False, False)]
        o = torch.ops.linseq.kda_decode(*args)
        assert o.shape == (3, 1, 4, 5) and o.dtype == torch.bfloat16
        x = torch.empty(2, 5, 6).transpose(1, 2)   # channel last: [b, d, l] with stride(1) 1
        y = torch.ops.linseq.conv_state_update(x, torch.empty(3, 6, 3), torch.empty(6, 4),
                                               None, "silu", None, torch.arange(2))
        assert y.shape == (2, 6, 5) and y.stride(1) == 1


def _decode_step(conv_pool, scan_pool, kda_pool, inputs):
    x, weight, scan, kda = inputs
    y = cc.causal_conv1d_update(x, conv_pool, weight, None, "silu")
    s = ms.selective_state_update(scan_pool, *scan, dt_softplus=True)
    o, _ = linseq.kda_decode(*kda, kda_pool, inplace=True)
    return y, s, o


def test_compiled_decode_step_has_no_graph_break_and_matches_eager():
    gen = torch.Generator().manual_seed(6)
    b, d, n = 2, 8, 4
    inputs = (_rand(gen, b, d), _rand(gen, d, 4),
              (_rand(gen, b, d), torch.rand(b, d, generator=gen), -torch.rand(d, n, generator=gen),
               _rand(gen, b, n), _rand(gen, b, n)),
              (_rand(gen, b, 1, 2, 4), _rand(gen, b, 1, 2, 4), _rand(gen, b, 1, 2, 3),
               -torch.rand(b, 1, 2, 4, generator=gen), torch.rand(b, 1, 2, generator=gen)))
    pools = (_rand(gen, b, d, 3), _rand(gen, b, d, n), _rand(gen, b, 2, 4, 3))
    eager_pools = [p.clone() for p in pools]
    compiled = torch.compile(_decode_step, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for _ in range(2):
            got = compiled(*pools, inputs)
            want = _decode_step(*eager_pools, inputs)
            assert all(torch.equal(a, w) for a, w in zip(got, want))
    assert all(torch.equal(p, e) for p, e in zip(pools, eager_pools))


_PROBE = """
import torch, linseq
from linseq import _torch_native
from linseq.compat import causal_conv1d as cc
g = torch.Generator().manual_seed(8)
pool, x = torch.randn(2, 6, 3, generator=g), torch.randn(2, 6, generator=g)
w = torch.randn(6, 4, generator=g)
y = cc.causal_conv1d_update(x, pool, w, None, "silu")
print("RESULT", _torch_native.AVAILABLE, _torch_native._native._name if _torch_native.AVAILABLE
      else None, y.tolist(), pool.tolist())
"""


def _probe(env):
    run = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    available, path, rest = run.stdout.split("RESULT ", 1)[1].split(" ", 2)
    return available == "True", path, rest.strip()


def test_the_python_bodies_run_with_the_variable_set_and_agree():
    native = _probe(dict(os.environ))
    python = _probe(dict(os.environ, LINSEQ_TORCH_NATIVE="0"))
    assert native[0] and not python[0]
    assert native[2] == python[2]


def test_the_kernels_are_built_at_first_use(tmp_path):
    """The package as a wheel built without torch lays it out: the modules, the kernels'
    source, linseq.h under include/, no liblinseq_torch_native.so; it is compiled into the
    cache at first use, and found there by the next process."""
    source = os.path.dirname(os.path.abspath(linseq.__file__))
    package = tmp_path / "site" / "linseq"
    shutil.copytree(source, package, ignore=shutil.ignore_patterns(
        "liblinseq_torch_native.so", "liblinseq_xla_ffi.so", "__pycache__"))
    if not (package / "include" / "linseq.h").exists():
        (package / "include").mkdir()
        shutil.copyfile(os.path.join(source, os.pardir, os.pardir, "include", "linseq.h"),
                        package / "include" / "linseq.h")
    library = os.environ.get("LINSEQ_LIBRARY") or os.path.join(source, "liblinseq.so")
    shutil.copyfile(library, package / "liblinseq.so")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"),
               LINSEQ_CACHE_DIR=str(tmp_path / "cache"),
               LINSEQ_LIBRARY=str(package / "liblinseq.so"))
    env.pop("LINSEQ_TORCH_NATIVE", None)
    available, built, result = _probe(env)
    assert available and built.startswith(str(tmp_path / "cache")), built
    again = _probe(env)
    assert again == (True, built, result)
