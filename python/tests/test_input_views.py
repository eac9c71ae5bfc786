"""Inputs given as views (broadcast, expanded, transposed, sliced, any mix of them) give the
bits of the same call on dense copies, on every path: the table's linseq.ops.run, the
front ends (linseq.api.run, state_space_v1, causal_conv1d; NumPy and PyTorch) and the
drop-ins. The C API reads all-zero element strides as "dense", so a fully broadcast input
passed on with its strides would be read as B*T*D elements of a one-element buffer; the
front ends materialise such an input (read_as_dense) and pass every other view as it is.

Each view is drawn at random over the stride space: which dimensions repeat one value
(stride 0: none, some or all), the order of the dimensions in memory, a step of 1 or 2
and an offset per dimension."""

import os
import subprocess
import sys

import numpy as np
import pytest

import linseq
from linseq import api, ops
from conftest import require

TRIALS = 12


def _values(name, size, rng):
    """Values in the range each input takes (the library checks some of them)."""
    if name in ("beta", "a"):
        return rng.random(size)
    if name in ("g", "A"):
        return -rng.random(size) - 0.05
    if name in ("dt", "delta"):
        return rng.random(size) * 0.2
    return rng.standard_normal(size)


class View:
    """A random strided view of `shape` over a storage of its own: (storage, offset,
    element strides); as NumPy (as_strided) or PyTorch (torch.as_strided) over the same
    memory."""

    def __init__(self, name, shape, rng, broadcast=True):
        nd = len(shape)
        pick = rng.random() if broadcast else 1.0
        if pick < 0.3:
            repeated = set(range(nd))                                    # one value
        elif pick < 0.55:
            repeated = {i for i in range(nd) if rng.random() < 0.5}      # some dims
        else:
            repeated = set()
        base = [1 if i in repeated else n for i, n in enumerate(shape)]
        order = list(rng.permutation(nd)) if rng.random() < 0.5 else list(range(nd))
        step = [int(rng.integers(1, 3)) for _ in range(nd)]
        lead = [int(rng.integers(0, 2)) for _ in range(nd)]
        padded = [base[a] * step[a] + lead[a] for a in order]  # the storage's dims, in memory
        dense = [1] * nd
        for j in range(nd - 2, -1, -1):
            dense[j] = dense[j + 1] * padded[j + 1]
        self.strides, self.offset = [0] * nd, 0
        for j, a in enumerate(order):
            self.strides[a] = 0 if a in repeated else step[a] * dense[j]
            self.offset += lead[a] * dense[j]
        self.shape = tuple(shape)
        self.storage = _values(name, int(np.prod(padded)), rng).astype(np.float32)

    def numpy(self):
        item = self.storage.itemsize
        return np.lib.stride_tricks.as_strided(self.storage[self.offset:], self.shape,
                                               [s * item for s in self.strides])

    def torch(self):
        import torch
        return torch.as_strided(torch.from_numpy(self.storage), self.shape, self.strides,
                                self.offset)


def _bits(value):
    arr = np.asarray(value.detach() if hasattr(value, "detach") else value, np.float32)
    return np.ascontiguousarray(arr).view(np.uint32)


def _same(got, want, what):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        if g is None or w is None:
            assert g is None and w is None, what
            continue
        np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=f"{what}: output {i}")


def _draw(shapes, rng, fixed=()):
    """{name: View} for {name: shape}; the names in `fixed` are never broadcast."""
    return {n: View(n, s, rng, broadcast=n not in fixed) for n, s in shapes.items()}


def _describe(views):
    return ", ".join(f"{n}: strides {v.strides}" for n, v in views.items())


def _dense_numpy(views):
    return {n: np.ascontiguousarray(v.numpy()) for n, v in views.items()}


def _dense_torch(views):
    return {n: v.torch().contiguous() for n, v in views.items()}


