"""The kernels as XLA FFI custom calls: the handlers of _xla_ffi.c, loaded and registered once,
and the description of one call, built while tracing from the linseq.ops objects that validate
the NumPy calls (so a shape or option is decided in one place).

A call's description is the op's problem struct and the linseq_exec as bytes (every pointer
zero), and per operand the problem field it fills and how (see _xla_ffi.c). XLA's buffers are
passed to the library where they lie: nothing is copied on the way in or out.

The handler library is looked for in $LINSEQ_XLA_FFI_LIBRARY, else beside this module (where
`pip install .` puts it when jax's FFI header was found: scripts/build-xla-ffi.sh), else beside
the liblinseq the package loaded. Where none is found (pip builds in an environment without
jax) it is compiled at first use from the source the package carries, against this jax's
header, into a per-user cache ($LINSEQ_CACHE_DIR, else $XDG_CACHE_HOME/linseq, else
~/.cache/linseq), when a C compiler ($CC, else cc) is there. LINSEQ_JAX_CALLS chooses the path:
"ffi" (require the custom calls: no handler library is an ImportError saying why),
"callback" (jax.pure_callback), or unset (the custom calls when the library is found or
built, else the callbacks).
"""

import ctypes
import hashlib
import os
import shutil
import subprocess

import jax
import numpy as np

from . import _lib, ops

LIBRARY_NAME = "liblinseq_xla_ffi.so"

# The handlers: one per call kind, each serving every op of the table by its name (the
# call's attribute "op"), through linseq_op_forward, _backward and _decode.
TARGETS = ("forward", "backward", "decode")

# How an operand reaches the entry point (_xla_ffi.c's enum bind_kind).
F32_POINTER, F32_VALUE, I64_POINTER, ENTRY_ARG = 0, 1, 2, 3


def _candidates():
    override = os.environ.get("LINSEQ_XLA_FFI_LIBRARY")
    if override:
        return [override]
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, LIBRARY_NAME),
            os.path.join(os.path.dirname(os.path.abspath(_lib._library_path())), LIBRARY_NAME)]


def _bind_and_register(path):
    handlers = ctypes.CDLL(path)
    refused = _lib.bind_entry_points(handlers, "linseq_xla_ffi")
    if refused:
        raise ImportError(f"linseq: {path} refused the entry point {refused}")
    handlers.linseq_xla_ffi_struct_capacity.restype = ctypes.c_int64
    global _STRUCT_CAPACITY
    _STRUCT_CAPACITY = handlers.linseq_xla_ffi_struct_capacity()
    for target in TARGETS:
        jax.ffi.register_ffi_target("linseq_" + target,
                                    jax.ffi.pycapsule(getattr(handlers, "linseq_xla_" + target)),
                                    platform="cpu")
    return handlers


def _build_at_first_use():
    """(the path of handlers compiled from the package's source into the cache, or None, why
    not). The cache key covers the source, linseq.h and the jax header folder, so a new
    version of any of them compiles anew."""
    here = os.path.dirname(os.path.abspath(__file__))
    source = os.path.join(here, "_xla_ffi.c")
    header_dir = _lib.header_dir()
    if not os.path.exists(source) or header_dir is None:
        return None, "the package carries no handler source (_xla_ffi.c, include/linseq.h)"
    include = jax.ffi.include_dir()
    compiler = shutil.which(os.environ.get("CC") or "cc")
    if compiler is None:
        return None, f"no C compiler ({os.environ.get('CC') or 'cc'}) to build them at first use"
    key = hashlib.sha256()
    for path in (source, os.path.join(header_dir, "linseq.h")):
        with open(path, "rb") as f:
            key.update(f.read())
    key.update(os.path.abspath(include).encode() + jax.__version__.encode())
    target = os.path.join(_lib.cache_dir(), "xla-ffi-" + key.hexdigest()[:16], LIBRARY_NAME)
    if os.path.exists(target):
        return target, None
    os.makedirs(os.path.dirname(target), exist_ok=True)
    partial = f"{target}.{os.getpid()}.tmp"
    command = [compiler, "-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", "-shared",
               "-I" + header_dir, "-isystem", include, source, "-o", partial]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return None, (f"building them at first use failed: {' '.join(command)}: "
                      f"{done.stderr[-500:]}")
    os.replace(partial, target)  # atomic: a concurrent first use sees all of it or nothing
    return target, None


def _load():
    """(the handler library or None, why it is not used)."""
    mode = os.environ.get("LINSEQ_JAX_CALLS", "")
    if mode not in ("", "ffi", "callback"):
        raise ImportError(f"LINSEQ_JAX_CALLS: expected 'ffi', 'callback' or unset, got {mode!r}")
    if mode == "callback":
        return None, "LINSEQ_JAX_CALLS=callback"
    path = next((p for p in _candidates() if os.path.exists(p)), None)
    why = None
    if not hasattr(jax, "ffi") or not hasattr(jax.ffi, "ffi_call"):
        why = f"jax {jax.__version__} has no jax.ffi"
    elif path is None and os.environ.get("LINSEQ_XLA_FFI_LIBRARY"):
        why = f"no {LIBRARY_NAME} at LINSEQ_XLA_FFI_LIBRARY={_candidates()[0]}"
    elif path is None:
        path, why = _build_at_first_use()
        if path is None:
            why = f"no {LIBRARY_NAME} (looked in {', '.join(_candidates())}), and {why}"
    if path is not None and why is None:
        try:
            return _bind_and_register(path), None
        except (OSError, AttributeError) as exc:
            why = f"{path}: {exc}"
    if mode == "ffi":
        raise ImportError(f"linseq.jax: LINSEQ_JAX_CALLS=ffi, but {why}")
    return None, why


