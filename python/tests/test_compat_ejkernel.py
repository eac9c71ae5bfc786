"""linseq.compat.ejkernel: ejkernel's module-level and kernel-level signatures (argument
order, defaults, what is returned and in which dtype), against the float64 definitions of
naive.py, forward and backward, with NumPy, PyTorch and JAX."""

import inspect
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import require

torch = require("torch")
import linseq  # noqa: E402
import naive  # noqa: E402
from linseq.compat import ejkernel  # noqa: E402

f32 = np.float32
B, T, H, K, V = 2, 37, 2, 12, 8   # T no multiple of any chunk, K != V


def close(name, got, want, tol=2e-5):
    got = torch.as_tensor(np.asarray(got, dtype=np.float64) if not isinstance(
        got, torch.Tensor) else got).double()
    want = torch.as_tensor(want).double()
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    assert err <= tol, f"{name}: max rel err {err:.3g} > {tol}"


def kda_inputs(decay="head", seed=0):
    rng = np.random.default_rng(seed)
    shape = {"head": (B, T, H), "channel": (B, T, H, K), None: None}[decay]
    return dict(q=rng.standard_normal((B, T, H, K)).astype(f32),
                k=rng.standard_normal((B, T, H, K)).astype(f32),
                v=rng.standard_normal((B, T, H, V)).astype(f32),
                beta=rng.uniform(0.1, 0.9, (B, T, H)).astype(f32),
                decay=None if shape is None else (-0.5 * rng.random(shape)).astype(f32),
                h0=(0.5 * rng.standard_normal((B, H, K, V))).astype(f32))


def kda_ref(a, h0=None):
    decay = a["decay"] if a["decay"] is not None else np.zeros((B, T, H), f32)
    return naive.kda(*(torch.as_tensor(a[n]) for n in ("q", "k", "v")), torch.as_tensor(decay),
                     torch.as_tensor(a["beta"]), l2=True,
                     h0=None if h0 is None else torch.as_tensor(h0))


def _params(fn):
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()
            if not p.name.startswith("_")]


E = inspect.Parameter.empty
POS, KW = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"


def test_signatures_are_ejkernels():
    assert _params(ejkernel.kernel_delta_attention) == [
        ("query", POS, E), ("key", POS, E), ("value", POS, E), ("beta", POS, E),
        ("decay", POS, None), ("initial_state", POS, None), ("softmax_scale", KW, None),
        ("chunk_size", KW, 64), ("use_qk_l2norm", KW, True), ("use_chunked", KW, True),
        ("return_state", KW, False), ("platform", KW, None), ("cfg", KW, None)]
    assert ejkernel.kda_attention is ejkernel.kernel_delta_attention
    assert linseq.kernel_delta_attention is not ejkernel.kernel_delta_attention  # kernel level
    kda = dict((n, d) for n, _, d in _params(ejkernel.kda))
    assert kda == dict(query=E, key=E, value=E, beta=E, decay=None, initial_state=None,
                       softmax_scale=None, chunk_size=64, use_qk_l2norm=True,
                       use_chunked=True)
    ssm = _params(ejkernel.state_space_v1)
    assert ssm[:10] == [
        ("hidden_states", POS, E), ("A", POS, E), ("B", POS, E), ("C", POS, E),
        ("D", POS, E), ("dt", POS, E), ("gate", POS, None), ("initial_state", POS, None),
        ("conv_state", POS, None), ("act_fn", POS, None)]
    assert {(n, d) for n, _, d in ssm[10:]} >= {("platform", None), ("cfg", None),
                                                ("block_d", 64), ("block_e", 128)}
    assert [n for n, _, _ in _params(ejkernel.kda_decay)][:3] == ["gate", "A_log", "dt_bias"]


@pytest.mark.parametrize("decay", ["head", "channel", None])
@pytest.mark.parametrize("use_chunked", [True, False])
def test_kernel_delta_attention_returns_what_ejkernel_returns(decay, use_chunked):
    a = kda_inputs(decay)
    args = (a["q"], a["k"], a["v"], a["beta"], a["decay"])
    o_ref, h_ref = kda_ref(a)
    out = ejkernel.kernel_delta_attention(*args, use_chunked=use_chunked)
    assert isinstance(out, np.ndarray) and out.dtype == f32    # the output alone
    close("output", out, o_ref)
    out, state = ejkernel.kernel_delta_attention(*args, use_chunked=use_chunked,
                                                 return_state=True)
    close("output", out, o_ref)
    close("final_state", state, h_ref)
    # initial_state: the 6th positional argument, or by name
    o_ref, h_ref = kda_ref(a, a["h0"])
    by_position = ejkernel.kernel_delta_attention(*args, a["h0"], return_state=True)
    by_name = ejkernel.kernel_delta_attention(*args, initial_state=a["h0"], return_state=True)
    for got in (by_position, by_name, ejkernel.kda(*args, initial_state=a["h0"],
                                                   use_chunked=use_chunked)):
        close("output", got[0], o_ref)
        close("final_state", got[1], h_ref)