# every op of the table, its inputs' shapes and options (ops.run, by the table's names)
B, T, H, K, V, D, N, W = 2, 5, 2, 4, 3, 6, 3, 3
TABLE_CASES = {
    "kda": (dict(q=(B, T, H, K), k=(B, T, H, K), v=(B, T, H, V), beta=(B, T, H),
                 g=(B, T, H, K), h0=(B, H, K, V)), dict(decay="per_channel")),
    "kda_segment": (dict(q=(B, T, H, K), k=(B, T, H, K), v=(B, T, H, V), beta=(B, T, H),
                         g=(B, T, H, K)), dict(decay="per_channel")),
    "kda_gate": (dict(g_raw=(B, T, H, K), A_log=(H,), dt_bias=(H * K,)),
                 dict(decay="per_channel", sizes=dict(B=B, T=T, H=H, K=K))),
    "ssm1": (dict(x=(B, T, D), dt=(B, T, D), A=(D, N), B=(B, T, N), C=(B, T, N), D=(D,),
                  gate=(B, T, D), h0=(B, D, N)), {}),
    "ssm1_segment": (dict(x=(B, T, D), dt=(B, T, D), A=(D, N), B=(B, T, N), C=(B, T, N)), {}),
    "causal_conv1d": (dict(x=(B, T, D), weight=(D, W), bias=(D,), conv_state=(B, D, W - 1)),
                      dict(activation="silu")),
    "ema": (dict(x=(B, T, D), a=(D,), h0=(B, D)), {}),
    "ssd": (dict(x=(B, T, H, K), dt=(B, T, H), A=(H,), B=(B, T, 1, N), C=(B, T, 1, N),
                 D=(H,), z=(B, T, H, K), h0=(B, H, K, N), dt_bias=(H,)), dict(dt_softplus=True)),
    "ssd_segment": (dict(x=(B, T, H, K), dt=(B, T, H), A=(H,), B=(B, T, 1, N),
                         C=(B, T, 1, N), dt_bias=(H,)), dict(dt_softplus=True)),
}


def test_the_cases_cover_every_op_of_the_table():
    assert set(TABLE_CASES) == set(linseq._lib._OPS)


@pytest.mark.parametrize("op", sorted(TABLE_CASES))
def test_table_run_reads_views_as_their_values(op):
    shapes, options = TABLE_CASES[op]
    rng = np.random.default_rng(1000 + sorted(TABLE_CASES).index(op))
    for _ in range(TRIALS):
        views = _draw(shapes, rng)
        got = ops.run(op, {n: v.numpy() for n, v in views.items()}, **options)
        want = ops.run(op, _dense_numpy(views), **options)
        _same(got, want, f"{op} ({_describe(views)})")


# the front ends' own ops (linseq.api.run: strided inputs reach the kernels as they lie)
RUN_CASES = {
    "kda": (dict(q=(B, T, H, K), k=(B, T, H, K), v=(B, T, H, V), beta=(B, T, H),
                 g=(B, T, H, K), h0=(B, H, K, V)), {}),
    "kda_gate": (dict(g_raw=(B, T, H, K), A_log=(H,), dt_bias=(H * K,)), {}),
    "ssm1": (dict(x=(B, T, D), dt=(B, T, D), A=(D, N), B=(B, T, N), C=(B, T, N), D=(D,),
                  gate=(B, T, D), h0=(B, D, N)), dict(activation="silu")),
    "ssm1 grouped": (dict(x=(B, T, D), dt=(B, T, D), A=(D, N), B=(B, T, 2, N),
                          C=(B, T, 1, N)), {}),
    "ssm1 constant B": (dict(x=(B, T, D), dt=(B, T, D), A=(D, N), B=(D, N), C=(B, T, N),
                             dt_bias=(D,)), dict(dt_softplus=True)),
    "ssm1 channel first": (dict(x=(B, D, T), dt=(B, D, T), A=(D, N), B=(B, N, T),
                                C=(B, 3, N, T), gate=(B, D, T)), dict(channel_first=True)),
    "causal_conv1d": (dict(x=(B, T, D), weight=(D, W), bias=(D,), conv_state=(B, D, W - 1)),
                      dict(activation="silu")),
    "causal_conv1d channel first": (dict(x=(B, D, T), weight=(D, W)),
                                    dict(channel_first=True)),
}


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("case", sorted(RUN_CASES))
def test_front_end_run_reads_views_as_their_values(case, framework):
    """NumPy views, PyTorch views over the same memory, and NumPy views handed to the JAX
    backend (which takes them into JAX arrays)."""
    if framework != "numpy":
        require(framework)
    shapes, options = RUN_CASES[case]
    op = case.split()[0]
    rng = np.random.default_rng(2000 + sorted(RUN_CASES).index(case))
    for _ in range(TRIALS if framework != "jax" else 3):
        views = _draw(shapes, rng)
        if framework == "torch":
            given, dense = {n: v.torch() for n, v in views.items()}, _dense_torch(views)
        else:
            given, dense = {n: v.numpy() for n, v in views.items()}, _dense_numpy(views)
        _same(api.run(op, given, _framework=framework, **options),
              api.run(op, dense, _framework=framework, **options),
              f"{case}, {framework} ({_describe(views)})")


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_state_space_v1_and_causal_conv1d_read_views_as_their_values(framework):
    if framework == "torch":
        require("torch")
    rng = np.random.default_rng(3000)
    ssm = dict(hidden_states=(B, T, D), A=(D, N), B=(B, T, N), C=(B, T, N), D=(D,),
               dt=(B, T, D), gate=(B, T, D), initial_state=(B, D, N))
    conv = dict(x=(B, T, D), weight=(D, W), bias=(D,), conv_state=(B, D, W - 1))
    for _ in range(TRIALS):
        for fn, shapes in ((linseq.state_space_v1, ssm), (linseq.causal_conv1d, conv)):
            views = _draw(shapes, rng)
            given = {n: (v.numpy() if framework == "numpy" else v.torch())
                     for n, v in views.items()}
            dense = _dense_numpy(views) if framework == "numpy" else _dense_torch(views)
            _same(fn(**given), fn(**dense), f"{fn.__name__} ({_describe(views)})")


