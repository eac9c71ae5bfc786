"""Shared fixtures: the reference cases and the frameworks the tests need.

The reference cases are read from $LINSEQ_REFDATA, else from ../shared/refdata beside the
source tree. PyTorch and JAX tests are skipped when the framework is missing, unless
LINSEQ_REQUIRE_FRAMEWORKS=1 (the project's test command sets it: there nothing is skipped).
"""

import importlib
import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFDATA = os.environ.get("LINSEQ_REFDATA",
                         os.path.join(os.path.dirname(ROOT), "shared", "refdata"))


def require(module):
    if os.environ.get("LINSEQ_REQUIRE_FRAMEWORKS") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def case_names(op=None):
    index = os.path.join(REFDATA, "index.json")
    if not os.path.exists(index):
        if os.environ.get("LINSEQ_REQUIRE_FRAMEWORKS") == "1":
            raise FileNotFoundError(f"no reference cases at {REFDATA} (set LINSEQ_REFDATA)")
        return []
    with open(index) as f:
        entries = json.load(f)
    return sorted(e["name"] for e in entries if op is None or e["op"] == op)


class Case:
    def __init__(self, name):
        self.name = name
        self.dir = os.path.join(REFDATA, name)
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