def test_softmax_scale_and_no_l2norm():
    a = kda_inputs("channel", seed=1)
    out = ejkernel.kernel_delta_attention(a["q"], a["k"], a["v"], a["beta"], a["decay"],
                                          softmax_scale=0.2, use_qk_l2norm=False)
    o_ref, _ = naive.kda(*(torch.as_tensor(a[n]) for n in ("q", "k", "v", "decay", "beta")),
                         scale=0.2)
    close("output", out, o_ref)


def test_chunk_size_platform_and_cfg():
    a = kda_inputs("channel", seed=2)
    args = (a["q"], a["k"], a["v"], a["beta"], a["decay"])
    o_ref, _ = kda_ref(a)
    for size in (1, 7, 48, 200, 2**40, np.int64(32)):     # ejkernel takes any positive size
        close(f"chunk_size={size}", ejkernel.kernel_delta_attention(*args, chunk_size=size),
              o_ref)
    for platform in ("triton", "pallas", "cuda", "tilelang", "xla", "auto", "cute", None):
        close(platform, ejkernel.kernel_delta_attention(*args, platform=platform), o_ref)
    cfg = SimpleNamespace(chunk_size=32, platform="tilelang", backend="gpu")
    close("cfg", ejkernel.kernel_delta_attention(*args, cfg=cfg), o_ref)
    with pytest.raises(ValueError, match="cfg.chunk_size"):   # cfg's size is the one read
        ejkernel.kernel_delta_attention(*args, chunk_size=64,
                                        cfg=SimpleNamespace(chunk_size=0))
    for bad in (0, -16, 1.5, True, "64"):
        with pytest.raises(ValueError, match="chunk_size"):
            ejkernel.kernel_delta_attention(*args, chunk_size=bad)
        with pytest.raises(ValueError, match="chunk_size"):
            ejkernel.kda(*args, chunk_size=bad)
    for bad in ("gpu", "XLA", 3):
        with pytest.raises(ValueError, match="platform"):
            ejkernel.kernel_delta_attention(*args, platform=bad)


@pytest.mark.parametrize("with_state", [False, True])
def test_kernel_delta_attention_trains_with_torch(with_state):
    a = kda_inputs("head", seed=3)
    names = ["q", "k", "v", "beta", "decay", "h0"]
    ours = [torch.tensor(a[n], requires_grad=True) for n in names]
    theirs = [torch.tensor(a[n], dtype=torch.float64, requires_grad=True) for n in names]
    w = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(4))
    out = ejkernel.kernel_delta_attention(*ours[:5], ours[5] if with_state else None)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    (out * w).sum().backward()
    o_ref, _ = naive.kda(theirs[0], theirs[1], theirs[2], theirs[4], theirs[3], l2=True,
                         h0=theirs[5] if with_state else None)
    close("output", out, o_ref)
    (o_ref * w.double()).sum().backward()
    for name, x, y in zip(names, ours, theirs):
        if name == "h0" and not with_state:
            assert x.grad is None
            continue
        close("d" + name, x.grad, y.grad, 5e-5)


def test_kernel_delta_attention_under_jax_jit_and_grad():
    jax = require("jax")
    jnp = require("jax.numpy")
    a = kda_inputs("channel", seed=5)
    w = np.random.default_rng(6).standard_normal((B, T, H, V)).astype(f32)

    def loss(q, v, h0):
        out = ejkernel.kernel_delta_attention(q, jnp.asarray(a["k"]), v, jnp.asarray(a["beta"]),
                                              jnp.asarray(a["decay"]), h0)
        return jnp.sum(out * w)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(
        jnp.asarray(a["q"]), jnp.asarray(a["v"]), jnp.asarray(a["h0"]))
    leaves = {n: torch.tensor(a[n], dtype=torch.float64, requires_grad=True)
              for n in ("q", "v", "h0")}
    o_ref, _ = naive.kda(leaves["q"], torch.as_tensor(a["k"]), leaves["v"],
                         torch.as_tensor(a["decay"]), torch.as_tensor(a["beta"]), l2=True,
                         h0=leaves["h0"])
    (o_ref * torch.as_tensor(w).double()).sum().backward()
    for name, got in zip(("q", "v", "h0"), grads):
        close("d" + name, np.asarray(got), leaves[name].grad, 5e-5)


# state_space_v1 --------------------------------------------------------------------------

def ssm_inputs(seed=0, Bs=2, Ts=29, D=10, N=4):
    rng = np.random.default_rng(seed)
    return dict(x=rng.standard_normal((Bs, Ts, D)).astype(f32),
                A=(-rng.random((D, N)) - 0.2).astype(f32),
                B=rng.standard_normal((Bs, Ts, N)).astype(f32),
                C=rng.standard_normal((Bs, Ts, N)).astype(f32),
                D=rng.standard_normal(D).astype(f32),
                dt=(0.05 + 0.2 * rng.random((Bs, Ts, D))).astype(f32),
                gate=rng.standard_normal((Bs, Ts, D)).astype(f32),
                h0=(0.5 * rng.standard_normal((Bs, D, N))).astype(f32))


