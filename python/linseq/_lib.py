"""The C library through ctypes: loading, the problem structs of linseq.h, status checks.

The structs mirror include/linseq.h field by field; ctypes lays them out by the C ABI, so the
two agree as long as the field order and types here follow the header. Every call releases
the GIL (ctypes.CDLL does), so Python threads run kernels concurrently.
"""

import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))

OK = 0
STATUS_NAMES = {
    1: "null pointer", 2: "invalid size", 3: "size overflow", 4: "shape mismatch",
    5: "invalid cu_seqlens", 6: "invalid enum", 7: "invalid value", 8: "aliasing",
    9: "unsupported", 10: "out of memory", 11: "device error",
}

MODE_DEFAULT, MODE_RECURRENT, MODE_CHUNKED = 0, 1, 2
DECAY_NONE, DECAY_PER_HEAD, DECAY_PER_CHANNEL = 0, 1, 2
ACT_DEFAULT, ACT_IDENTITY, ACT_SILU, ACT_SIGMOID, ACT_GELU_TANH, ACT_RELU = 0, 1, 2, 3, 4, 5

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


class Exec(ctypes.Structure):
    _fields_ = [("mode", _int), ("chunk_size", _int), ("threads", _int), ("device", _int),
                ("device_index", _int), ("stream", _p), ("dtype", _int)]


class KdaProblem(ctypes.Structure):
    _fields_ = [
        ("B", _i64), ("T", _i64), ("H", _i64), ("HV", _i64), ("K", _i64), ("V", _i64),
        ("cu_seqlens", _p), ("n_seqs", _i64),
        ("q", _p), ("k", _p), ("v", _p), ("beta", _p), ("g", _p), ("h0", _p),
        ("decay", _int), ("scale", _f32),
        ("qk_l2norm", _bool), ("beta_is_logit", _bool), ("state_v_first", _bool),
        ("gate_in_kernel", _bool), ("A_log", _p), ("dt_bias", _p), ("lower_bound", _f32),
    ]


class KdaGrads(ctypes.Structure):
    _fields_ = [("dq", _p), ("dk", _p), ("dv", _p), ("dbeta", _p), ("dg", _p), ("dh0", _p),
                ("dA_log", _p), ("ddt_bias", _p)]


class KdaGateProblem(ctypes.Structure):
    _fields_ = [("B", _i64), ("T", _i64), ("H", _i64), ("K", _i64), ("decay", _int),
                ("g_raw", _p), ("A_log", _p), ("dt_bias", _p), ("lower_bound", _f32)]


class KdaGateGrads(ctypes.Structure):
    _fields_ = [("dg_raw", _p), ("dA_log", _p), ("ddt_bias", _p)]


class Ssm1Problem(ctypes.Structure):
    _fields_ = [
        ("B", _i64), ("T", _i64), ("D", _i64), ("N", _i64), ("G", _i64),
        ("cu_seqlens", _p), ("n_seqs", _i64),
        ("x", _p), ("dt", _p), ("A", _p), ("B_proj", _p), ("C_proj", _p), ("D_skip", _p),
        ("gate", _p), ("h0", _p), ("dt_softplus", _bool), ("dt_bias", _p),
        ("gate_activation", _int),
    ]


class Ssm1Grads(ctypes.Structure):
    _fields_ = [("dx", _p), ("ddt", _p), ("dA", _p), ("dB_proj", _p), ("dC_proj", _p),
                ("dD_skip", _p), ("dgate", _p), ("dh0", _p), ("ddt_bias", _p)]


class Conv1dProblem(ctypes.Structure):
    _fields_ = [("B", _i64), ("T", _i64), ("D", _i64), ("W", _i64), ("cu_seqlens", _p),
                ("n_seqs", _i64), ("x", _p), ("weight", _p), ("bias", _p),
                ("conv_state", _p), ("activation", _int)]


class Conv1dGrads(ctypes.Structure):
    _fields_ = [("dx", _p), ("dweight", _p), ("dbias", _p), ("dconv_state", _p)]


def _library_path():
    override = os.environ.get("LINSEQ_LIBRARY")
    if override:
        return override
    return os.path.join(_HERE, "liblinseq.so")


def _load():
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise ImportError(
            f"linseq: cannot load the C library {path!r} ({exc}); reinstall the package "
            "with `pip install .` from the linseq source tree, or set LINSEQ_LIBRARY to a "
            "built liblinseq.so") from None
    P = ctypes.POINTER
    sigs = {
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
        "linseq_conv1d_forward": (_int, [P(Conv1dProblem), P(Exec), _p, _p]),
        "linseq_conv1d_backward": (_int, [P(Conv1dProblem), P(Exec), _p, _p, P(Conv1dGrads)]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = _load()


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
    check(lib.linseq_set_num_threads(int(n)))


def get_num_threads():
    return lib.linseq_get_num_threads()
