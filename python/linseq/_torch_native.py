"""The CPU kernels of the decode custom ops in C++ (_torch_native.cpp): found or built, loaded
into torch's dispatcher, and bound to the entry points of the liblinseq the package loaded.

The ops stay defined in Python (_torch_ops: schemas, fake kernels, autograd); the library only
registers their CPU kernels, which the dispatcher prefers to the Python bodies. A call a C++
kernel does not take (a dtype to convert, a size or row to refuse by name) goes to
linseq::<op>_fallback, the op's Python body under that name (provide() defines it).

The library is looked for beside this module (where `pip install .` puts it when torch was
importable in the build: setup.py), else built at first use from the source the package
carries, with the C++ compiler ($CXX, else c++) and torch's headers, into a per-user cache
($LINSEQ_CACHE_DIR, else $XDG_CACHE_HOME/linseq, else ~/.cache/linseq) keyed by the source,
linseq.h, the torch version and its C++ ABI. Where neither works (no compiler, no headers)
the Python bodies run as before (logged once at debug level). LINSEQ_TORCH_NATIVE=0 keeps
them without looking.
"""

import ctypes
import functools
import hashlib
import logging
import os

import torch

from . import _lib, _torch_native_build

LIBRARY_NAME = "liblinseq_torch_native.so"
SOURCE_NAME = "_torch_native.cpp"
NAMESPACE = "linseq"

_log = logging.getLogger(__name__)
_HERE = os.path.dirname(os.path.abspath(__file__))


def cache_key(source, header_dir):
    """What a build depends on: a new source, header, torch version or C++ ABI builds anew."""
    key = hashlib.sha256()
    for path in (source, os.path.join(header_dir, "linseq.h")):
        with open(path, "rb") as f:
            key.update(f.read())
    key.update(f"{torch.__version__} abi{int(torch._C._GLIBCXX_USE_CXX11_ABI)}".encode())
    return key.hexdigest()[:16]


def _build_at_first_use():
    """(the path of the library built into the cache, or None, why not)."""
    source, header_dir = os.path.join(_HERE, SOURCE_NAME), _lib.header_dir()
    if not os.path.exists(source) or header_dir is None:
        return None, f"the package carries no kernel source ({SOURCE_NAME}, include/linseq.h)"
    target = os.path.join(_lib.cache_dir(), "torch-native-" + cache_key(source, header_dir),
                          LIBRARY_NAME)
    if os.path.exists(target):
        return target, None
    os.makedirs(os.path.dirname(target), exist_ok=True)
    why = _torch_native_build.build(source, header_dir, target)
    return (None, why) if why else (target, None)


_registered = False  # the library's kernels are in the dispatcher (bound or not)


def _checked_and_bound(path):
    """Loads the library into torch's dispatcher and hands it the library's entry points,
    after checking that it fills the structs as the loaded liblinseq lays them out. Until
    bound, its kernels pass every call to the Python bodies."""
    torch.ops.load_library(path)
    global _registered
    _registered = True
    native = ctypes.CDLL(path)
    native.linseq_torch_native_struct_size.argtypes = [ctypes.c_char_p]
    native.linseq_torch_native_struct_size.restype = ctypes.c_int64
    sizes = {_lib.op_table["exec"]["type"]: _lib.op_table["exec"]["size"]}
    sizes.update({op["problem"]["type"]: op["problem"]["size"] for op in _lib.op_table["ops"]})
    sizes[_lib.op_table["state_pool"]["type"]] = _lib.op_table["state_pool"]["size"]
    for name in ("linseq_exec", "linseq_kda_problem", "linseq_conv1d_problem",
                 "linseq_ssm1_problem", "linseq_ssd_problem", "linseq_state_pool"):
        if native.linseq_torch_native_struct_size(name.encode()) != sizes.get(name):
            raise OSError(f"{name} is laid out otherwise than in the loaded liblinseq")
    refused = _lib.bind_entry_points(native, "linseq_torch_native")
    if refused:
        raise OSError(f"it refused the entry point {refused}")
    native.linseq_torch_native_passed_on.restype = ctypes.c_int64
    return native


def _load():
    """(the loaded library or None, why it is not used)."""
    if os.environ.get("LINSEQ_TORCH_NATIVE", "") == "0":
        return None, "LINSEQ_TORCH_NATIVE=0"
    path = os.path.join(_HERE, LIBRARY_NAME)
    why = None
    if not os.path.exists(path):
        path, why = _build_at_first_use()
    if path is not None:
        try:
            return _checked_and_bound(path), None
        except (OSError, RuntimeError, AttributeError) as exc:
            why = f"{path}: {exc}"
    _log.debug("linseq: the decode ops' C++ kernels are not used (%s); their Python bodies "
               "run instead", why)
    return None, why


_native, WHY_NOT = _load()
AVAILABLE = _native is not None
_FALLBACKS = []  # the torch.library fragments defining linseq::<op>_fallback (kept alive)
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def provide(op, body):
    """For the custom op `op` (a torch.library.custom_op) whose CPU kernel the library holds:
    defines linseq::<op>_fallback, its Python `body`, for the calls that kernel passes on
    (every call, where the library was loaded but refused: then it is never bound).
    Returns the eager entry: the op's CPU kernel called without the dispatch through its
    Python autograd and ADInplaceOrView kernels (for plain CPU tensors outside tracing, where
    those do nothing: _torch_direct.direct_call), or None without the library."""
    if not _registered:
        return None
    schema = str(op._opoverload._schema)
    name = schema[len(NAMESPACE) + 2:schema.index("(")]
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    library.define(f"{name}_fallback{schema[schema.index('('):]}")
    library.impl(f"{name}_fallback", body, "CompositeExplicitAutograd")
    _FALLBACKS.append(library)
    if not AVAILABLE:
        return None
    return functools.partial(op._opoverload._handle.redispatch_boxed, _CPU)


def defined_here(name):
    """The C++ CPU kernel of linseq::<name>, an op the library itself defines (the vLLM
    plugin's steps), called without torch's dispatch through Python, or None without the
    library."""
    if not AVAILABLE:
        return None
    return functools.partial(getattr(torch.ops.linseq, name).default._handle.redispatch_boxed,
                             _CPU)


def passed_on():
    """How many calls the C++ kernels have passed on to the ops' Python bodies (a dtype to
    convert, a call to refuse by name): what a decode step that should stay in C++ checks."""
    return _native.linseq_torch_native_passed_on() if AVAILABLE else 0
