"""An op the C library describes as forward-only ("grads": null, "backward": false in
linseq_op_table_json) is bound without a backward: its structs load, its spec has no
gradients, PyTorch registers its forward op without autograd, and asking for its backward
(NumPy, PyTorch eager or compiled, JAX) is a clear error, not a crash at import.

The library has no such op yet: the tests add a made-up one to the table the package reads
(a per-channel EMA, y_t = a y_{t-1} + (1 - a) x_t with a decode state), computed in NumPy.
"""

import copy
import ctypes
import dataclasses
from typing import Optional

import numpy as np
import pytest

from linseq import _lib, _opspec

EMA = "test_ema_forward_only"


def _ema_entry():
    """The op table entry of the made-up op, as the library writes one."""
    fields = [dict(name="B", type="int64", offset=0), dict(name="T", type="int64", offset=8),
              dict(name="D", type="int64", offset=16), dict(name="x", type="pointer", offset=24),
              dict(name="h0", type="pointer", offset=32),
              dict(name="decay", type="float32", offset=40)]
    return {
        "name": EMA, "varlen": False, "backward": False, "training": False,
        "decode": {"state": "h0", "state_out": "hT"},
        "sizes": [dict(name=n, required=True) for n in ("B", "T", "D")],
        "problem": {"type": f"linseq_{EMA}_problem", "size": 48, "fields": fields},
        "grads": None,
        "tensors": [
            dict(name="x", role="input", dims="[B,T,D]", required=True, field="x", token=True),
            dict(name="h0", role="input", dims="[B,D]", required=False, field="h0",
                 token=False),
            dict(name="y", role="output", dims="[B,T,D]", required=True, token=True),
            dict(name="hT", role="output", dims="[B,D]", required=False, alias_of="h0",
                 token=False)],
        "options": [dict(key="decay", field="decay", type="float32")],
    }


@dataclasses.dataclass(frozen=True)
class EmaOptions:
    decay: Optional[float] = 0.5

    def inputs(self, arrays, cu_seqlens, bf16=False):
        x = np.asarray(arrays["x"], dtype=np.float32)
        h0 = arrays.get("h0")
        h0 = np.zeros((x.shape[0], x.shape[2]), np.float32) if h0 is None else \
            np.asarray(h0, dtype=np.float32)
        return EmaInputs(x, h0, self.decay)

    def exec_settings(self):
        return {}


@dataclasses.dataclass
class EmaInputs:
    x: np.ndarray
    h0: np.ndarray
    decay: float


def _ema_forward(inputs, opts, train):
    h = inputs.h0.copy()
    y = np.empty_like(inputs.x)
    for t in range(inputs.x.shape[1]):
        h = inputs.decay * h + (1 - inputs.decay) * inputs.x[:, t]
        y[:, t] = h
    return [y, h], None


def _ema_out_shapes(shapes, n_seqs, opts):
    B, T, D = shapes["x"]
    return [(B, T, D), (B, D)]


@pytest.fixture
def ema(monkeypatch):
    """The made-up op's spec, its entry added to the table _lib reads."""
    desc = _ema_entry()
    monkeypatch.setitem(_lib._OPS, EMA, desc)
    return _opspec.from_table(desc, EmaOptions, _ema_out_shapes, _ema_forward)


def _values(B=2, T=5, D=3):
    rng = np.random.default_rng(0)
    return rng.standard_normal((B, T, D)).astype(np.float32), \
        rng.standard_normal((B, D)).astype(np.float32)


def test_a_table_with_a_forward_only_op_loads():
    """The structs of a table with a forward-only op: its problem struct, no grads struct,
    every other op's as before (import linseq builds its structs this way)."""
    table = copy.deepcopy(_lib.op_table)
    table["ops"].append(_ema_entry())
    structs = _lib.struct_classes(table)
    problem = structs["TestEmaForwardOnlyProblem"]
    assert ctypes.sizeof(problem) == 48 and problem.decay.offset == 40
    assert not any(name.startswith("TestEmaForwardOnly") and name.endswith("Grads")
                   for name in structs)
    assert {"KdaProblem", "KdaGrads", "Ssm1Grads", "Conv1dGrads"} <= set(structs)
    assert not _lib.has_backward(_ema_entry())
    assert all(_lib.has_backward(op) == op["backward"] for op in _lib.op_table["ops"])


