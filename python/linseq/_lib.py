"""The C library through ctypes: loading, the problem structs of linseq.h, status checks.

The structs are not written out here: the library describes them (linseq_op_table_json:
every field's name, type and offset, and each struct's size), and this module builds its
ctypes classes from that description, then checks that ctypes lays each one out at exactly
the offsets and size the C compiler chose. A field added to linseq.h therefore reaches
Python without an edit here, and a layout that would misbind refuses to load. Every call
releases the GIL (ctypes.CDLL does), so Python threads run kernels concurrently.
"""

import ctypes
import json
import os

from ._arrays import as_c_int as _as_c_int

_HERE = os.path.dirname(os.path.abspath(__file__))

OK = 0
STATUS_NAMES = {
    1: "null pointer", 2: "invalid size", 3: "size overflow", 4: "shape mismatch",
    5: "invalid cu_seqlens", 6: "invalid enum", 7: "invalid value", 8: "aliasing",
    9: "unsupported", 10: "out of memory", 11: "device error",
}

MODE_DEFAULT, MODE_RECURRENT, MODE_CHUNKED = 0, 1, 2
ACT_DEFAULT = 0

_p = ctypes.c_void_p
_i64 = ctypes.c_int64
_f32 = ctypes.c_float
_bool = ctypes.c_bool
_int = ctypes.c_int


class LinseqError(ValueError):
    """A call the C library refused; `status` is the linseq_status code."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def cache_dir():
    """Where linseq keeps what it compiles at first use: $LINSEQ_CACHE_DIR, else
    $XDG_CACHE_HOME/linseq, else ~/.cache/linseq."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get("LINSEQ_CACHE_DIR") or os.path.join(base, "linseq")


def header_dir():
    """The folder of linseq.h, for what is compiled at first use: include/ in the installed
    package, the tree's top in a source checkout; None when neither has it."""
    for d in (os.path.join(_HERE, "include"), os.path.join(_HERE, os.pardir, os.pardir,
                                                           "include")):
        if os.path.exists(os.path.join(d, "linseq.h")):
            return d
    return None


def _library_path():
    override = os.environ.get("LINSEQ_LIBRARY")
    if override:
        return override
    return os.path.join(_HERE, "liblinseq.so")




class Strides(ctypes.Structure):
    """linseq_strides: element strides of a per-token input (all zero: dense)."""
    _fields_ = [("batch", _i64), ("token", _i64), ("channel", _i64), ("state", _i64)]


# The C types of linseq_op_table_json's "type" names.
_CTYPES = {"int64": _i64, "float32": _f32, "bool": _bool, "enum": _int, "int": _int,
           "pointer": _p, "strides": Strides}


def _class_name(c_type):
    """linseq_kda_gate_problem -> KdaGateProblem."""
    return "".join(part.capitalize() for part in c_type[len("linseq_"):].split("_"))


def struct_class(desc):
    """A ctypes Structure laid out from one struct's description; ValueError when ctypes
    would place a field elsewhere than the C compiler did (the binding would misbind)."""
    fields = sorted(desc["fields"], key=lambda f: f["offset"])
    cls = type(_class_name(desc["type"]), (ctypes.Structure,),
               {"_fields_": [(f["name"], _CTYPES[f["type"]]) for f in fields]})
    for f in fields:
        got = getattr(cls, f["name"]).offset
        if got != f["offset"]:
            raise ValueError(f"{desc['type']}.{f['name']}: ctypes puts it at offset {got}, "
                             f"the C library at {f['offset']}")
    if ctypes.sizeof(cls) != desc["size"]:
        raise ValueError(f"{desc['type']}: ctypes size {ctypes.sizeof(cls)}, C size "
                         f"{desc['size']}")
    return cls


def struct_classes(table):
    """{class name: ctypes class} of every struct a table describes: linseq_exec (as Exec),
    linseq_state_pool (as StatePool) and each op's problem and grads structs; a forward-only op ("grads": null) has no grads
    struct. Ops may share a struct (kda_segment reads linseq_kda_problem): one class each."""
    structs = {"Exec": struct_class(table["exec"]),
               "StatePool": struct_class(table["state_pool"])}
    for op in table["ops"]:
        for part in ("problem", "grads"):
            if op[part] is not None:
                cls = struct_class(op[part])
                structs[cls.__name__] = cls
    return structs


def _load():
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise ImportError(
            f"linseq: cannot load the C library {path!r} ({exc}); reinstall the package "
            "with `pip install .` from the linseq source tree, or set LINSEQ_LIBRARY to a "
            "built liblinseq.so") from None
    lib.linseq_op_table_json.restype = ctypes.c_char_p
    lib.linseq_op_table_json.argtypes = []
    text = lib.linseq_op_table_json()
    if not text:
        raise ImportError("linseq: the C library could not describe its structs (no memory)")
    table = json.loads(text.decode())
    globals().update(struct_classes(table))
    return lib, table


