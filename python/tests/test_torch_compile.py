"""torch.compile over linseq's PyTorch functions: every entry is a torch.library custom op
with a fake implementation and registered autograd, so torch.compile(fullgraph=True) traces
chunk_kda, kda_decay, state_space_v1, causal_conv1d and kda_decode without a graph break
(fullgraph raises on one) and gives what the eager autograd.Function path gives, forward and
gradients. The same for the drop-ins of linseq.compat (fla's functions, mamba-ssm's and
causal-conv1d's), their in-place decodes included. torch.library.opcheck checks each op's
schema, fake implementation and autograd registration."""

import numpy as np
import pytest

from conftest import require

torch = require("torch")
import linseq.torch as lt  # noqa: E402
from linseq import _opspec, _torch_backend, _torch_ops, api, ops  # noqa: E402

pytestmark = pytest.mark.skipif(not _torch_ops.AVAILABLE,
                                reason="torch.library.custom_op needs PyTorch 2.4+")


def _randn(*shape, seed, scale=1.0, grad=True):
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=gen)).requires_grad_(grad)


def _log_decay(*shape, seed, grad=True):
    """Log decays in [-1, 0): a decay that never grows the state."""
    gen = torch.Generator().manual_seed(seed)
    return (-torch.rand(*shape, generator=gen) - 1e-3).clamp(min=-1.0).requires_grad_(grad)


def _kda_args(B=2, T=21, H=2, G=2, K=8, V=6, per_channel=True, seed=0, grad=True):
    HV = H * G
    return dict(q=_randn(B, T, H, K, seed=seed, grad=grad),
                k=_randn(B, T, H, K, seed=seed + 1, grad=grad),
                v=_randn(B, T, HV, V, seed=seed + 2, grad=grad),
                g=_log_decay(*((B, T, HV, K) if per_channel else (B, T, HV)), seed=seed + 3,
                             grad=grad),
                beta=_randn(B, T, HV, seed=seed + 4, grad=grad))


def _leaves(args):
    return [a for a in args.values() if isinstance(a, torch.Tensor) and a.requires_grad]


def _step(fn, args, weights):
    """Outputs and gradients of sum(output_i * weight_i), with fresh leaf gradients."""
    for a in _leaves(args):
        a.grad = None
    outs = fn(**args)
    loss = sum((o * w).sum() for o, w in zip(outs, weights))
    loss.backward()
    return [o.detach().clone() for o in outs], [a.grad.clone() for a in _leaves(args)]


def _weights(outs, seed=11):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=gen) for o in outs]


def _assert_same(got, want, tol=1e-6):
    """Equal to float32 rounding: max |got - want| <= tol * max |want|, per tensor (some
    gradients have elements far below their tensor's scale, where rounding is relative to
    the scale)."""
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, w.shape)
        err = (g - w).abs().max().item()
        assert err <= tol * max(w.abs().max().item(), 1e-30), f"tensor {i}: max err {err:.3g}"


def _compare_compiled(fn, args, reference, backend="aot_eager", tol=1e-6):
    """fn compiled with fullgraph=True against `reference` (the same computation through the
    eager autograd.Function path), forward and backward."""
    torch._dynamo.reset()
    weights = _weights(reference(**args))
    want_out, want_grad = _step(reference, args, weights)
    got_out, got_grad = _step(torch.compile(fn, fullgraph=True, backend=backend), args,
                              weights)
    _assert_same(got_out, want_out, tol)
    _assert_same(got_grad, want_grad, tol)
    assert all(torch.isfinite(g).all() for g in got_grad)
    assert any(g.abs().sum() > 0 for g in got_grad)


def _eager_function(spec, arrays, cu, opts):
    """The eager autograd.Function of linseq.torch, called directly (the fallback kept for
    PyTorch without torch.library.custom_op)."""
    tensors = [arrays.get(n) for n in spec.arrays]
    train = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    return _torch_backend._LinseqOp.apply(spec, opts, train, cu, *tensors)