def ssm_ref(s, act=torch.nn.functional.silu, dt=None):
    t = {n: torch.as_tensor(x) for n, x in s.items()}
    return naive.ssm1(t["x"], t["A"], t["B"], t["C"], t["D"], t["dt"] if dt is None else dt,
                      gate=t["gate"], h0=t["h0"], act=act)


def test_state_space_v1_positional_act_fn_and_ignored_tiles():
    s = ssm_inputs()
    y_ref, h_ref = ssm_ref(s, act=torch.sigmoid)
    conv = np.ones((2, 10, 3), f32)
    y, h, c = ejkernel.state_space_v1(s["x"], s["A"], s["B"], s["C"], s["D"], s["dt"],
                                      s["gate"], s["h0"], conv, "sigmoid", platform="xla",
                                      cfg=SimpleNamespace(block_d=32, block_e=64),
                                      block_d=16, block_e=256)
    assert c is conv
    close("y", y, y_ref)
    close("ssm_state", h, h_ref)
    for name, bad in (("block_d", 0), ("block_e", -1), ("block_d", 2.0), ("block_e", True)):
        with pytest.raises(ValueError, match=name):
            ejkernel.state_space_v1(s["x"], s["A"], s["B"], s["C"], s["D"], s["dt"],
                                    **{name: bad})
    with pytest.raises(ValueError, match="platform"):
        ejkernel.state_space_v1(s["x"], s["A"], s["B"], s["C"], s["D"], s["dt"],
                                platform="tpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16,
                                   torch.float64])
def test_state_space_v1_returns_the_input_dtype(dtype):
    s = {n: torch.tensor(x).to(dtype) for n, x in ssm_inputs(seed=1).items()}
    y, h, _ = ejkernel.state_space_v1(s["x"], s["A"], s["B"], s["C"], s["D"], s["dt"],
                                      s["gate"], s["h0"])
    assert y.dtype == dtype and h.dtype == dtype
    y_ref, h_ref = naive.ssm1(s["x"], s["A"], s["B"], s["C"], s["D"], s["dt"],
                              gate=s["gate"], h0=s["h0"])
    tol = 2e-5 if dtype in (torch.float32, torch.float64) else 1e-2
    close("y", y, y_ref, tol)
    close("ssm_state", h, h_ref, tol)
    ny, nh, _ = ejkernel.state_space_v1(*(s[n].float().numpy().astype(np.float64)
                                          for n in ("x", "A", "B", "C", "D", "dt")))
    assert ny.dtype == np.float64 and nh.dtype == np.float64


def test_state_space_v1_in_kernel_softplus_trains():
    s = ssm_inputs(seed=2)
    rng = np.random.default_rng(3)
    s["dt"] = rng.standard_normal(s["dt"].shape).astype(f32)   # raw, before softplus
    bias = rng.standard_normal(10).astype(f32)
    names = ["x", "dt", "bias", "h0"]
    values = dict(s, bias=bias)
    ours = {n: torch.tensor(values[n], requires_grad=True) for n in names}
    theirs = {n: torch.tensor(values[n], dtype=torch.float64, requires_grad=True)
              for n in names}
    y, h, _ = ejkernel.state_space_v1(ours["x"], s["A"], s["B"], s["C"], s["D"], ours["dt"],
                                      s["gate"], ours["h0"], dt_softplus=True,
                                      dt_bias=ours["bias"])
    gen = torch.Generator().manual_seed(4)
    w_y, w_h = torch.randn(y.shape, generator=gen), torch.randn(h.shape, generator=gen)
    ((y * w_y).sum() + (h * w_h).sum()).backward()
    t = {n: torch.as_tensor(x) for n, x in s.items()}
    y_ref, h_ref = naive.ssm1(theirs["x"], t["A"], t["B"], t["C"], t["D"],
                              torch.nn.functional.softplus(theirs["dt"] + theirs["bias"]),
                              gate=t["gate"], h0=theirs["h0"])
    close("y", y, y_ref)
    close("ssm_state", h, h_ref)
    ((y_ref * w_y.double()).sum() + (h_ref * w_h.double()).sum()).backward()
    for n in names:
        close("d" + n, ours[n].grad, theirs[n].grad, 5e-5)


def test_kda_decay_is_ejkernels_formula():
    rng = np.random.default_rng(7)
    gate = rng.standard_normal((2, 9, 3)).astype(f32)
    A_log, dt_bias = rng.standard_normal(3).astype(f32), rng.standard_normal(3).astype(f32)
    want = -np.exp(A_log.astype(np.float64)) * np.logaddexp(
        0.0, gate.astype(np.float64) + dt_bias)
    got = ejkernel.kda_decay(gate, A_log, dt_bias)
    assert got.dtype == f32
    close("decay", got, torch.as_tensor(want))