def _bind(lib):
    P = ctypes.POINTER
    sigs = {
        "linseq_op_shapes": (_int, [ctypes.c_char_p, _p, _int, P(_int), P(ctypes.c_int64)]),
        "linseq_op_forward": (_int, [ctypes.c_char_p, _p, P(Exec), P(_p)]),
        "linseq_op_decode": (_int, [ctypes.c_char_p, _p, P(Exec), _p, _i64, _p, P(_p)]),
        "linseq_op_decode_pool": (_int, [ctypes.c_char_p, _p, P(Exec), P(StatePool), P(_p)]),
        "linseq_op_decode_tokens_pool": (_int, [ctypes.c_char_p, _p, P(Exec), P(StatePool),
                                                P(_p)]),
        "linseq_op_forward_pool": (_int, [ctypes.c_char_p, _p, P(Exec), P(StatePool), _p,
                                          P(_p)]),
        "linseq_op_forward_pool_blocks": (_int, [ctypes.c_char_p, _p, P(Exec), P(StatePool), _p,
                                                 ctypes.c_int64, _p, ctypes.c_int64, _p,
                                                 P(_p)]),
        "linseq_op_backward": (_int, [ctypes.c_char_p, _p, P(Exec), P(_p), _p]),
        "linseq_state_pool_row_stride": (_int, [_int, P(ctypes.c_int64), P(ctypes.c_int64),
                                                P(ctypes.c_int64)]),
        "linseq_last_error": (ctypes.c_char_p, []),
        "linseq_version": (ctypes.c_char_p, []),
        "linseq_isa": (ctypes.c_char_p, []),
        "linseq_set_num_threads": (_int, [_int]),
        "linseq_get_num_threads": (_int, []),
        "linseq_kda_forward": (_int, [P(KdaProblem), P(Exec), _p, _p]),
        "linseq_kda_decode": (_int, [P(KdaProblem), P(Exec), _p, _i64, _p, _p]),
        "linseq_kda_backward": (_int, [P(KdaProblem), P(Exec), _p, _p, P(KdaGrads)]),
        "linseq_kda_saved_size": (_int, [P(KdaProblem), P(Exec), P(ctypes.c_size_t)]),
        "linseq_kda_forward_train": (_int, [P(KdaProblem), P(Exec), _p, _p, _p,
                                            ctypes.c_size_t]),
        "linseq_kda_backward_saved": (_int, [P(KdaProblem), P(Exec), _p, ctypes.c_size_t,
                                             _p, _p, P(KdaGrads)]),
        "linseq_kda_gate_forward": (_int, [P(KdaGateProblem), P(Exec), _p]),
        "linseq_kda_gate_backward": (_int, [P(KdaGateProblem), P(Exec), _p, P(KdaGateGrads)]),
        "linseq_ssm1_forward": (_int, [P(Ssm1Problem), P(Exec), _p, _p]),
        "linseq_ssm1_backward": (_int, [P(Ssm1Problem), P(Exec), _p, _p, P(Ssm1Grads)]),
        "linseq_ssm1_saved_size": (_int, [P(Ssm1Problem), P(Exec), P(ctypes.c_size_t)]),
        "linseq_ssm1_forward_train": (_int, [P(Ssm1Problem), P(Exec), _p, _p, _p,
                                             ctypes.c_size_t]),
        "linseq_ssm1_backward_saved": (_int, [P(Ssm1Problem), P(Exec), _p, ctypes.c_size_t,
                                              _p, _p, P(Ssm1Grads)]),
        "linseq_ssm1_decode": (_int, [P(Ssm1Problem), P(Exec), _p, _i64, _p, _p]),
        "linseq_conv1d_forward": (_int, [P(Conv1dProblem), P(Exec), _p, _p]),
        "linseq_conv1d_backward": (_int, [P(Conv1dProblem), P(Exec), _p, _p, P(Conv1dGrads)]),
        "linseq_conv1d_decode": (_int, [P(Conv1dProblem), P(Exec), _p, _i64, _i64, _p, _p,
                                        _p]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib, op_table = _load()
_bind(lib)
_OPS = {o["name"]: o for o in op_table["ops"]}
# op name -> (its name as bytes, {tensor name: its index in the table's tensors list})
_SHAPE_INDEX = {name: (name.encode(), {t["name"]: i for i, t in enumerate(o["tensors"])})
                for name, o in _OPS.items()}


def op_desc(op_name):
    """The op table's entry of op_name ("kda", "ssm1", "ema", ...); ValueError naming it and
    the table's ops when there is none."""
    desc = _OPS.get(op_name)
    if desc is None:
        raise ValueError(f"{op_name!r}: not an op of the library's table (its ops: "
                         f"{', '.join(_OPS)})")
    return desc


def op_tensors(op_name, role):
    """The tensors of one role ("input", "output", "upstream", "grad"), in table order."""
    return [t for t in op_desc(op_name)["tensors"] if t["role"] == role]


class NoBackward(NotImplementedError):
    """A backward asked of an op the library describes as forward-only."""

    def __init__(self, op_name):
        super().__init__(f"{op_name}: the op has no backward (the C library describes it as "
                         "forward-only: no gradients); call it where no gradient is needed")


def has_backward(desc):
    """Whether an op table entry has a backward: a grads struct, and "backward" not false."""
    return desc["grads"] is not None and desc.get("backward", True)


def problem_class(op_name):
    """The ctypes class of the op's problem struct."""
    return globals()[_class_name(op_desc(op_name)["problem"]["type"])]


def grads_class(op_name):
    """The ctypes class of the op's grads struct; NoBackward for a forward-only op."""
    desc = op_desc(op_name)
    if not has_backward(desc):
        raise NoBackward(op_name)
    return globals()[_class_name(desc["grads"]["type"])]


_DIMS = 4  # LINSEQ_OP_MAX_DIMS: the dims linseq_op_shapes writes per tensor


class Shapes:
    """Every tensor's shape of one op under one problem, from one linseq_op_shapes call:
    shapes[name] is a tuple, or None when the tensor does not exist with these options."""

    __slots__ = ("_op", "_ranks", "_dims")

    def __init__(self, op_name, problem):
        op = _SHAPE_INDEX.get(op_name)
        if op is None:
            raise ValueError(f"{op_name}: not an op of the library's table")
        name, index = op
        n = len(index)
        ranks, dims = (ctypes.c_int * n)(), (ctypes.c_int64 * (n * _DIMS))()
        if lib.linseq_op_shapes(name, ctypes.addressof(problem), n, ranks, dims) != n:
            raise ValueError(f"{op_name}: the library gave no shapes for this problem")
        self._op, self._ranks, self._dims = index, ranks, dims

    def __getitem__(self, tensor):
        i = self._op[tensor]
        rank = self._ranks[i]
        if rank < 0:
            raise ValueError(f"{tensor}: the sizes give it more elements than an int64 holds")
        return tuple(self._dims[i * _DIMS:i * _DIMS + rank]) if rank else None


def _enum_values(op_name, key):
    """An enum option's values by name, as the library's table lists them."""
    return next(o for o in op_desc(op_name)["options"] if o["key"] == key)["values"]


_DECAYS = _enum_values("kda", "decay")
DECAY_NONE, DECAY_PER_HEAD, DECAY_PER_CHANNEL = (
    _DECAYS["none"], _DECAYS["per_head"], _DECAYS["per_channel"])
_ACTS = _enum_values("ssm1", "gate_activation")
ACT_IDENTITY, ACT_SILU, ACT_SIGMOID, ACT_GELU_TANH, ACT_RELU = (
    _ACTS["identity"], _ACTS["silu"], _ACTS["sigmoid"], _ACTS["gelu_tanh"], _ACTS["relu"])


def check(status):
    """Raises LinseqError with the library's message for a status other than OK."""
    if status != OK:
        message = lib.linseq_last_error().decode("utf-8", "replace")
        raise LinseqError(status, message or STATUS_NAMES.get(status, f"status {status}"))


def version():
    """The C library's version, "MAJOR.MINOR.PATCH"."""
    return lib.linseq_version().decode()


def isa():
    """The instruction set the kernels run with: "avx512", "avx2" or "scalar"."""
    return lib.linseq_isa().decode()


def set_num_threads(n):
    """Default thread count of every call (0 restores the number of processors)."""
    check(lib.linseq_set_num_threads(_as_c_int(n, "n")))


def get_num_threads():
    return lib.linseq_get_num_threads()


def state_pool_row_stride(sizes, strides):
    """linseq_state_pool_row_stride for a pool of these sizes and element strides: the row
    stride, or None where the library's layout rule refuses it (linseq_last_error says why)."""
    n = len(sizes)
    row_stride = ctypes.c_int64()
    status = lib.linseq_state_pool_row_stride(n, (ctypes.c_int64 * n)(*sizes),
                                              (ctypes.c_int64 * n)(*strides),
                                              ctypes.byref(row_stride))
    return None if status else row_stride.value


def bind_entry_points(native, prefix):
    """Hands a separately built library (the XLA FFI handlers, the native PyTorch kernels) the
    C entry points it calls, as the loaded liblinseq's addresses: it lists them by
    <prefix>_entry_name(i) and takes each through <prefix>_bind(name, address). Returns the
    name of one it refused, or None."""
    entry_name, bind = getattr(native, prefix + "_entry_name"), getattr(native, prefix + "_bind")
    entry_name.argtypes, entry_name.restype = [ctypes.c_int], ctypes.c_char_p
    bind.argtypes, bind.restype = [ctypes.c_char_p, ctypes.c_void_p], ctypes.c_int
    index = 0
    while (name := entry_name(index)) is not None:
        address = ctypes.cast(getattr(lib, "linseq_" + name.decode()), ctypes.c_void_p)
        if bind(name, address.value) != 0:
            return name.decode()
        index += 1
    return None
