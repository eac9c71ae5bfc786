"""The bad-input table of the Python front ends: the same hostile inputs through NumPy, PyTorch
and JAX, each refused before any kernel runs, with the same exception type in every framework
and a message that names the argument.

Wrong dtypes are TypeErrors, wrong shapes and values ValueErrors (LinseqError is one), and
under JAX the refusal comes when the call is made, not from inside a host callback.
"""

import importlib

import numpy as np
import pytest

import linseq
from conftest import require

f32 = np.float32
FRAMEWORKS = ["numpy", "torch", "jax"]
B, T, H, K, V = 1, 5, 2, 4, 3


def _front(framework):
    """(the module whose functions answer in `framework`, a converter of NumPy arrays to it).
    Arrays the framework cannot hold are passed as NumPy arrays, as a caller mixing them
    would: strings and objects everywhere, 64-bit integers under JAX (which keeps 32 bits)."""
    if framework == "numpy":
        return linseq, lambda a: a
    if framework == "torch":
        torch = require("torch")
        return importlib.import_module("linseq.torch"), lambda a: (
            a if a.dtype.kind in "UO" else torch.from_numpy(a))
    jnp = require("jax.numpy")
    return importlib.import_module("linseq.jax"), lambda a: (
        a if a.dtype.kind in "UO" or (a.dtype.kind in "iu" and a.dtype.itemsize > 4)
        else jnp.asarray(a))


def _kda_arrays(T=T):
    return dict(q=np.ones((B, T, H, K), f32), k=np.ones((B, T, H, K), f32),
                v=np.ones((B, T, H, V), f32), g=-np.ones((B, T, H, K), f32),
                beta=np.full((B, T, H), 0.5, f32))


GATE = dict(use_gate_in_kernel=True, A_log=np.zeros(H, f32), dt_bias=np.zeros(H * K, f32))

