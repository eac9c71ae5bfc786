"""state_space_v2 (linseq, linseq.torch, linseq.jax, linseq.compat.ejkernel): ejkernel's
Mamba2 signature, against a float64 token-by-token definition written here from the
documented math (S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t + D x_t, then
y * act(gate) or rmsnorm(y) * act(gate)), forward and gradients, with NumPy, PyTorch and JAX;
n_groups, the state in and out, the output dtype and the refusals of bad arguments."""

import inspect

import numpy as np
import pytest

from conftest import require

torch = require("torch")
import linseq  # noqa: E402
import linseq.torch as lt  # noqa: E402
from linseq.compat import ejkernel  # noqa: E402

F = torch.nn.functional
f32 = np.float32
BATCH, T, H, P, N = 2, 23, 4, 3, 5   # T no multiple of a chunk; H, P, N all different


def mamba2(x, A, B, C, D, dt, gate=None, h0=None, n_groups=1, act=F.silu, norm=False,
           eps=1e-5):
    """The definition, token by token in float64 torch (differentiable): head h reads group
    h // (H / n_groups); y is [batch, T, H*P], the state [batch, H, P, N]."""
    x, A, B, C, dt = (t.double() for t in (x, A, B, C, dt))
    batch, steps, heads, head_dim = x.shape
    per_group = heads // n_groups
    S = torch.zeros(batch, heads, head_dim, B.shape[-1], dtype=torch.float64) \
        if h0 is None else h0.double()
    ys = []
    for t in range(steps):
        Bt = B[:, t].repeat_interleave(per_group, dim=1)            # [batch, H, N]
        Ct = C[:, t].repeat_interleave(per_group, dim=1)
        decay = torch.exp(dt[:, t] * A)[:, :, None, None]            # [batch, H, 1, 1]
        S = decay * S + (dt[:, t, :, None] * x[:, t])[..., None] * Bt[:, :, None, :]
        y = torch.einsum("bhpn,bhn->bhp", S, Ct)
        if D is not None:
            y = y + D.double()[:, None] * x[:, t]
        ys.append(y.reshape(batch, heads * head_dim))
    y = torch.stack(ys, 1)
    if gate is not None:
        if norm:
            y = y / torch.sqrt((y * y).mean(-1, keepdim=True) + eps)
        y = y * act(gate.double())
    return y, S


def inputs(seed=0, n_groups=1, steps=T):
    rng = np.random.default_rng(seed)
    return dict(x=rng.standard_normal((BATCH, steps, H, P)).astype(f32),
                A=(-rng.random(H) - 0.1).astype(f32),
                B=rng.standard_normal((BATCH, steps, n_groups, N)).astype(f32),
                C=rng.standard_normal((BATCH, steps, n_groups, N)).astype(f32),
                D=rng.standard_normal(H).astype(f32),
                dt=(0.05 + 0.3 * rng.random((BATCH, steps, H))).astype(f32),
                gate=rng.standard_normal((BATCH, steps, H * P)).astype(f32),
                h0=(0.5 * rng.standard_normal((BATCH, H, P, N))).astype(f32))


ORDER = ("x", "A", "B", "C", "D", "dt", "gate", "h0")


def reference(a, **kwargs):
    return mamba2(*(torch.as_tensor(a[n]) for n in ORDER[:6]),
                  gate=None if a.get("gate") is None else torch.as_tensor(a["gate"]),
                  h0=None if a.get("h0") is None else torch.as_tensor(a["h0"]), **kwargs)


def close(name, got, want, tol=2e-5):
    got = torch.as_tensor(np.asarray(got, np.float64) if not isinstance(got, torch.Tensor)
                          else got.detach()).double()
    want = torch.as_tensor(want).detach().double()
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    assert err <= tol, f"{name}: max rel err {err:.3g} > {tol}"


def test_signature_is_ejkernels():
    E = inspect.Parameter.empty
    params = [(p.name, p.default) for p in inspect.signature(linseq.state_space_v2)
              .parameters.values() if not p.name.startswith("_")]
    assert params == [("x", E), ("A", E), ("B", E), ("C", E), ("D", E), ("dt", E),
                      ("gate", None), ("initial_state", None), ("conv_state", None),
                      ("n_groups", 1), ("act_fn", None), ("use_gated_rmsnorm", False),
                      ("rmsnorm_eps", 1e-5), ("precision", None), ("platform", None),
                      ("cfg", None)]
    assert ejkernel.state_space_v2 is linseq.state_space_v2
    assert inspect.signature(lt.state_space_v2) == inspect.signature(linseq.state_space_v2)


def _numpy_sigmoid(g):
    return 1.0 / (1.0 + np.exp(-g))


