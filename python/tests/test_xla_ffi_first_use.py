"""linseq.jax's XLA FFI handlers where `pip install .` built none (pip's isolated build had no
jax): they are compiled at first use from the source the package carries into the cache,
and the custom calls run, equal to the NumPy call."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import require

PROBE = """
import numpy as np, jax, jax.numpy as jnp, linseq, linseq.jax as lj
from linseq import _jax_ffi
assert lj.calls() == "ffi", _jax_ffi.WHY_NOT
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 9, 6)).astype(np.float32)
w = rng.standard_normal((6, 4)).astype(np.float32)
first = lambda r: np.asarray(r[0] if isinstance(r, tuple) else r)
got = first(lj.causal_conv1d(jnp.asarray(x), jnp.asarray(w)))
want = first(linseq.causal_conv1d(x, w))
assert np.array_equal(got, want), np.abs(got - want).max()
print("BUILT", _jax_ffi._handlers._name)
"""


def test_handlers_are_built_at_first_use(tmp_path):
    require("jax")
    import linseq
    if shutil.which(os.environ.get("CC") or "cc") is None:
        pytest.skip("no C compiler")
    source = os.path.dirname(os.path.abspath(linseq.__file__))
    package = tmp_path / "site" / "linseq"
    # the package as a wheel without the handlers lays it out: the modules, the handlers'
    # source, linseq.h under include/, and no liblinseq_xla_ffi.so
    shutil.copytree(source, package,
                    ignore=shutil.ignore_patterns("liblinseq_xla_ffi.so", "__pycache__"))
    if not (package / "include" / "linseq.h").exists():
        header = os.path.join(source, os.pardir, os.pardir, "include", "linseq.h")
        (package / "include").mkdir()
        shutil.copyfile(header, package / "include" / "linseq.h")
    # the library inside the copy too: handlers are also looked for beside the library the
    # package loads, and the installed package's own must not be found there
    library = os.environ.get("LINSEQ_LIBRARY") or os.path.join(source, "liblinseq.so")
    shutil.copyfile(library, package / "liblinseq.so")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), LINSEQ_JAX_CALLS="ffi",
               LINSEQ_CACHE_DIR=str(tmp_path / "cache"),
               LINSEQ_LIBRARY=str(package / "liblinseq.so"))
    env.pop("LINSEQ_XLA_FFI_LIBRARY", None)
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    built = run.stdout.split("BUILT ", 1)[1].strip()
    assert built.startswith(str(tmp_path / "cache")), built
    # a second process finds the cached build
    again = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.split("BUILT ", 1)[1].strip() == built