# (label, overrides of chunk_kda's arguments, exception, words the message must hold)
KDA_ROWS = [
    ("q rank 3", dict(q=np.ones((5, 2, 4), f32)), ValueError, ["q", "[B,T,H,K]"]),
    ("k shape", dict(k=np.ones((1, 5, 2, 5), f32)), ValueError, ["k", "[B,T,H,K]"]),
    ("v heads", dict(v=np.ones((1, 5, 3, 3), f32)), ValueError, ["v", "multiple"]),
    ("v tokens", dict(v=np.ones((1, 4, 2, 3), f32)), ValueError, ["v", "B,T"]),
    ("beta rank", dict(beta=np.ones((1, 5), f32)), ValueError, ["beta", "[B,T,HV]"]),
    ("g shape", dict(g=np.ones((1, 5, 2, 3), f32)), ValueError, ["g", "[B,T,HV,K]"]),
    ("g rank 5", dict(g=np.ones((1, 5, 2, 4, 1), f32)), ValueError, ["g"]),
    ("q complex", dict(q=np.ones((1, 5, 2, 4), np.complex64)), TypeError, ["q", "complex"]),
    ("k bool", dict(k=np.ones((1, 5, 2, 4), bool)), TypeError, ["k", "bool"]),
    ("beta complex", dict(beta=np.ones((1, 5, 2), np.complex128)), TypeError, ["beta"]),
    ("q str", dict(q=np.full((1, 5, 2, 4), "a")), TypeError, ["q", "dtype"]),
    ("h0 shape", dict(initial_state=np.ones((1, 2, 3, 4), f32)), ValueError,
     ["initial_state", "[N,HV,K,V]"]),
    ("h0 bool", dict(initial_state=np.ones((1, 2, 4, 3), bool)), TypeError, ["initial_state"]),
    ("cu end", dict(cu_seqlens=np.array([0, 3, 4])), ValueError, ["cu_seqlens", "T = 5"]),
    ("cu order", dict(cu_seqlens=np.array([0, 4, 2, 5])), ValueError,
     ["cu_seqlens", "non-decreasing"]),
    ("cu float", dict(cu_seqlens=np.array([0.0, 5.0])), TypeError, ["cu_seqlens", "integer"]),
    ("cu bool", dict(cu_seqlens=np.array([False, True])), TypeError, ["cu_seqlens", "integer"]),
    ("cu 2-D", dict(cu_seqlens=np.array([[0, 5]])), ValueError, ["cu_seqlens", "1-D"]),
    ("chunk 48", dict(chunk_size=48), ValueError, ["chunk_size"]),
    ("chunk 2**64", dict(chunk_size=2**64), ValueError, ["chunk_size"]),
    ("scale nan", dict(scale=float("nan")), ValueError, ["scale"]),
    ("scale inf", dict(scale=float("inf")), ValueError, ["scale"]),
    ("scale 0", dict(scale=0.0), ValueError, ["scale"]),
    ("scale 0 in f32", dict(scale=1e-50), ValueError, ["scale", "float32"]),
    ("scale over f32", dict(scale=1e39), ValueError, ["scale", "float32"]),
    ("scale huge int", dict(scale=10**400), ValueError, ["scale"]),
    ("scale str", dict(scale="0.5"), TypeError, ["scale"]),
    ("scale bool", dict(scale=True), TypeError, ["scale"]),
    ("scale array", dict(scale=np.ones(2, f32)), TypeError, ["scale"]),
    ("lower_bound 0 in f32", dict(GATE, lower_bound=-1e-50), ValueError,
     ["lower_bound", "float32"]),
    ("lower_bound 0", dict(GATE, lower_bound=0.0), ValueError, ["lower_bound"]),
    ("lower_bound > 0", dict(GATE, lower_bound=2.0), ValueError, ["lower_bound"]),
    ("lower_bound nan", dict(GATE, lower_bound=float("nan")), ValueError, ["lower_bound"]),
    ("lower_bound -inf", dict(GATE, lower_bound=-float("inf")), ValueError, ["lower_bound"]),
    ("dt_bias size", dict(GATE, dt_bias=np.zeros(7, f32)), ValueError, ["dt_bias"]),
    ("dt_bias [K,H]", dict(GATE, dt_bias=np.zeros((K, H), f32)), ValueError,
     ["dt_bias", "[HV,K]"]),
    ("dt_bias [HV*K,1]", dict(GATE, dt_bias=np.zeros((H * K, 1), f32)), ValueError,
     ["dt_bias"]),
    ("dt_bias rank 3", dict(GATE, dt_bias=np.zeros((2, 2, 2), f32)), ValueError, ["dt_bias"]),
    ("dt_bias bool", dict(GATE, dt_bias=np.zeros(H * K, bool)), TypeError, ["dt_bias"]),
    ("A_log shape", dict(GATE, A_log=np.zeros(3, f32)), ValueError, ["A_log"]),
]


def _call_kda(framework, over):
    fns, to = _front(framework)
    a = _kda_arrays()
    kw = {}
    for key, value in over.items():
        value = to(value) if isinstance(value, np.ndarray) else value
        (a if key in a else kw)[key] = value
    a = {n: (x if n in over else to(x)) for n, x in a.items()}
    return fns.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **kw)


def _expect(exc, words, call):
    with pytest.raises(exc) as info:
        call()
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def _expect_refused(framework, entry, defaults, over, exc, words):
    """Calls the front end's entry with the defaults replaced by over (arrays converted)."""
    fns, to = _front(framework)
    a = dict(defaults, **over)
    a = {n: (to(x) if isinstance(x, np.ndarray) else x) for n, x in a.items()}
    _expect(exc, words, lambda: getattr(fns, entry)(**a))


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("label,over,exc,words", KDA_ROWS, ids=[r[0] for r in KDA_ROWS])
def test_kda_refuses(framework, label, over, exc, words):
    _expect(exc, words, lambda: _call_kda(framework, over))