@pytest.mark.parametrize("gating", ["none", "silu", "silu_norm", "callable", "callable_norm"])
@pytest.mark.parametrize("n_groups", [1, 2])
@pytest.mark.parametrize("with_state", [False, True])
def test_numpy_matches_the_definition(gating, n_groups, with_state):
    a = inputs(seed=n_groups, n_groups=n_groups)
    if gating == "none":
        a["gate"] = None
    if not with_state:
        a["h0"] = None
    norm = gating.endswith("_norm")
    act_fn = _numpy_sigmoid if gating.startswith("callable") else None
    conv = np.ones((BATCH, 7, 4), f32)
    y, h, c = linseq.state_space_v2(*(a[n] for n in ORDER), conv, n_groups, act_fn,
                                    use_gated_rmsnorm=norm, rmsnorm_eps=1e-3)
    assert c is conv   # passed through
    assert y.dtype == f32 and h.dtype == f32
    y_ref, h_ref = reference(a, n_groups=n_groups, norm=norm, eps=1e-3,
                             act=torch.sigmoid if act_fn else F.silu)
    close("y", y, y_ref)
    close("ssm_state", h, h_ref)


def test_one_token_continues_the_state_and_norm_needs_a_gate():
    a = inputs(seed=3, steps=1)
    y_ref, h_ref = reference(a)
    y, h, _ = ejkernel.state_space_v2(*(a[n] for n in ORDER))      # ejkernel's decode step
    close("y", y, y_ref)
    close("ssm_state", h, h_ref)
    a["gate"] = None   # as in ejkernel, use_gated_rmsnorm without a gate changes nothing
    y, h, _ = linseq.state_space_v2(*(a[n] for n in ORDER), use_gated_rmsnorm=True,
                                    platform="xla", precision="highest", cfg=object())
    close("y", y, reference(a)[0])
    # a sequence in two calls, the first call's state given to the second
    a = inputs(seed=4)
    y_ref, h_ref = reference(a)
    cut = 9
    first = {n: (v[:, :cut] if n in ("x", "B", "C", "dt", "gate") else v) for n, v in a.items()}
    second = {n: (v[:, cut:] if n in ("x", "B", "C", "dt", "gate") else v) for n, v in a.items()}
    y1, h1, _ = linseq.state_space_v2(*(first[n] for n in ORDER))
    y2, h2, _ = linseq.state_space_v2(*(second[n] for n in ORDER[:7]), h1)
    close("y", np.concatenate([y1, y2], 1), y_ref)
    close("ssm_state", h2, h_ref)


