"""How the decode ops' C++ kernels (_torch_native.cpp) are compiled against the torch this
Python imports: by setup.py when `pip install .` runs where torch is importable, else by
linseq._torch_native at first use. Imports nothing of linseq, so that setup.py can load it
from the source tree before the package exists."""

import logging
import os
import shutil
import subprocess

import torch


def _cpp_extension():
    """torch.utils.cpp_extension, without the warning its import logs on a machine without a
    CUDA runtime (nothing here uses CUDA)."""
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        log.setLevel(level)
    return cpp_extension


def compile_command(source, header_dir, output):
    """The compiler's command line: torch's include and library folders and its
    _GLIBCXX_USE_CXX11_ABI from torch.utils.cpp_extension (no ninja, no Python headers: the
    library holds no Python module). None when there is no C++ compiler ($CXX, else c++)."""
    cpp_extension = _cpp_extension()
    compiler = shutil.which(os.environ.get("CXX") or "c++")
    if compiler is None:
        return None
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    libs = cpp_extension.library_paths()
    # -isystem: torch's headers' own warnings are not this project's
    return ([compiler, "-std=c++20", "-O2", "-Wall", "-Wextra", "-fPIC", "-fvisibility=hidden",
             "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-I" + header_dir]
            + [f for d in cpp_extension.include_paths() for f in ("-isystem", d)]
            + [source, "-o", output]
            + [f"-L{d}" for d in libs] + [f"-Wl,-rpath,{d}" for d in libs]
            + ["-lc10", "-ltorch_cpu"])


def build(source, header_dir, target):
    """Compiles the library into `target` (written whole or not at all: a concurrent build
    sees all of it or nothing). Returns None, or why nothing was built."""
    partial = f"{target}.{os.getpid()}.tmp"
    command = compile_command(source, header_dir, partial)
    if command is None:
        return f"no C++ compiler ({os.environ.get('CXX') or 'c++'}) to build it"
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return f"building it failed: {' '.join(command)}: {done.stderr[-500:]}"
    os.replace(partial, target)
    return None