# kda_decode: (label, state_indices or a replaced pool, exception, words)
DECODE_ROWS = [
    ("rows -0.5", dict(state_indices=np.array([-0.5])), TypeError, ["state_indices", "integer"]),
    ("rows nan", dict(state_indices=np.array([np.nan])), TypeError, ["state_indices"]),
    ("rows bool", dict(state_indices=np.array([True])), TypeError, ["state_indices"]),
    ("rows str", dict(state_indices=np.array(["0"])), TypeError, ["state_indices"]),
    ("rows uint64", dict(state_indices=np.array([2**63 + 1], np.uint64)), ValueError,
     ["state_indices"]),
    ("rows shape", dict(state_indices=np.array([0, 1])), ValueError, ["state_indices", "[B]"]),
    ("rows 2-D", dict(state_indices=np.array([[0]])), ValueError, ["state_indices"]),
    ("pool rank", dict(state=np.zeros((3, 2, 4), f32)), ValueError, ["state"]),
    ("pool shape", dict(state=np.zeros((2, 2, 3, 4), f32)), ValueError, ["state"]),
    ("pool complex", dict(state=np.zeros((2, 2, 4, 3), np.complex64)), TypeError, ["state"]),
    ("pool bool", dict(state=np.zeros((2, 2, 4, 3), bool)), TypeError, ["state"]),
    ("scale nan", dict(scale=float("nan")), ValueError, ["scale"]),
    ("two tokens", dict(T=2), ValueError, ["q", "one token"]),
]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("label,over,exc,words", DECODE_ROWS, ids=[r[0] for r in DECODE_ROWS])
def test_decode_refuses(framework, label, over, exc, words):
    fns, to = _front(framework)
    over = dict(over)
    a = {n: to(x) for n, x in _kda_arrays(T=over.pop("T", 1)).items()}
    state = to(over.pop("state", np.zeros((2, H, K, V), f32)))
    kw = {n: (to(x) if isinstance(x, np.ndarray) else x) for n, x in over.items()}
    _expect(exc, words, lambda: fns.kda_decode(a["q"], a["k"], a["v"], a["g"], a["beta"],
                                               state, **kw))


def _ssm_arrays():
    x = np.ones((1, 4, 6), f32)
    return dict(hidden_states=x, A=-np.ones((6, 2), f32), B=np.ones((1, 4, 2), f32),
                C=np.ones((1, 4, 2), f32), D=None, dt=x)


SSM_ROWS = [
    ("x rank", dict(hidden_states=np.ones((4, 6), f32)), ValueError, ["hidden_states"]),
    ("A shape", dict(A=np.ones((5, 2), f32)), ValueError, ["A", "[D,N]"]),
    ("B groups", dict(B=np.ones((1, 4, 4, 2), f32), C=np.ones((1, 4, 4, 2), f32)), ValueError,
     ["groups"]),
    ("C shape", dict(C=np.ones((1, 4, 3), f32)), ValueError, ["C"]),
    ("dt complex", dict(dt=np.ones((1, 4, 6), np.complex64)), TypeError, ["dt", "complex"]),
    ("x bool", dict(hidden_states=np.ones((1, 4, 6), bool)), TypeError, ["hidden_states"]),
    ("D shape", dict(D=np.ones(5, f32)), ValueError, ["D"]),
    ("h0 shape", dict(initial_state=np.ones((1, 6, 3), f32)), ValueError, ["initial_state"]),
    ("cu float", dict(cu_seqlens=np.array([0.0, 4.0])), TypeError, ["cu_seqlens"]),
    ("act_fn", dict(gate=np.ones((1, 4, 6), f32), act_fn="gelu"), ValueError, ["act_fn"]),
]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("label,over,exc,words", SSM_ROWS, ids=[r[0] for r in SSM_ROWS])
def test_ssm1_refuses(framework, label, over, exc, words):
    _expect_refused(framework, "state_space_v1", _ssm_arrays(), over, exc, words)


def _ssd_arrays():
    return dict(x=np.ones((1, 4, 2, 3), f32), A=-np.ones(2, f32), B=np.ones((1, 4, 1, 2), f32),
                C=np.ones((1, 4, 1, 2), f32), D=None, dt=np.ones((1, 4, 2), f32))