@pytest.mark.parametrize("gating", ["silu", "silu_norm", "callable_norm"])
def test_torch_gradients_match_float64_autograd(gating):
    n_groups = 2
    a = inputs(seed=5, n_groups=n_groups)
    norm = gating.endswith("_norm")
    act = torch.tanh if gating.startswith("callable") else None
    ours = {n: torch.tensor(a[n], requires_grad=True) for n in ORDER}
    theirs = {n: torch.tensor(a[n], dtype=torch.float64, requires_grad=True) for n in ORDER}
    y, h, _ = lt.state_space_v2(*(ours[n] for n in ORDER), None, n_groups, act,
                                use_gated_rmsnorm=norm)
    y_ref, h_ref = mamba2(*(theirs[n] for n in ORDER[:6]), gate=theirs["gate"],
                          h0=theirs["h0"], n_groups=n_groups, norm=norm,
                          act=act or F.silu)
    close("y", y, y_ref)
    close("ssm_state", h, h_ref)
    gen = torch.Generator().manual_seed(6)
    w_y, w_h = torch.randn(y.shape, generator=gen), torch.randn(h.shape, generator=gen)
    ((y * w_y).sum() + (h * w_h).sum()).backward()
    ((y_ref * w_y.double()).sum() + (h_ref * w_h.double()).sum()).backward()
    for n in ORDER:
        close("d" + n, ours[n].grad, theirs[n].grad, 1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_torch_returns_the_input_dtype(dtype):
    a = inputs(seed=7)
    t = {n: torch.tensor(a[n]).to(dtype) for n in ORDER}
    y, h, _ = lt.state_space_v2(*(t[n] for n in ORDER), use_gated_rmsnorm=True)
    assert y.dtype == dtype and h.dtype == dtype
    y_ref, h_ref = mamba2(*(t[n] for n in ORDER[:6]), gate=t["gate"], h0=t["h0"], norm=True)
    tol = 2e-5 if dtype == torch.float64 else 2e-2
    close("y", y, y_ref, tol)
    close("ssm_state", h, h_ref, tol)


@pytest.mark.parametrize("act_fn", [None, "silu_fn", "framework"])
def test_torch_compile_fullgraph(act_fn):
    # None: the gate in the kernel; "silu_fn": the norm in the non-strict block; "framework":
    # the norm and softsign in the traced graph
    a = inputs(seed=8, n_groups=2)
    act = {"silu_fn": F.silu, "framework": F.softsign}.get(act_fn)

    def fn(x, A, B, C, D, dt, gate, h0):
        return lt.state_space_v2(x, A, B, C, D, dt, gate, h0, n_groups=2, act_fn=act,
                                 use_gated_rmsnorm=act_fn is not None)[:2]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    results = []
    for run in (fn, compiled):
        leaves = [torch.tensor(a[n], requires_grad=True) for n in ORDER]
        y, h = run(*leaves)
        ((y * y).sum() + h.sum()).backward()
        results.append([y, h] + [t.grad for t in leaves])
    for name, got, want in zip(["y", "h"] + ["d" + n for n in ORDER], *reversed(results)):
        close(name, got, want, 1e-6)


def test_jax_grad_under_jit_matches_float64_autograd():
    jax = require("jax")
    jnp = require("jax.numpy")
    import linseq.jax as lj
    n_groups = 2
    a = inputs(seed=9, n_groups=n_groups)
    w = np.random.default_rng(10).standard_normal((BATCH, T, H * P)).astype(f32)
    names = ("x", "A", "B", "D", "dt", "gate", "h0")

    def loss(x, A, B, D, dt, gate, h0):
        y, h, _ = lj.state_space_v2(x, A, B, jnp.asarray(a["C"]), D, dt, gate, h0,
                                    n_groups=n_groups, act_fn=jax.nn.silu,
                                    use_gated_rmsnorm=True)
        return jnp.sum(y * w) + jnp.sum(h)
    grads = jax.jit(jax.grad(loss, argnums=tuple(range(7))))(*(jnp.asarray(a[n])
                                                               for n in names))
    leaves = {n: torch.tensor(a[n], dtype=torch.float64, requires_grad=True) for n in names}
    y_ref, h_ref = mamba2(leaves["x"], leaves["A"], leaves["B"], torch.as_tensor(a["C"]),
                          leaves["D"], leaves["dt"], gate=leaves["gate"], h0=leaves["h0"],
                          n_groups=n_groups, norm=True)
    ((y_ref * torch.as_tensor(w).double()).sum() + h_ref.sum()).backward()
    for name, got in zip(names, grads):
        close("d" + name, np.asarray(got), leaves[name].grad, 1e-4)


def test_jax_forward_with_a_framework_gate():
    jnp = require("jax.numpy")
    a = inputs(seed=11)
    y, h, _ = linseq.state_space_v2(*(jnp.asarray(a[n]) for n in ORDER), act_fn=jnp.tanh)
    y_ref, h_ref = reference(a, act=torch.tanh)
    close("y", np.asarray(y), y_ref)
    close("ssm_state", np.asarray(h), h_ref)


@pytest.mark.parametrize("name, value", [
    ("x", np.zeros((BATCH, T, H * P), f32)),
    ("A", np.zeros((H, 1), f32)),
    ("B", np.zeros((BATCH, T, 2, N), f32)),          # two groups, n_groups=1
    ("C", np.zeros((BATCH, T, 1, N + 1), f32)),
    ("D", np.zeros((H, P), f32)),
    ("dt", np.zeros((BATCH, T, H, 1), f32)),
    ("gate", np.zeros((BATCH, T, H, P), f32)),
    ("initial_state", np.zeros((BATCH, H, N, P), f32)),   # N-first is not ejkernel's layout
])
def test_bad_shapes_are_refused_by_name(name, value):
    a = inputs(seed=12)
    args = {n: a[n] for n in ORDER}
    args["h0" if name == "initial_state" else name] = value
    with pytest.raises(ValueError, match=f"^{name}: expected"):
        linseq.state_space_v2(*(args[n] for n in ORDER))
    with pytest.raises(ValueError, match=f"^{name}: expected"):
        lt.state_space_v2(*(torch.as_tensor(args[n]) for n in ORDER))


@pytest.mark.parametrize("name, kwargs", [
    ("n_groups", dict(n_groups=3)), ("n_groups", dict(n_groups=0)),
    ("n_groups", dict(n_groups=True)), ("act_fn", dict(act_fn="relu")),
    ("act_fn", dict(act_fn=3)), ("rmsnorm_eps", dict(rmsnorm_eps=-1.0)),
    ("platform", dict(platform="tpu")),
])
def test_bad_options_are_refused_by_name(name, kwargs):
    a = inputs(seed=13)
    with pytest.raises(ValueError, match=name):
        linseq.state_space_v2(*(a[n] for n in ORDER), **kwargs)


def test_a_positive_A_is_refused():
    # the C kernel's contract (ejkernel takes any real A); a value check, made by the kernel
    a = inputs(seed=14)
    a["A"][1] = 0.5
    for fn, to in ((linseq.state_space_v2, np.asarray), (lt.state_space_v2, torch.as_tensor)):
        with pytest.raises(linseq.LinseqError, match=r"A\[1\]"):
            fn(*(to(a[n]) for n in ORDER))