# ------------------------------------------------------------------------------------------
# KDA
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
@pytest.mark.parametrize("varlen", [False, True])
def test_chunk_kda_compiles_without_graph_break(mode, varlen):
    args = _kda_args(B=1 if varlen else 2)
    cu = torch.tensor([0, 5, 16, 21]) if varlen else None
    N = 3 if varlen else 2
    args["initial_state"] = _randn(N, 4, 8, 6, seed=20, scale=0.3)
    fla = lt.chunk_kda if mode == "chunked" else lt.fused_recurrent_kda

    def fn(q, k, v, g, beta, initial_state):
        return fla(q, k, v, g, beta, scale=0.4, initial_state=initial_state,
                   output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)

    def reference(q, k, v, g, beta, initial_state):
        arrays = dict(q=q, k=k, v=v, beta=beta, g=g, h0=initial_state, A_log=None,
                      dt_bias=None)
        opts = api.KdaOptions(scale=0.4, qk_l2norm=True, mode=mode, chunk_size=64)
        return _eager_function(_opspec.KDA, arrays, cu, opts)

    _compare_compiled(fn, args, reference)


def test_chunk_kda_gate_in_kernel_compiles():
    args = _kda_args(per_channel=False, seed=3)
    args["A_log"] = _randn(4, seed=30, scale=0.5)
    args["dt_bias"] = _randn(4, seed=31, scale=0.5)

    def fn(q, k, v, g, beta, A_log, dt_bias):
        return lt.chunk_kda(q, k, v, g, beta, output_final_state=True, use_gate_in_kernel=True,
                           A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)

    def reference(q, k, v, g, beta, A_log, dt_bias):
        arrays = dict(q=q, k=k, v=v, beta=beta, g=g, h0=None, A_log=A_log, dt_bias=dt_bias)
        opts = api.KdaOptions(gate_in_kernel=True, beta_is_logit=True)
        return _eager_function(_opspec.KDA, arrays, None, opts)

    _compare_compiled(fn, args, reference)


def test_chunk_kda_with_the_default_inductor_backend():
    args = _kda_args(seed=5)

    def fn(q, k, v, g, beta):
        o, ht = lt.chunk_kda(q, k, v, g, beta, output_final_state=True)
        return torch.tanh(o), ht * 2  # torch ops around linseq's, fused by inductor

    def reference(q, k, v, g, beta):
        arrays = dict(q=q, k=k, v=v, beta=beta, g=g, h0=None, A_log=None, dt_bias=None)
        o, ht = _eager_function(_opspec.KDA, arrays, None, api.KdaOptions())
        return torch.tanh(o), ht * 2

    # inductor generates its own code for tanh and the products: float32 rounding apart
    _compare_compiled(fn, args, reference, backend="inductor", tol=1e-5)


