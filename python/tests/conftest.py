"""Shared fixtures: the reference cases and the frameworks the tests need.

The reference cases are read from the folders in $LINSEQ_REFDATA (separated by ':'; the
generated ones, `python3 tests/refgen/gen.py DIR`, and any other set in the same format),
else from build/refcases and, when it exists, ../shared/refdata beside the source tree. A
case name found in two folders is named FOLDER/NAME for the second. Only the cases that
refcases.py can express as framework calls are listed.

PyTorch and JAX tests are skipped when the framework is missing, unless
LINSEQ_REQUIRE_FRAMEWORKS=1 (the project's test command sets it: there nothing is skipped).
"""

import importlib
import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_DEFAULT_ROOTS = [os.path.join(ROOT, "build", "refcases"),
                  os.path.join(os.path.dirname(ROOT), "shared", "refdata")]
if os.environ.get("LINSEQ_REFDATA"):
    REFDATA_ROOTS = os.environ["LINSEQ_REFDATA"].split(os.pathsep)
else:
    REFDATA_ROOTS = [r for r in _DEFAULT_ROOTS if os.path.isdir(r)]


def require(module):
    if os.environ.get("LINSEQ_REQUIRE_FRAMEWORKS") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def _case_dirs():
    """{case name: folder} over every root's index.json."""
    dirs = {}
    for root in REFDATA_ROOTS:
        index = os.path.join(root, "index.json")
        if not os.path.exists(index):
            if os.environ.get("LINSEQ_REQUIRE_FRAMEWORKS") == "1":
                raise FileNotFoundError(f"no reference cases at {root} (set LINSEQ_REFDATA)")
            continue
        with open(index) as f:
            for e in json.load(f):
                key = e["name"] if e["name"] not in dirs else \
                    f"{os.path.basename(os.path.normpath(root))}/{e['name']}"
                dirs[key] = os.path.join(root, e["name"])
    return dirs


CASE_DIRS = _case_dirs()


def case_names(op=None):
    import refcases
    names = []
    for name in CASE_DIRS:
        meta = Case(name).meta
        if (op is None or meta["op"] == op) and refcases.supported(meta):
            names.append(name)
    return sorted(names)


class Case:
    def __init__(self, name):
        self.name = name
        self.dir = CASE_DIRS[name]
        with open(os.path.join(self.dir, "meta.json")) as f:
            self.meta = json.load(f)
        self.files = {os.path.splitext(n)[0] for n in os.listdir(self.dir) if n.endswith(".npy")}

    def __contains__(self, key):
        return key in self.files

    def get(self, key):
        return np.load(os.path.join(self.dir, key + ".npy")) if key in self.files else None

    def check(self, key, value, scale=1.0):
        """The judge's rule: max|cand-ref|/max|ref| and the cosine within meta's tolerance."""
        ref = self.get(key).astype(np.float64)
        cand = np.asarray(value, dtype=np.float64)
        assert cand.shape == ref.shape, f"{self.name}/{key}: shape {cand.shape} != {ref.shape}"
        assert np.all(np.isfinite(cand)), f"{self.name}/{key}: non-finite values"
        tol = self.meta["tolerance"][key]
        err = np.abs(cand - ref).max() if ref.size else 0.0
        peak = np.abs(ref).max() if ref.size else 0.0
        if peak == 0:
            assert err <= self.meta.get("tolerance_abs_floor", 1e-6), f"{self.name}/{key}"
            return
        rel = err / peak
        cos = float((cand * ref).sum() / (np.linalg.norm(cand) * np.linalg.norm(ref)))
        assert rel <= tol["max_rel_err"] * scale, f"{self.name}/{key}: max_rel_err {rel:.3g}"
        assert cos >= 1 - (1 - tol["min_cos"]) * scale, f"{self.name}/{key}: cos {cos}"


@pytest.fixture
def kernel_calls(monkeypatch):
    """Records what linseq.ops hands the kernels, by ops function name: the problems built
    (Ssm1Inputs, Conv1dInputs), the output arrays the forwards return (first output; a
    training forward, ops.forward_train, under its op's forward), the gradient dicts of the
    backwards, and the address of every pool a decode updates."""
    from linseq import ops
    record = {"Ssm1Inputs": lambda args, result: result,
              "Conv1dInputs": lambda args, result: result,
              "ssm1_forward": lambda args, result: result[0],
              "conv1d_forward": lambda args, result: result[0],
              "ssm1_backward": lambda args, result: result,
              "conv1d_backward": lambda args, result: result,
              "ssm1_decode": lambda args, result: args[1].ctypes.data,
              "conv1d_decode": lambda args, result: args[1].ctypes.data}
    seen = {name: [] for name in record}

    def spy(name):
        real = getattr(ops, name)

        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            seen[name].append(record[name](args, result))
            return result
        monkeypatch.setattr(ops, name, call)

    for name in record:
        spy(name)
    real_train = ops.forward_train

    def forward_train(name, *args, **kwargs):
        result = real_train(name, *args, **kwargs)
        seen[f"{name}_forward"].append(result[0][0])
        return result
    monkeypatch.setattr(ops, "forward_train", forward_train)
    _spy_direct_decodes(monkeypatch, seen)
    python_decode_bodies(monkeypatch)
    return seen


@pytest.fixture
def seen_pointers(monkeypatch):
    """Records every data pointer linseq.ops (each module of the package) hands to the C
    library."""
    import sys

    from linseq import ops
    seen = []
    real = ops.ptr

    def spy(arr):
        p = real(arr)
        seen.append(p)
        return p

    for name, module in list(sys.modules.items()):
        if (name == ops.__name__ or name.startswith(ops.__name__ + ".")) and \
                getattr(module, "ptr", None) is real:
            monkeypatch.setattr(module, "ptr", spy)
    return seen


def python_decode_bodies(monkeypatch):
    """The decode ops' Python bodies in place of their C++ kernels' eager entries
    (linseq._torch_native), for the tests that watch what Python hands the library: the C++
    kernels hand it the same pointers (test_torch_native compares the two bit for bit)."""
    try:
        import torch
    except ImportError:
        return
    from linseq import _torch_native, _torch_ops
    if not _torch_native.AVAILABLE:
        return
    # (not the conv op's own entry: that op exists only once compat.causal_conv1d is imported)
    from linseq.compat import causal_conv1d, mamba_ssm
    monkeypatch.setattr(causal_conv1d, "_CONV_EAGER", causal_conv1d._conv_decode)
    monkeypatch.setattr(mamba_ssm, "_SCAN_EAGER", mamba_ssm._scan_decode)
    monkeypatch.setitem(_torch_ops._EAGER, "kda_decode",
                        torch.ops.linseq.kda_decode_fallback.default)


def _spy_direct_decodes(monkeypatch, seen):
    """The decodes that go from torch tensors straight into the kernels (linseq's
    _torch_direct), recorded under the same names: their problem (as .problem) and pool."""
    import types

    from linseq import _torch_direct

    def spy(name, key, record):
        real = getattr(_torch_direct, name)

        def call(*args):
            result = real(*args)
            if result is not None:
                seen[key].append(record(args, result))
            return result
        monkeypatch.setattr(_torch_direct, name, call)

    spy("ssm1_problem", "Ssm1Inputs", lambda args, result: types.SimpleNamespace(problem=result))
    spy("conv1d_problem", "Conv1dInputs",
        lambda args, result: types.SimpleNamespace(problem=result))
    spy("ssm1_decode", "ssm1_decode", lambda args, result: args[0].data_ptr())
    spy("conv1d_decode", "conv1d_decode", lambda args, result: args[1].data_ptr())