SSD_ROWS = [
    ("x rank", dict(x=np.ones((1, 4, 6), f32)), ValueError, ["x", "head_dim"]),
    ("A shape", dict(A=-np.ones((2, 1), f32)), ValueError, ["A", "[num_heads]"]),
    ("B groups", dict(B=np.ones((1, 4, 2, 2), f32), C=np.ones((1, 4, 2, 2), f32)), ValueError,
     ["B", "n_groups"]),
    ("n_groups", dict(n_groups=3), ValueError, ["n_groups"]),
    ("C shape", dict(C=np.ones((1, 4, 1, 3), f32)), ValueError, ["C"]),
    ("dt complex", dict(dt=np.ones((1, 4, 2), np.complex64)), TypeError, ["dt", "complex"]),
    ("x bool", dict(x=np.ones((1, 4, 2, 3), bool)), TypeError, ["x"]),
    ("D shape", dict(D=np.ones(3, f32)), ValueError, ["D"]),
    ("gate shape", dict(gate=np.ones((1, 4, 2, 3), f32)), ValueError, ["gate"]),
    ("h0 shape", dict(initial_state=np.ones((1, 2, 2, 3), f32)), ValueError,
     ["initial_state"]),
    ("act_fn", dict(gate=np.ones((1, 4, 6), f32), act_fn="gelu"), ValueError, ["act_fn"]),
]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("label,over,exc,words", SSD_ROWS, ids=[r[0] for r in SSD_ROWS])
def test_state_space_v2_refuses(framework, label, over, exc, words):
    _expect_refused(framework, "state_space_v2", _ssd_arrays(), over, exc, words)


CONV_ROWS = [
    ("x rank", dict(x=np.ones((4, 6), f32)), ValueError, ["x"]),
    ("weight shape", dict(weight=np.ones((6, 2, 4), f32)), ValueError, ["weight"]),
    ("weight D", dict(weight=np.ones((5, 4), f32)), ValueError, ["weight"]),
    ("bias shape", dict(bias=np.ones(5, f32)), ValueError, ["bias"]),
    ("state shape", dict(conv_state=np.ones((1, 6, 4), f32)), ValueError, ["conv_state"]),
    ("x complex", dict(x=np.ones((1, 4, 6), np.complex64)), TypeError, ["x", "complex"]),
    ("weight bool", dict(weight=np.ones((6, 4), bool)), TypeError, ["weight"]),
    ("cu end", dict(cu_seqlens=np.array([0, 3])), ValueError, ["cu_seqlens"]),
    ("activation", dict(activation="tanh"), ValueError, ["activation"]),
]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("label,over,exc,words", CONV_ROWS, ids=[r[0] for r in CONV_ROWS])
def test_conv1d_refuses(framework, label, over, exc, words):
    defaults = dict(x=np.ones((1, 4, 6), f32), weight=np.ones((6, 4), f32))
    _expect_refused(framework, "causal_conv1d", defaults, over, exc, words)


GATE_ROWS = [
    ("gate rank", dict(gate=np.ones((1, 5), f32)), ValueError, ["gate"]),
    ("dt_bias [K,H]", dict(dt_bias=np.zeros((K, H), f32)), ValueError, ["dt_bias", "[H,K]"]),
    ("dt_bias [2,H*K/2]", dict(dt_bias=np.zeros((1, H * K), f32)), ValueError, ["dt_bias"]),
    ("dt_bias per head 2-D", dict(gate=np.ones((1, 5, H), f32), dt_bias=np.zeros((H, 1), f32)),
     ValueError, ["dt_bias", "[H]"]),
    ("A_log bool", dict(A_log=np.zeros(H, bool)), TypeError, ["A_log"]),
    ("lower_bound 0 in f32", dict(lower_bound=-1e-50), ValueError, ["lower_bound"]),
    ("lower_bound > 0", dict(lower_bound=1.0), ValueError, ["lower_bound"]),
]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("label,over,exc,words", GATE_ROWS, ids=[r[0] for r in GATE_ROWS])
def test_kda_decay_refuses(framework, label, over, exc, words):
    defaults = dict(gate=np.ones((1, 5, H, K), f32), A_log=np.zeros(H, f32),
                    dt_bias=np.zeros(H * K, f32))
    _expect_refused(framework, "kda_decay", defaults, over, exc, words)


@pytest.mark.parametrize("value", [2**31, 2**32, -1, 2**64, 1.5, True, "2"])
def test_thread_counts_are_range_checked(value):
    """ctypes would truncate 2**32 to 0 (the default): Python checks the range of a C int."""
    before = linseq.get_num_threads()
    with pytest.raises((ValueError, TypeError), match="n: expected|threads"):
        linseq.set_num_threads(value)
    assert linseq.get_num_threads() == before
    inputs = linseq.ops.KdaInputs(**{n: x for n, x in _kda_arrays().items()})
    with pytest.raises((ValueError, TypeError), match="threads"):
        linseq.ops.kda_forward(inputs, threads=value)