_STRUCT_CAPACITY = 0  # the largest problem or grads struct the handlers take (bytes)
_handlers, WHY_NOT = _load()
AVAILABLE = _handlers is not None


def _words(struct, desc, cleared=()):
    """A ctypes struct as int64 words, with every pointer and the fields `cleared` zero (the
    handler fills them from the operands)."""
    copy = type(struct).from_buffer_copy(struct)
    for f in desc["fields"]:
        if f["type"] == "pointer":
            setattr(copy, f["name"], None)
        elif f["name"] in cleared:
            setattr(copy, f["name"], 0)
    raw = bytes(copy)
    return np.frombuffer(raw + bytes(-len(raw) % 8), dtype=np.int64).copy()


class Call:
    """The description of one custom call over `inputs` (an ops.*Inputs of the call's shapes
    and options), its operands added in order."""

    def __init__(self, op_name, inputs, exec_):
        self.op_name, self.inputs, self.exec = op_name, inputs, exec_
        desc = _lib.op_desc(op_name)
        for struct in (desc["problem"], desc["grads"]):
            if struct is not None and struct["size"] > _STRUCT_CAPACITY:
                raise ValueError(f"linseq.jax: op {op_name!r}: its {struct['type']} "
                                 f"({struct['size']} bytes) exceeds the XLA handlers' "
                                 f"{_STRUCT_CAPACITY} bytes (rebuild liblinseq_xla_ffi.so)")
        self._problem = desc["problem"]
        self._tensors = desc["tensors"]
        self._state_out = (desc.get("decode") or {}).get("state_out")
        self._offsets = {f["name"]: f["offset"] for f in desc["problem"]["fields"]}
        # an op without a backward has no grads struct (and no backward target to call)
        self._grad_offsets = ({f["name"]: f["offset"] for f in desc["grads"]["fields"]}
                              if desc["grads"] is not None else {})
        self._fields = {t["name"]: t["field"] for t in desc["tensors"] if t.get("field")}
        self.fields, self.kinds, self._cleared = [], [], []

    def _add(self, offset, kind):
        self.fields.append(offset)
        self.kinds.append(kind)

    def array(self, tensor):
        """A float32 input of the table's name `tensor`."""
        self._add(self._offsets[self._fields[tensor]], F32_POINTER)

    def offsets(self, field="cu_seqlens"):
        self._add(self._offsets[field], I64_POINTER)

    def value(self, field):
        """A float32 scalar option (scale, lower_bound): an operand, so that a new value is
        not a new compiled function."""
        self._add(self._offsets[field], F32_VALUE)
        self._cleared.append(field)

    def entry_arg(self):
        self._add(-1, ENTRY_ARG)

    def attributes(self, n_results=0, grads=(), decode=False):
        """The ffi_call keyword attributes. Forward and decode: where each of the op's outputs
        goes among the `n_results` results (a decode's state output is the new pool, its
        last result); backward: `grads`, the results' gradient names, and the upstream
        gradients given (the entry arguments, in the table's order)."""
        attrs = dict(op=self.op_name,
                     problem=_words(self.inputs.problem, self._problem, self._cleared),
                     exec=_words(self.exec, _lib.op_table["exec"]),
                     fields=np.asarray(self.fields, np.int64),
                     kinds=np.asarray(self.kinds, np.int64))
        if grads:
            attrs["grads"] = np.asarray([self._grad_offsets[self._fields[g]] for g in grads],
                                        np.int64)
            n_upstream = sum(t["role"] == "upstream" for t in self._tensors)
            given = self.kinds.count(ENTRY_ARG)
            attrs["upstream"] = np.asarray([i if i < given else -1 for i in range(n_upstream)],
                                           np.int64)
        else:
            attrs["outputs"] = self._output_places(n_results - decode, decode)
        return attrs

    def _output_places(self, n_results, decode):
        """Per output of the table, the result that holds it, or -1 (a decode's state)."""
        places, taken = [], 0
        for t in self._tensors:
            if t["role"] != "output":
                continue
            if decode and t["name"] == self._state_out:
                places.append(-1)
            else:
                places.append(taken)
                taken += 1
        if taken != n_results:
            raise ValueError(f"linseq.jax: op {self.op_name!r} has {taken} outputs to place, "
                             f"the call {n_results} results")
        return np.asarray(places, np.int64)

    def grad_shape(self, grad):
        """The shape the library writes the gradient `grad` in under this problem."""
        return self.inputs.shapes[grad]


def ffi_call(target, result_shapes, operands, attrs, aliases=None):
    """The custom call of `target` ("forward", "backward", "decode") for the op attrs name."""
    return jax.ffi.ffi_call("linseq_" + target, result_shapes,
                            input_output_aliases=aliases)(*operands, **attrs)


def exec_of(opts):
    """The linseq_exec of an option set (KDA's mode and chunk size; the default otherwise)."""
    return ops.make_exec(**opts.exec_settings())
