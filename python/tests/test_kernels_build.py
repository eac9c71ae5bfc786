"""The Hugging Face `kernels` build of linseq (tools/kernels/build.py, `make kernels-build`):
loaded offline with the `kernels` library's own local loader, every exported name gives what
linseq.compat's function of the same name gives, bit for bit (the same C library, a second
copy of it), gradients too; the build's library is the one inside it, and its PyTorch ops
live beside linseq's own without clashing.

The build is LINSEQ_KERNELS_BUILD when set (a folder `make kernels-build` wrote), else made
here from the library this process's linseq loaded.
"""

import os
import pathlib
import platform
import subprocess
import sys

import pytest

from conftest import ROOT, require

torch = require("torch")
kernels = require("kernels")
import linseq  # noqa: E402
import linseq._lib  # noqa: E402
from linseq.compat import causal_conv1d, fla, mamba_ssm, neuron  # noqa: E402

FLA_NAMES = ["chunk_kda", "fused_recurrent_kda", "chunk_gated_delta_rule",
             "fused_recurrent_gated_delta_rule"]
MAMBA_NAMES = ["selective_scan_fn", "selective_state_update", "mamba_inner_fn"]
CONV_NAMES = ["causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_varlen_states"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    prebuilt = os.environ.get("LINSEQ_KERNELS_BUILD")
    if prebuilt:
        return pathlib.Path(prebuilt)
    out = tmp_path_factory.mktemp("kernels") / "linseq"
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "kernels", "build.py"),
                    "--library", linseq._lib.lib._name, "--out", str(out),
                    "--torch-version", torch.__version__], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def kernel(repo):
    # The build's own library, not an override meant for the package under test; the
    # loader is offline (a local path) and picks the CPU variant even on a CUDA torch.
    saved = os.environ.pop("LINSEQ_LIBRARY", None)
    try:
        return kernels.get_local_kernel(repo, backend="cpu")
    finally:
        if saved is not None:
            os.environ["LINSEQ_LIBRARY"] = saved


def test_layout_and_isolation(repo, kernel):
    major, minor = torch.__version__.split(".")[:2]
    variant = f"torch{major}{minor}-cpu-{platform.machine()}-{platform.system().lower()}"
    assert (repo / "build" / variant / "metadata.json").is_file()
    assert pathlib.Path(kernel.__file__).parent.parent.name == variant
    library = pathlib.Path(kernel._linseq._lib.lib._name).resolve()
    assert library.is_relative_to(repo.resolve()), library
    assert kernel.__name__ != "linseq" and sys.modules["linseq"] is linseq
    assert kernel.__version__ == linseq.version()
    # both op namespaces registered in one process
    assert kernel.OPS_NAMESPACE != "linseq"
    assert hasattr(getattr(torch.ops, kernel.OPS_NAMESPACE), "kda")


# Run where `import linseq` fails: the build must need nothing but itself (and torch, kernels)
_STANDALONE = """
import pathlib, sys
import kernels, numpy as np, torch
m = kernels.get_local_kernel(pathlib.Path(sys.argv[1]), backend="cpu")
S, dk, dv = 5, 4, 3
args = (torch.randn(S, dk), torch.randn(S, dk), torch.randn(S, dv), -torch.rand(S, dk),
        torch.rand(S))
out, state = m.kda_recurrent(*args)
assert out.shape == (S, dv) and state.shape == (dk, dv)
out_np, _ = m.kda_recurrent(*(a.numpy() for a in args))
assert isinstance(out_np, np.ndarray) and np.array_equal(out_np, out.numpy())
x = torch.randn(2, 4, 9)
assert m.causal_conv1d_fn(x, torch.randn(4, 3), activation="silu").shape == x.shape
assert not [n for n in sys.modules if n == "linseq" or n.startswith("linseq.")]
print("standalone ok")
"""


def test_runs_without_an_installed_linseq(repo, tmp_path):
    shadow = tmp_path / "linseq"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('no linseq here')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LINSEQ_LIBRARY", "PYTHONPATH")}
    env["PYTHONPATH"] = str(tmp_path)
    run = subprocess.run([sys.executable, "-c", _STANDALONE, str(repo)], env=env,
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "standalone ok" in run.stdout


def test_exports(kernel):
    names = FLA_NAMES + MAMBA_NAMES + CONV_NAMES + list(neuron.__all__)
    assert sorted(kernel.__all__) == sorted(names)
    for name in names:
        assert callable(getattr(kernel, name)), name


def _same(a, b):
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif a is None:
        assert b is None
    else:
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))


def _rand(*shape, low=None):
    x = torch.randn(*shape)
    return -torch.rand(*shape) if low == "logdecay" else x


def _fla_args(name):
    B, T, H, K, V = 2, 11, 2, 8, 8
    q, k, v = _rand(B, T, H, K), _rand(B, T, H, K), _rand(B, T, H, V)
    beta = torch.rand(B, T, H)
    g = _rand(B, T, H, K, low="logdecay") if "kda" in name else _rand(B, T, H, low="logdecay")
    h0 = _rand(B, H, K, V)
    kwargs = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    if name == "fused_recurrent_gated_delta_rule":
        return (q, k, v), dict(g=g, beta=beta, **kwargs)
    return (q, k, v, g, beta), kwargs