def test_fully_broadcast_input_reads_its_one_value():
    """The reported call: x a single float repeated [4, 4096, 1024] by zero strides. Before,
    the library took x for 16M dense floats of a one-float buffer: a SIGSEGV, or (where the
    output was allocated inside that span) a spurious "output 'hT' overlaps input 'x'". In a
    child process, so that a crash fails this test instead of ending the run."""
    code = """
import numpy as np, linseq
buf = np.full(16, 0.5, np.float32)
x = np.lib.stride_tricks.as_strided(buf[-1:], (4, 4096, 1024), (0, 0, 0))
dt = np.broadcast_to(np.full((1, 1, 1024), 0.01, np.float32), x.shape)  # read as it is
A = -np.ones((1024, 1), np.float32)
B = np.ones((4, 4096, 1), np.float32)
y, h, _ = linseq.state_space_v1(x, A, B, B, None, dt)
want, hw, _ = linseq.state_space_v1(np.ascontiguousarray(x), A, B, B, None, dt)
assert np.array_equal(y, want) and np.array_equal(h, hw)
print("same")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(linseq.__file__))]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "same"


# ------------------------------------------------------------------------------------------
# The drop-ins (PyTorch, their own layouts)
# ------------------------------------------------------------------------------------------

b, d, l, n = 2, 8, 7, 3


def _torch_views(shapes, rng, fixed=()):
    views = _draw(shapes, rng, fixed)
    return views, {k: v.torch() for k, v in views.items()}, _dense_torch(views)


def test_selective_scan_fn_reads_views_as_their_values():
    require("torch")
    from linseq.compat.mamba_ssm import selective_scan_fn
    rng = np.random.default_rng(4000)
    forms = [dict(B=(b, n, l), C=(b, n, l)), dict(B=(b, 2, n, l), C=(b, 1, n, l)),
             dict(B=(d, n), C=(b, n, l))]
    for i in range(TRIALS):
        shapes = dict(u=(b, d, l), delta=(b, d, l), A=(d, n), D=(d,), z=(b, d, l),
                      delta_bias=(d,), **forms[i % len(forms)])
        views, given, dense = _torch_views(shapes, rng)
        softplus = bool(i % 2)
        _same(selective_scan_fn(**given, delta_softplus=softplus, return_last_state=True),
              selective_scan_fn(**dense, delta_softplus=softplus, return_last_state=True),
              f"selective_scan_fn ({_describe(views)})")


def test_selective_state_update_reads_views_as_their_values():
    require("torch")
    from linseq.compat.mamba_ssm import selective_state_update
    rng = np.random.default_rng(5000)
    for i in range(TRIALS):
        shapes = dict(state=(b, d, n), x=(b, d), dt=(b, d), A=(d, n), B=(b, n), C=(b, n),
                      D=(d,), z=(b, d), dt_bias=(d,))
        views, given, dense = _torch_views(shapes, rng, fixed=("state",))
        pool = dense["state"].clone()
        dense["state"] = pool
        y = selective_state_update(**given, dt_softplus=True)
        want = selective_state_update(**dense, dt_softplus=True)
        _same((y, given["state"]), (want, pool), f"selective_state_update ({_describe(views)})")


def test_causal_conv1d_fn_reads_views_as_their_values():
    require("torch")
    from linseq.compat.causal_conv1d import causal_conv1d_fn
    rng = np.random.default_rng(6000)
    for _ in range(TRIALS):
        shapes = dict(x=(b, d, l), weight=(d, 4), bias=(d,), initial_states=(b, d, 3))
        views, given, dense = _torch_views(shapes, rng)
        _same(causal_conv1d_fn(**given, activation="silu", return_final_states=True),
              causal_conv1d_fn(**dense, activation="silu", return_final_states=True),
              f"causal_conv1d_fn ({_describe(views)})")


def test_causal_conv1d_update_reads_views_as_their_values():
    require("torch")
    from linseq.compat.causal_conv1d import causal_conv1d_update
    rng = np.random.default_rng(7000)
    for i in range(TRIALS):
        shapes = dict(x=(b, d) if i % 2 else (b, d, 2), conv_state=(b, d, 4), weight=(d, 4),
                      bias=(d,))
        views, given, dense = _torch_views(shapes, rng, fixed=("conv_state",))
        pool = dense["conv_state"].clone()
        dense["conv_state"] = pool
        y = causal_conv1d_update(**given, activation="silu")
        want = causal_conv1d_update(**dense, activation="silu")
        _same((y, given["conv_state"]), (want, pool),
              f"causal_conv1d_update ({_describe(views)})")


def test_fla_functions_read_views_as_their_values():
    require("torch")
    from linseq.compat.fla import chunk_kda, fused_recurrent_kda
    rng = np.random.default_rng(8000)
    shapes = dict(q=(B, T, H, K), k=(B, T, H, K), v=(B, T, H, V), g=(B, T, H, K),
                  beta=(B, T, H), initial_state=(B, H, K, V))
    for _ in range(TRIALS):
        for fn in (chunk_kda, fused_recurrent_kda):
            views, given, dense = _torch_views(shapes, rng)
            _same(fn(**given, output_final_state=True), fn(**dense, output_final_state=True),
                  f"{fn.__name__} ({_describe(views)})")


@pytest.mark.parametrize("name", ["x", "dt", "z", "B", "C"])
def test_selective_state_update_fast_path_reads_a_broadcast_input(name):
    """The common decode call (dense float32 tensors but one) goes straight to the kernel
    (_torch_direct): a scalar expanded to [b, d] or [b, N] there gives the bits of its copy."""
    torch = require("torch")
    from linseq.compat.mamba_ssm import selective_state_update
    g = torch.Generator().manual_seed(1)
    args = dict(x=torch.randn(b, d, generator=g), dt=torch.rand(b, d, generator=g),
                A=-torch.rand(d, n, generator=g), B=torch.randn(b, n, generator=g),
                C=torch.randn(b, n, generator=g), D=torch.randn(d, generator=g),
                z=torch.randn(b, d, generator=g), dt_bias=torch.randn(d, generator=g))
    args[name] = torch.tensor(0.3).expand(args[name].shape)
    state = torch.randn(b, d, n, generator=g)
    pool = state.clone()
    y = selective_state_update(state, **args, dt_softplus=True)
    args[name] = args[name].contiguous()
    want = selective_state_update(pool, **args, dt_softplus=True)
    _same((y, state), (want, pool), f"selective_state_update, {name} expanded")


@pytest.mark.parametrize("seqlen", [None, 1, 3])
def test_causal_conv1d_update_fast_path_reads_a_broadcast_x(seqlen):
    torch = require("torch")
    from linseq.compat.causal_conv1d import causal_conv1d_update
    g = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(d, 4, generator=g), torch.randn(d, generator=g)
    state = torch.randn(b, d, 5, generator=g)
    pool = state.clone()
    x = torch.tensor(0.7).expand((b, d) if seqlen is None else (b, d, seqlen))
    y = causal_conv1d_update(x, state, weight, bias, "silu")
    want = causal_conv1d_update(x.contiguous(), pool, weight, bias, "silu")
    _same((y, state), (want, pool), "causal_conv1d_update, x expanded")
