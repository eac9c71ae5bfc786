"""Builds liblinseq with the project's Makefile and ships it inside the Python package.

The wheel carries liblinseq.so next to the Python modules (loaded with ctypes), so the only
runtime dependency is NumPy; building needs a C compiler and make, as the C library
does. Where jax's XLA FFI header is found it also carries liblinseq_xla_ffi.so, through which
linseq.jax calls the library as XLA custom calls (scripts/build-xla-ffi.sh); it always carries
their source and linseq.h, from which linseq.jax builds them at first use where pip's build
environment had no jax (linseq/_jax_ffi.py). Likewise, where torch is importable, it carries
liblinseq_torch_native.so, the C++ CPU kernels of the decode custom ops, and always their
source (linseq/_torch_native.py builds them at first use).
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


def library_version():
    with open(os.path.join(ROOT, "include", "linseq.h")) as header:
        text = header.read()
    parts = [re.search(rf"#define LINSEQ_VERSION_{p} (\d+)", text).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


class BuildWithLibrary(build_py):
    """build_py plus the shared library, built by `make lib` in a build folder of its own."""

    def run(self):
        super().run()
        build_dir = os.path.join(ROOT, "build", "python-lib")
        jobs = str(os.cpu_count() or 1)
        subprocess.check_call(["make", "-C", ROOT, f"BUILD={build_dir}", "-j", jobs, "lib"])
        target = os.path.join(self.build_lib, "linseq", "liblinseq.so")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(build_dir, f"liblinseq.so.{library_version()}"), target)
        header = os.path.join(os.path.dirname(target), "include", "linseq.h")
        os.makedirs(os.path.dirname(header), exist_ok=True)
        shutil.copyfile(os.path.join(ROOT, "include", "linseq.h"), header)
        self.build_xla_ffi(os.path.join(os.path.dirname(target), "liblinseq_xla_ffi.so"))
        self.build_torch_native(os.path.join(os.path.dirname(target),
                                             "liblinseq_torch_native.so"))

    @staticmethod
    def build_xla_ffi(target):
        """linseq.jax's XLA FFI handlers, where jax's FFI header is found: in
        $LINSEQ_XLA_FFI_INCLUDE, or from a jax this Python imports (pip's isolated build
        environment has none: pass the folder, see scripts/test-python.sh). Without them
        linseq.jax builds them at first use, or runs its kernels through jax.pure_callback."""
        env = dict(os.environ, PYTHON=sys.executable)
        script = os.path.join(ROOT, "scripts", "build-xla-ffi.sh")
        status = subprocess.call(["sh", script, target], env=env)
        if status not in (0, 3):  # 3: no header, nothing built (the script says so)
            raise subprocess.CalledProcessError(status, ["sh", script, target])


    @staticmethod
    def build_torch_native(target):
        """The decode custom ops' C++ CPU kernels (python/linseq/_torch_native.cpp), where
        this Python imports torch (pip's isolated build environment has none: pip install
        --no-build-isolation, or pip install torch first). Without them linseq builds them
        at first use, or runs the ops' Python bodies (linseq/_torch_native.py)."""
        try:
            import torch  # noqa: F401
        except ImportError:
            print("setup.py: no torch here: linseq builds its torch kernels at first use")
            return
        here = os.path.join(ROOT, "python", "linseq")
        spec = importlib.util.spec_from_file_location(
            "_torch_native_build", os.path.join(here, "_torch_native_build.py"))
        builder = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(builder)
        why = builder.build(os.path.join(here, "_torch_native.cpp"),
                            os.path.join(ROOT, "include"), target)
        if why:
            print(f"setup.py: no torch kernels built ({why}); linseq tries again at first use")


class BinaryDistribution(Distribution):
    """The wheel holds a compiled library: tag it for this platform, not as pure Python."""

    def has_ext_modules(self):
        return True


setup(version=library_version(), cmdclass={"build_py": BuildWithLibrary},
      distclass=BinaryDistribution)