@pytest.mark.parametrize("name", FLA_NAMES)
def test_fla_names_forward_and_backward(kernel, name):
    torch.manual_seed(0)
    args, kwargs = _fla_args(name)
    args = [a.requires_grad_() for a in args]
    got = getattr(kernel, name)(*args, **kwargs)
    want = getattr(fla, name)(*args, **kwargs)
    _same(got, want)
    weights = torch.randn_like(got[0])
    got_grads = torch.autograd.grad((got[0] * weights).sum(), args)
    want_grads = torch.autograd.grad((want[0] * weights).sum(), args)
    _same(got_grads, want_grads)
    assert any(g.abs().sum() > 0 for g in got_grads)


def test_selective_scan_and_state_update(kernel):
    torch.manual_seed(1)
    b, d, n, L = 2, 6, 4, 9
    u, delta, z = _rand(b, d, L), torch.rand(b, d, L), _rand(b, d, L)
    A, B, C, D = -torch.rand(d, n), _rand(b, n, L), _rand(b, n, L), _rand(d)
    u.requires_grad_()
    got = kernel.selective_scan_fn(u, delta, A, B, C, D, z, None, True, True)
    want = mamba_ssm.selective_scan_fn(u, delta, A, B, C, D, z, None, True, True)
    _same(got, want)
    _same(torch.autograd.grad(got[0].sum(), u), torch.autograd.grad(want[0].sum(), u))

    state = _rand(b, d, n)
    x, dt, Bt, Ct = _rand(b, d), torch.rand(b, d), _rand(b, n), _rand(b, n)
    got_state, want_state = state.clone(), state.clone()
    got = kernel.selective_state_update(got_state, x, dt, A, Bt, Ct, D, dt_softplus=True)
    want = mamba_ssm.selective_state_update(want_state, x, dt, A, Bt, Ct, D, dt_softplus=True)
    _same((got, got_state), (want, want_state))
    assert not torch.equal(got_state, state)


def test_mamba_inner_fn(kernel):
    torch.manual_seed(2)
    b, d, n, L, W, rank, out_dim = 2, 6, 4, 9, 4, 2, 5
    args = [_rand(b, 2 * d, L), _rand(d, 1, W), _rand(d), _rand(rank + 2 * n, d),
            _rand(d, rank), _rand(out_dim, d), _rand(out_dim), -torch.rand(d, n)]
    args[0].requires_grad_()
    D = _rand(d)
    got = kernel.mamba_inner_fn(*args, D=D)
    want = mamba_ssm.mamba_inner_fn(*args, D=D)
    _same(got, want)
    _same(torch.autograd.grad(got.sum(), args[0]), torch.autograd.grad(want.sum(), args[0]))


def test_causal_conv1d_names(kernel):
    torch.manual_seed(3)
    b, d, L, W = 2, 5, 10, 4
    x, weight, bias = _rand(b, d, L).requires_grad_(), _rand(d, W), _rand(d)
    got = kernel.causal_conv1d_fn(x, weight, bias, activation="silu")
    want = causal_conv1d.causal_conv1d_fn(x, weight, bias, activation="silu")
    _same(got, want)
    _same(torch.autograd.grad(got.sum(), x), torch.autograd.grad(want.sum(), x))

    state = _rand(b, d, W - 1)
    step = _rand(b, d)
    got_state, want_state = state.clone(), state.clone()
    got = kernel.causal_conv1d_update(step, got_state, weight, bias, "silu")
    want = causal_conv1d.causal_conv1d_update(step, want_state, weight, bias, "silu")
    _same((got, got_state), (want, want_state))
    assert not torch.equal(got_state, state)

    packed, cu = _rand(L, d), torch.tensor([0, 3, L])
    _same(kernel.causal_conv1d_varlen_states(packed, cu, W - 1),
          causal_conv1d.causal_conv1d_varlen_states(packed, cu, W - 1))


def _neuron_args(name):
    S, dk, dv, H = 6, 4, 3, 2
    q, k, v = _rand(S, dk), torch.nn.functional.normalize(_rand(S, dk), dim=-1), _rand(S, dv)
    g, beta, state = _rand(S, dk, low="logdecay"), torch.rand(S, 1), _rand(dk, dv)
    row_beta = beta.expand(S, dk).contiguous()
    if name in ("kda_recurrent_fwd", "kda_recurrent_fwd_state"):
        return (q, k, v, g, row_beta)
    if name == "kda_chunk_step":
        return (q, k, v, row_beta, torch.cumsum(g, 0), torch.cumsum(g, 0)[-1:], state)
    if name == "kda_chunk_step_exact":
        return (q, k, v, beta, g, state)
    if name == "kda_chunk_step_exact_bwd":
        return (q, k, v, beta, g, state, _rand(S, dv), _rand(dk, dv))
    if name == "kda_chunk_step_exact_multihead":
        return tuple(torch.stack([t, t.flip(0)]) for t in (q, k, v, beta, g)) + \
            (torch.stack([state, -state]),)
    if name == "kda_decode_batch":
        return (q, k, v, g, beta, state.expand(S, dk, dv).contiguous())
    return (q, k, v, g, beta[:, 0], state)  # kda_recurrent, kda_chunked, kda_chunked_fused


@pytest.mark.parametrize("name", neuron.__all__)
def test_trainium_names(kernel, name):
    torch.manual_seed(4)
    args = _neuron_args(name)
    _same(getattr(kernel, name)(*args), getattr(neuron, name)(*args))