def test_compiled_graphs_call_linseq_kernels():
    """The graphs AOT autograd hands to the compiler call linseq's forward op (with the saved
    block as an output) and its backward op: linseq's kernels run, not a decomposition."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    targets = {"forward": set(), "backward": set()}

    def recorder(kind):
        def compile_graph(gm, example_inputs):
            targets[kind].update(str(n.target) for n in gm.graph.nodes
                                 if n.op == "call_function")
            return make_boxed_func(gm.forward)
        return compile_graph

    backend = aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward"))
    args = _kda_args(seed=8)
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v, g, beta: lt.chunk_kda(q, k, v, g, beta)[0],
                       fullgraph=True, backend=backend)
    fn(**args).sum().backward()
    assert "linseq.kda.default" in targets["forward"], targets
    assert "linseq.kda_backward.default" in targets["backward"], targets
    assert not any("linseq.kda_backward" in t for t in targets["forward"])


def test_saved_block_size_from_shapes_holds_the_library_block():
    """The fake implementation sizes the training forward's block (the last output of
    linseq::kda and linseq::ssm1) from the shapes alone, from the library's size query: at
    least the library's size, with and without cu_seqlens (the lengths are data), and not
    much more."""
    rng = np.random.default_rng(0)
    for mode in ("chunked", "recurrent"):
        for chunk in (16, 64):
            for T, n_cuts in ((1, 0), (37, 0), (64, 0), (130, 4), (50, 9), (200, 30)):
                cuts = np.sort(rng.integers(0, T + 1, n_cuts))
                cu = np.concatenate([[0], cuts, [T]]).astype(np.int64) if n_cuts else None
                B = 1 if n_cuts else 2
                q = np.zeros((B, T, 2, 8), np.float32)
                v = np.zeros((B, T, 4, 6), np.float32)
                inputs = ops.KdaInputs(q, q, v, np.zeros((B, T, 4), np.float32),
                                       cu_seqlens=cu)
                _, _, saved = ops.kda_forward_train(inputs, mode=mode, chunk_size=chunk)
                opts = api.KdaOptions(mode=mode, chunk_size=chunk)
                n_seqs = None if cu is None else len(cu) - 1
                floats = _torch_ops.saved_floats(_opspec.KDA, dict(q=q.shape, v=v.shape),
                                                 n_seqs, opts)
                # rounded up to whole pieces of chunk_size tokens: about one more per sequence
                piece = _torch_ops.saved_floats(
                    _opspec.KDA, dict(q=(1, chunk, 2, 8), v=(1, chunk, 4, 6)), None, opts)
                assert saved.size <= floats <= saved.size + ((n_seqs or B) + 1) * piece, (
                    mode, chunk, T, cu)
    x = np.zeros((2, 130, 3), np.float32)
    p = np.zeros((2, 130, 4), np.float32)
    _, _, saved = ops.ssm1_forward_train(ops.Ssm1Inputs(x, x, np.zeros((3, 4), np.float32),
                                                        p, p))
    floats = _torch_ops.saved_floats(_opspec.SSM1, dict(x=x.shape, A=(3, 4)), None,
                                     api.Ssm1Options())
    assert saved.size <= floats


# ------------------------------------------------------------------------------------------
# Gate, SSM1, conv
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_kda_decay_compiles(lower_bound):
    args = dict(gate=_randn(2, 9, 4, 8, seed=1), A_log=_randn(4, seed=2, scale=0.5),
                dt_bias=_randn(32, seed=3, scale=0.5))

    def fn(gate, A_log, dt_bias):
        return (lt.kda_decay(gate, A_log, dt_bias, lower_bound=lower_bound),)

    def reference(gate, A_log, dt_bias):
        arrays = dict(g_raw=gate, A_log=A_log, dt_bias=dt_bias)
        return _eager_function(_opspec.KDA_GATE, arrays, None,
                               api.GateOptions(lower_bound=lower_bound))

    _compare_compiled(fn, args, reference)


def _ssm1_args(Bsz=1, T=17, D=6, N=4, seed=0):
    return dict(x=_randn(Bsz, T, D, seed=seed), dt=_randn(Bsz, T, D, seed=seed + 1, scale=0.5),
                A=(-torch.rand(D, N, generator=torch.Generator().manual_seed(seed + 2)))
                .requires_grad_(),
                B=_randn(Bsz, T, N, seed=seed + 3), C=_randn(Bsz, T, N, seed=seed + 4),
                D=_randn(D, seed=seed + 5), gate=_randn(Bsz, T, D, seed=seed + 6),
                h0=_randn(Bsz, D, N, seed=seed + 7, scale=0.3),
                dt_bias=_randn(D, seed=seed + 8, scale=0.3))


@pytest.mark.parametrize("act_fn", [None, "gelu", "framework"])
def test_state_space_v1_compiles(act_fn):
    args = _ssm1_args()
    # "framework": a callable the kernel does not know, applied by torch in the graph
    act = {"gelu": torch.nn.GELU(approximate="tanh"),
           "framework": torch.nn.functional.softsign}.get(act_fn)
    kernel_act = {None: "silu", "gelu": "gelu_tanh", "framework": None}[act_fn]

    def fn(x, dt, A, B, C, D, gate, h0, dt_bias):
        y, h, _ = lt.state_space_v1(x, A, B, C, D, dt, gate, h0, act_fn=act, dt_softplus=True,
                                    dt_bias=dt_bias)
        return y, h

    def reference(x, dt, A, B, C, D, gate, h0, dt_bias):
        arrays = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, h0=h0, dt_bias=dt_bias,
                      gate=gate if kernel_act else None)
        y, h = _eager_function(_opspec.SSM1, arrays, None,
                               api.Ssm1Options(activation=kernel_act, dt_softplus=True))
        return (y if kernel_act else y * act(gate)), h

    _compare_compiled(fn, args, reference)


def test_state_space_v1_without_gate_ignores_a_callable_act_fn_under_compile():
    args = _ssm1_args(seed=3)
    args.pop("gate")

    def fn(x, dt, A, B, C, D, h0, dt_bias):
        y, h, _ = lt.state_space_v1(x, A, B, C, D, dt, None, h0, act_fn=torch.tanh,
                                    dt_softplus=True, dt_bias=dt_bias)
        return y, h

    def reference(x, dt, A, B, C, D, h0, dt_bias):
        arrays = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, h0=h0, dt_bias=dt_bias, gate=None)
        return _eager_function(_opspec.SSM1, arrays, None, api.Ssm1Options(dt_softplus=True))

    _compare_compiled(fn, args, reference)


@pytest.mark.parametrize("varlen", [False, True])
def test_causal_conv1d_compiles(varlen):
    B, T, D, W = (1, 19, 5, 4) if varlen else (2, 19, 5, 4)
    cu = torch.tensor([0, 4, 19], dtype=torch.int32) if varlen else None
    N = 2
    args = dict(x=_randn(B, T, D, seed=1), weight=_randn(D, W, seed=2),
                bias=_randn(D, seed=3), conv_state=_randn(N, D, W - 1, seed=4))

    def fn(x, weight, bias, conv_state):
        return lt.causal_conv1d(x, weight, bias, "silu", conv_state, cu_seqlens=cu)

    def reference(x, weight, bias, conv_state):
        arrays = dict(x=x, weight=weight, bias=bias, conv_state=conv_state)
        return _eager_function(_opspec.CONV1D, arrays, cu, api.ConvOptions(activation="silu"))

    _compare_compiled(fn, args, reference)


# ------------------------------------------------------------------------------------------
# Decode
# ------------------------------------------------------------------------------------------

def _decode_inputs(Bsz=3, H=2, HV=4, K=8, V=6, R=5, seed=0):
    a = _kda_args(B=Bsz, T=1, H=H, G=HV // H, K=K, V=V, seed=seed, grad=False)
    pool = _randn(R, HV, K, V, seed=seed + 9, scale=0.3, grad=False)
    rows = torch.tensor([4, -1, 1])
    return a, pool, rows


def test_kda_decode_in_place_under_compile():
    a, pool, rows = _decode_inputs()
    want_pool = pool.clone()
    want_o = torch.from_numpy(ops.kda_decode(
        ops.KdaInputs(a["q"], a["k"], a["v"], a["beta"], a["g"], qk_l2norm=True),
        want_pool.numpy(), rows.numpy()))

    def step(q, k, v, g, beta, state):
        o, new = lt.kda_decode(q, k, v, g, beta, state, rows, use_qk_l2norm_in_kernel=True,
                               inplace=True)
        return o * 1.0, new

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    version = pool._version
    o, new = compiled(**a, state=pool)
    torch.testing.assert_close(o, want_o, rtol=0, atol=0)
    torch.testing.assert_close(pool, want_pool, rtol=0, atol=0)  # the pool itself changed
    assert new.data_ptr() == pool.data_ptr()
    assert pool._version > version

    # a second step on the updated pool: the compiled function reads the new values
    ops.kda_decode(ops.KdaInputs(a["q"], a["k"], a["v"], a["beta"], a["g"], qk_l2norm=True),
                   want_pool.numpy(), rows.numpy())
    compiled(**a, state=pool)
    torch.testing.assert_close(pool, want_pool, rtol=0, atol=0)


def test_kda_decode_new_pool_under_compile_leaves_the_given_one():
    a, pool, rows = _decode_inputs(seed=4)
    before = pool.clone()
    eager_o, eager_pool = lt.kda_decode(**a, state=pool, state_indices=rows)

    def step(q, k, v, g, beta, state):
        return lt.kda_decode(q, k, v, g, beta, state, rows)

    torch._dynamo.reset()
    o, new = torch.compile(step, fullgraph=True, backend="aot_eager")(**a, state=pool)
    torch.testing.assert_close(o, eager_o, rtol=0, atol=0)
    torch.testing.assert_close(new, eager_pool, rtol=0, atol=0)
    torch.testing.assert_close(pool, before, rtol=0, atol=0)
    assert not torch.equal(new, before)


# ------------------------------------------------------------------------------------------
# opcheck: schemas, fake implementations, autograd registration
# ------------------------------------------------------------------------------------------

def _opcheck(op, args):
    torch.library.opcheck(op, args)


def _forward_args(spec, arrays, cu, opts, train):
    return tuple(_torch_ops.OPS[spec].layout.pack(arrays, cu, opts)) + (train,)


def _kda_arrays(grad, per_channel=True, B=2, T=21):
    a = _kda_args(B=B, T=T, per_channel=per_channel, grad=grad)
    return dict(q=a["q"], k=a["k"], v=a["v"], beta=a["beta"], g=a["g"], h0=None, A_log=None,
                dt_bias=None)


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
def test_opcheck_kda(train, varlen):
    arrays = _kda_arrays(grad=train, B=1 if varlen else 2)
    cu = torch.tensor([0, 9, 21]) if varlen else None
    opts = api.KdaOptions(scale=0.5, qk_l2norm=True)
    _opcheck(torch.ops.linseq.kda.default, _forward_args(_opspec.KDA, arrays, cu, opts, train))


def test_opcheck_kda_backward():
    arrays = _kda_arrays(grad=False)
    opts = api.KdaOptions()
    o, ht, saved = torch.ops.linseq.kda(*_forward_args(_opspec.KDA, arrays, None, opts, True))
    layout = _torch_ops.OPS[_opspec.KDA].layout
    wanted = [a is not None for a in arrays.values()]
    for block in (saved, None):
        args = (*layout.pack(arrays, None, opts), torch.ones_like(o), None, block, wanted)
        _opcheck(torch.ops.linseq.kda_backward.default, args)


def test_opcheck_kda_gate():
    arrays = dict(g_raw=_randn(2, 5, 4, seed=1), A_log=_randn(4, seed=2),
                  dt_bias=_randn(4, seed=3))
    _opcheck(torch.ops.linseq.kda_gate.default,
             _forward_args(_opspec.KDA_GATE, arrays, None, api.GateOptions(), True))


def test_opcheck_ssm1_and_conv1d():
    a = _ssm1_args()
    a.pop("gate")
    arrays = dict(a, gate=None)
    _opcheck(torch.ops.linseq.ssm1.default,
             _forward_args(_opspec.SSM1, arrays, None, api.Ssm1Options(dt_softplus=True), True))
    conv = dict(x=_randn(1, 9, 5, seed=1), weight=_randn(5, 3, seed=2), bias=None,
                conv_state=None)
    cu = torch.tensor([0, 4, 9])
    _opcheck(torch.ops.linseq.causal_conv1d.default,
             _forward_args(_opspec.CONV1D, conv, cu, api.ConvOptions("silu"), True))


def test_old_conv_op_name_is_the_same_op():
    """linseq::conv1d, the conv op's name before it took the table's (causal_conv1d), stays
    for one release: the same outputs and gradients, in eager and compiled code."""
    conv = dict(x=_randn(1, 9, 5, seed=3), weight=_randn(5, 3, seed=4), bias=_randn(5, seed=5),
                conv_state=None)
    args = _forward_args(_opspec.CONV1D, conv, torch.tensor([0, 4, 9]), api.ConvOptions("silu"),
                         False)

    def run(op):
        for t in conv.values():
            if t is not None:
                t.grad = None
        y, _ = op(*args)
        y.square().sum().backward()
        return [y.detach()] + [t.grad.clone() for t in conv.values() if t is not None]

    want = run(torch.ops.linseq.causal_conv1d.default)
    _assert_same(run(torch.ops.linseq.conv1d.default), want)
    compiled = torch.compile(lambda *a: torch.ops.linseq.conv1d.default(*a), fullgraph=True)
    _assert_same(run(compiled), want)


def test_opcheck_kda_decode():
    a, pool, rows = _decode_inputs(seed=7)
    arrays = dict(q=a["q"], k=a["k"], v=a["v"], beta=a["beta"], g=a["g"], h0=None,
                  A_log=None, dt_bias=None)
    opts = api.KdaOptions(mode="recurrent")
    layout = _torch_ops.OPS[_opspec.KDA].layout
    args = (*[arrays[n] for n in _opspec.KDA.arrays], pool, rows,
            *[getattr(opts, f) for f in layout.fields])
    _opcheck(torch.ops.linseq.kda_decode.default, args)


# ------------------------------------------------------------------------------------------
# Dynamic shapes, and the eager fallback for PyTorch without custom ops
# ------------------------------------------------------------------------------------------

def test_dynamic_shapes_one_compiled_function_for_several_sizes():
    def fn(q, k, v, g, beta):
        return lt.chunk_kda(q, k, v, g, beta, output_final_state=True)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=True)
    for B, T in ((2, 10), (3, 37), (1, 70)):
        args = _kda_args(B=B, T=T, seed=T)
        weights = _weights(fn(**args))
        want_out, want_grad = _step(fn, args, weights)
        got_out, got_grad = _step(compiled, args, weights)
        _assert_same(got_out, want_out)
        _assert_same(got_grad, want_grad)


def test_without_custom_ops_the_autograd_function_gives_the_same(monkeypatch):
    """PyTorch before 2.4 has no torch.library.custom_op: linseq.torch then runs the eager
    autograd.Function, with the same outputs, gradients and in-place decode."""
    args = _kda_args(B=1, seed=12)
    cu = torch.tensor([0, 8, 21])

    def fn(q, k, v, g, beta):
        return lt.chunk_kda(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu)

    weights = _weights(fn(**args))
    want_out, want_grad = _step(fn, args, weights)
    a, pool, rows = _decode_inputs(seed=2)
    want_o, _ = lt.kda_decode(**a, state=pool.clone(), state_indices=rows, inplace=True)

    monkeypatch.setattr(_torch_ops, "AVAILABLE", False)
    got_out, got_grad = _step(fn, args, weights)
    _assert_same(got_out, want_out)
    _assert_same(got_grad, want_grad)
    assert type(fn(**args)[0].grad_fn).__name__ == "_LinseqOpBackward"
    version = pool._version
    got_o, _ = lt.kda_decode(**a, state=pool, state_indices=rows, inplace=True)
    torch.testing.assert_close(got_o, want_o, rtol=0, atol=0)
    assert pool._version > version


# ------------------------------------------------------------------------------------------
# The drop-ins (linseq.compat): fla's functions run as non-strict blocks, mamba-ssm's and
# causal-conv1d's kernel seams are custom ops (linseq::ssm1 and causal_conv1d in their layouts,
# causal_conv_seq_idx and the in-place mamba_state_update, conv_state_update)
# ------------------------------------------------------------------------------------------

def _compare_with_eager(fn, args):
    """fn compiled with fullgraph=True against fn run eagerly, forward and backward."""
    _compare_compiled(fn, args, fn)


@pytest.mark.parametrize("name", ["chunk_kda", "chunk_gated_delta_rule",
                                  "fused_recurrent_gated_delta_rule"])
def test_compat_fla_compiles(name):
    from linseq.compat import fla
    gated_delta = name != "chunk_kda"
    args = _kda_args(B=1, per_channel=not gated_delta, seed=40)
    kwargs = dict(output_final_state=True, use_qk_l2norm_in_kernel=True,
                  cu_seqlens=torch.tensor([0, 9, 21]))
    if not gated_delta:  # fla's in-kernel gate, with its lower bound
        args["A_log"] = _randn(4, seed=41, scale=0.5)
        args["dt_bias"] = _randn(4 * 8, seed=42, scale=0.5)
        kwargs.update(use_gate_in_kernel=True, lower_bound=-5.0)

    def fn(**a):
        return getattr(fla, name)(**a, **kwargs)

    _compare_with_eager(fn, args)


def test_compat_mamba_selective_scan_fn_compiles():
    from linseq.compat import mamba_ssm
    b, d, l, N = 2, 6, 13, 4
    args = dict(u=_randn(b, d, l, seed=50), delta=_randn(b, d, l, seed=51, scale=0.5),
                A=_log_decay(d, N, seed=52), B=_randn(b, 2, N, l, seed=53),
                C=_randn(b, N, l, seed=54), D=_randn(d, seed=55), z=_randn(b, d, l, seed=56),
                delta_bias=_randn(d, seed=57, scale=0.5))

    def fn(**a):
        return mamba_ssm.selective_scan_fn(**a, delta_softplus=True, return_last_state=True)

    _compare_with_eager(fn, args)


def test_compat_mamba_inner_fn_compiles():
    from linseq.compat import mamba_ssm
    b, d, l, N, rank, W = 2, 4, 11, 3, 2, 4
    args = dict(xz=_randn(b, 2 * d, l, seed=60), conv1d_weight=_randn(d, 1, W, seed=61),
                conv1d_bias=_randn(d, seed=62), x_proj_weight=_randn(rank + 2 * N, d, seed=63),
                delta_proj_weight=_randn(d, rank, seed=64),
                out_proj_weight=_randn(5, d, seed=65), out_proj_bias=_randn(5, seed=66),
                A=_log_decay(d, N, seed=67), D=_randn(d, seed=68),
                delta_bias=_randn(d, seed=69, scale=0.5))

    def fn(**a):
        return (mamba_ssm.mamba_inner_fn(**a),)

    _compare_with_eager(fn, args)


def test_compat_causal_conv1d_fn_compiles():
    from linseq.compat import causal_conv1d
    b, d, l, W = 2, 5, 12, 4
    args = dict(x=_randn(b, d, l, seed=70), weight=_randn(d, W, seed=71),
                bias=_randn(d, seed=72), initial_states=_randn(b, d, W - 1, seed=73))

    def fn(**a):
        return causal_conv1d.causal_conv1d_fn(**a, return_final_states=True,
                                              activation="silu")

    _compare_with_eager(fn, args)


@pytest.mark.parametrize("channel_last", [False, True])
def test_compat_causal_conv1d_fn_with_seq_idx_compiles(channel_last, monkeypatch):
    """Packed sequences by seq_idx (runs of equal indices, -1 padding): the offsets read
    seq_idx's values, inside linseq::causal_conv_seq_idx, so the graph does not break; the
    same outputs and gradients as the path kept for PyTorch without custom ops."""
    from linseq.compat import causal_conv1d
    b, d, l, W = 2, 5, 12, 4
    x = (_randn(b, l, d, seed=74, grad=False).transpose(1, 2).requires_grad_()
         if channel_last else _randn(b, d, l, seed=74))
    args = dict(x=x, weight=_randn(d, W, seed=75), bias=_randn(d, seed=76))
    seq_idx = torch.tensor([[0] * 5 + [1] * 6 + [-1], [2] * 3 + [3] * 9], dtype=torch.int32)

    def fn(**a):
        return (causal_conv1d.causal_conv1d_fn(**a, seq_idx=seq_idx, activation="silu"),)

    _compare_with_eager(fn, args)
    weights = _weights(fn(**args))
    want_out, want_grad = _step(fn, args, weights)
    monkeypatch.setattr(causal_conv1d, "_PACKED_CONV", None)
    got_out, got_grad = _step(fn, args, weights)
    _assert_same(got_out, want_out)
    _assert_same(got_grad, want_grad)


def _update_in_place(update, pool, args):
    """update(pool, *args) eagerly on one copy of the pool and compiled on another: the
    same outputs, the same new pools, and the pool changed."""
    torch._dynamo.reset()
    eager_pool, compiled_pool = pool.clone(), pool.clone()
    want = update(eager_pool, *args)
    got = torch.compile(update, fullgraph=True, backend="aot_eager")(compiled_pool, *args)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(compiled_pool, eager_pool, rtol=0, atol=0)
    assert (eager_pool != pool).any()


def test_compat_causal_conv1d_update_in_place_under_compile():
    from linseq.compat import causal_conv1d
    b, d, W = 3, 5, 4
    weight, bias = _randn(d, W, seed=80, grad=False), _randn(d, seed=81, grad=False)

    rows, seqlens = torch.tensor([3, -1, 0]), torch.tensor([5, 0, 1])  # -1: padding

    def update(pool, x):
        return causal_conv1d.causal_conv1d_update(x, pool, weight, bias, "silu",
                                                  cache_seqlens=seqlens,
                                                  conv_state_indices=rows)

    _update_in_place(update, _randn(4, d, W, seed=82, grad=False),
                     (_randn(b, d, 2, seed=83, grad=False),))


def test_compat_selective_state_update_in_place_under_compile():
    from linseq.compat import mamba_ssm
    b, H, P, N = 2, 3, 4, 5
    A = _log_decay(H, P, N, seed=90, grad=False)
    D, dt_bias = _randn(H, P, seed=91, grad=False), _randn(H, P, seed=92, grad=False)

    def update(pool, x, dt, B, C, z):
        return mamba_ssm.selective_state_update(pool, x, dt, A, B, C, D, z, dt_bias,
                                                dt_softplus=True,
                                                state_batch_indices=torch.tensor([2, 0]))

    _update_in_place(update, _randn(b + 1, H, P, N, seed=93, grad=False),
                     tuple(_randn(*s, seed=94 + i, grad=False) for i, s in enumerate(
                         [(b, H, P), (b, H, P), (b, 1, N), (b, 1, N), (b, H, P)])))


def test_compat_kernel_seams_without_custom_ops_give_the_same(monkeypatch):
    """mamba-ssm's scan and causal-conv1d's conv run linseq's own ops (linseq::ssm1 and
    linseq::causal_conv1d, channel first); without torch.library.custom_op (PyTorch before 2.4)
    the same calls run as the eager autograd.Function: the same outputs and gradients."""
    from linseq.compat import causal_conv1d, mamba_ssm
    b, d, l, N = 2, 4, 9, 3
    args = dict(u=_randn(b, d, l, seed=100), delta=_randn(b, d, l, seed=101, scale=0.5),
                A=_log_decay(d, N, seed=102), B=_randn(b, N, l, seed=103),
                C=_randn(b, N, l, seed=104), z=_randn(b, d, l, seed=105),
                delta_bias=_randn(d, seed=106))

    def fn(u, delta, A, B, C, z, delta_bias):
        y, _ = causal_conv1d._conv(u, delta[0, :, :4], None, None, "silu")
        return mamba_ssm.selective_scan_fn(y, delta, A, B, C, None, z, delta_bias, True, True)

    weights = _weights(fn(**args))
    want_out, want_grad = _step(fn, args, weights)
    assert type(fn(**args)[0].grad_fn).__name__ != "_LinseqOpBackward"
    monkeypatch.setattr(_torch_ops, "AVAILABLE", False)
    got_out, got_grad = _step(fn, args, weights)
    assert type(fn(**args)[0].grad_fn).__name__ == "_LinseqOpBackward"
    _assert_same(got_out, want_out)
    _assert_same(got_grad, want_grad)


def test_opcheck_compat_ops():
    """Schema, fake implementation (shapes and strides of the channel-first and token-major
    calls) and autograd registration of the ops the drop-ins call: linseq's own SSM1 and
    conv ops in mamba-ssm's and causal-conv1d's layouts, and their own seq_idx conv and
    scan and in-place decodes."""
    from linseq.compat import causal_conv1d, mamba_ssd, mamba_ssm  # noqa: F401  (the ops)
    b, d, l, N = 2, 4, 7, 3
    A = _log_decay(d, N, seed=110)
    linseq = torch.ops.linseq
    scan_first = dict(x=_randn(b, d, l, seed=111), dt=_randn(b, d, l, seed=112), A=A,
                      B=_randn(b, 2, N, l, seed=113), C=_randn(b, 1, N, l, seed=114),
                      D=_randn(d, seed=115), gate=_randn(b, d, l, seed=116), h0=None,
                      dt_bias=_randn(d, seed=117))
    scan_last = dict(x=_randn(b, l, d, seed=118), dt=_randn(b, l, d, seed=119), A=A,
                     B=_randn(d, N, seed=120), C=_randn(b, l, 1, N, seed=121), D=None,
                     gate=None, h0=None, dt_bias=None)
    conv_first = dict(x=_randn(b, d, l, seed=122), weight=_randn(d, 4, seed=123),
                      bias=_randn(d, seed=124), conv_state=_randn(b, d, 3, seed=125))
    conv_last = dict(x=_randn(1, l, d, seed=126), weight=_randn(d, 4, seed=127), bias=None,
                     conv_state=None)
    calls = [
        (linseq.ssm1, _forward_args(_opspec.SSM1, scan_first, None, api.Ssm1Options(
            "silu", dt_softplus=True, channel_first=True), True)),
        (linseq.ssm1, _forward_args(_opspec.SSM1, scan_last, None, api.Ssm1Options("silu"),
                                    True)),
        (linseq.causal_conv1d, _forward_args(_opspec.CONV1D, conv_first, None, api.ConvOptions(
            "silu", channel_first=True), True)),
        (linseq.causal_conv1d, _forward_args(_opspec.CONV1D, conv_last, torch.tensor([0, 3, 7]),
                                      api.ConvOptions(), True)),
        (linseq.causal_conv_seq_idx, ("silu", torch.tensor([[0, 0, 1, 1, 1, 2, -1]] * b),
                                      _randn(b, l, d, seed=136), _randn(d, 4, seed=137),
                                      _randn(d, seed=138))),
        # Mamba2's scan with seq_idx: x [b,l,H,P], dt [b,l,H], A [H], B, C [b,l,G,N], D [H],
        # z, dt_bias [H], h0 [b,H,P,N] (P = 4, N = 3); dt_softplus, per-head D, dt in [0.01, 2]
        (linseq.ssd_seq_idx, (torch.tensor([[0, 0, 1, 1, 1, 2, 2]] * b), True, False, 0.01,
                              2.0, _randn(b, l, 2, 4, seed=139), _randn(b, l, 2, seed=140),
                              _log_decay(2, seed=141),
                              _randn(b, l, 1, N, seed=142), _randn(b, l, 1, N, seed=143),
                              _randn(2, seed=144), _randn(b, l, 2, 4, seed=145),
                              _randn(2, seed=146), _randn(b, 2, 4, N, seed=147))),
        (linseq.conv_state_update, (_randn(b, d, l, seed=128, grad=False).transpose(1, 2)
                                    .contiguous().transpose(1, 2),
                                    _randn(b, d, 3, seed=129, grad=False),
                                    _randn(d, 4, seed=130, grad=False), None, "silu", None,
                                    torch.arange(b))),
        (linseq.mamba_state_update, (_randn(b + 1, d, N, seed=131, grad=False),
                                     torch.tensor([2, -1]),
                                     *[_randn(b, d, seed=132 + i, grad=False) for i in (0, 1)],
                                     A.detach(), _randn(b, 1, N, seed=134, grad=False),
                                     _randn(b, 1, N, seed=135, grad=False), None, None, None,
                                     False)),
    ]
    for op, args in calls:
        torch.library.opcheck(op.default, args)