def test_the_spec_of_a_forward_only_op_has_no_backward(ema):
    assert ema.arrays == ("x", "h0") and ema.n_outputs == 2
    assert not ema.has_backward and ema.grad_of == {} and not ema.saved
    with pytest.raises(_lib.NoBackward, match=f"{EMA}: the op has no backward"):
        ema.backward(None, EmaOptions(), [None, None], None, None)
    with pytest.raises(_lib.NoBackward, match="forward-only"):
        _lib.grads_class(EMA)
    # a backward given for an op the table lists as forward-only is not used
    spec = _opspec.from_table(_ema_entry(), EmaOptions, _ema_out_shapes, _ema_forward,
                              backward=lambda *args: {})
    assert not spec.has_backward


def test_numpy_runs_the_forward(ema):
    from linseq._numpy_backend import NumpyBackend
    x, h0 = _values()
    y, h = NumpyBackend.run(ema, dict(x=x, h0=h0), None, EmaOptions(decay=0.25))
    want = h0
    for t in range(x.shape[1]):
        want = 0.25 * want + 0.75 * x[:, t]
        np.testing.assert_allclose(y[:, t], want, rtol=1e-6)
    np.testing.assert_allclose(h, want, rtol=1e-6)


def test_torch_registers_no_autograd_and_refuses_the_backward(ema, monkeypatch):
    torch = pytest.importorskip("torch")
    from linseq import _torch_backend, _torch_ops
    if not _torch_ops.AVAILABLE:
        pytest.skip("torch.library.custom_op needs PyTorch 2.4+")
    op = _torch_ops._DifferentiableOp(ema)
    assert op.backward is None
    assert not hasattr(torch.ops.linseq, f"{EMA}_backward")
    monkeypatch.setitem(_torch_ops.OPS, ema, op)
    x, h0 = (torch.from_numpy(a) for a in _values())
    with torch.no_grad():
        y, h = _torch_backend.TorchBackend.run(ema, dict(x=x, h0=h0), None, EmaOptions())
    want, _ = _ema_forward(EmaOptions().inputs(dict(x=x, h0=h0), None), None, False)
    np.testing.assert_allclose(y.numpy(), want[0], rtol=1e-6)
    x.requires_grad_()
    y, _ = _torch_backend.TorchBackend.run(ema, dict(x=x, h0=h0), None, EmaOptions())
    with pytest.raises(RuntimeError, match="autograd"):
        y.sum().backward()
    torch.library.opcheck(op.forward, op.layout.pack(dict(x=x.detach(), h0=h0), None,
                                                     EmaOptions()) + [False],
                          test_utils=("test_schema", "test_faketensor"))
    # PyTorch without custom ops: the eager autograd.Function says why
    monkeypatch.setattr(_torch_ops, "AVAILABLE", False)
    y, _ = _torch_backend.TorchBackend.run(ema, dict(x=x, h0=h0), None, EmaOptions())
    with pytest.raises(_lib.NoBackward, match="forward-only"):
        y.sum().backward()


def test_jax_runs_the_forward_and_refuses_the_gradient(ema, monkeypatch):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from linseq import _jax_backend
    monkeypatch.setattr(_jax_backend, "_CALLS", "callback")  # no custom call for a fake op
    x, h0 = _values()
    y, h = _jax_backend.JaxBackend.run(ema, dict(x=jnp.asarray(x), h0=jnp.asarray(h0)), None,
                                       EmaOptions())
    want, _ = _ema_forward(EmaOptions().inputs(dict(x=x, h0=h0), None), None, False)
    np.testing.assert_allclose(np.asarray(y), want[0], rtol=1e-6)

    def loss(x):
        return _jax_backend.JaxBackend.run(ema, dict(x=x, h0=None), None, EmaOptions())[0].sum()

    with pytest.raises(_lib.NoBackward, match="forward-only"):
        jax.grad(loss)(jnp.asarray(x))
