"""The decode calls that go from torch tensors straight into the kernels (linseq._torch_direct)
give exactly what the general path (NumPy views, ops' checks) gives, outputs and updated
pools, and are taken only where an op's dispatch would change nothing."""

import pytest

torch = pytest.importorskip("torch")

from linseq import _delta_rule, _torch_direct, _torch_native  # noqa: E402
from linseq.compat import causal_conv1d as cc  # noqa: E402
from linseq.compat import fla  # noqa: E402
from linseq.compat import mamba_ssm as ms  # noqa: E402

_DIRECT = ("ssm1_decode", "conv1d_decode", "kda_forward", "kda_token_step")


def _random(gen, *shape):
    return torch.randn(*shape, generator=gen)


def _mamba_update(gen, batch):
    d, n = 12, 5
    state = _random(gen, batch, d, n)
    args = dict(x=_random(gen, batch, d), dt=_random(gen, batch, d) * 0.3,
                A=-torch.rand(d, n, generator=gen), B=_random(gen, batch, n),
                C=_random(gen, batch, n), D=_random(gen, d), z=_random(gen, batch, d),
                dt_bias=_random(gen, d) * 0.1)
    return state, lambda s: ms.selective_state_update(s, **args, dt_softplus=True)


def _conv_update(gen, batch):
    d, width = 10, 4
    state = _random(gen, batch, d, width)
    x = _random(gen, batch, 2 * d, 1)[:, :d]  # a slice of a projection, read where it lies
    weight, bias = _random(gen, d, width), _random(gen, d)
    return state, lambda s: cc.causal_conv1d_update(x, s, weight, bias, activation="silu")


def _kda_step(gen, batch):
    h, k, v = 2, 6, 5
    state = _random(gen, batch, h, k, v) * 0.2
    q, kk, vv = (_random(gen, batch, 1, h, k), _random(gen, batch, 1, h, k),
                 _random(gen, batch, 1, h, v))
    g, beta = -torch.rand(batch, 1, h, k, generator=gen), torch.rand(batch, 1, h, generator=gen)

    def step(s):
        o, ht = fla.fused_recurrent_kda(q, kk, vv, g, beta, initial_state=s,
                                        output_final_state=True, use_qk_l2norm_in_kernel=True)
        s.copy_(ht)
        return o
    return state, step


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("make", [_mamba_update, _conv_update, _kda_step])
def test_direct_equals_general_path(monkeypatch, make, batch):
    if make is not _kda_step and _torch_native.AVAILABLE:
        pytest.skip("the decode ops' C++ kernels take these calls (test_torch_native)")
    taken = []
    for name in _DIRECT:
        real = getattr(_torch_direct, name)

        def spy(*args, real=real, **kwargs):
            result = real(*args, **kwargs)
            taken.append(result is not None)
            return result
        monkeypatch.setattr(_torch_direct, name, spy)
    state, step = make(torch.Generator().manual_seed(7), batch)
    general_state = state.clone()
    with torch.no_grad():
        out = [step(state) for _ in range(3)]
    assert any(taken), "the direct path was not taken"
    for name in _DIRECT:
        monkeypatch.setattr(_torch_direct, name, lambda *args, **kwargs: None)
    with torch.no_grad():
        general = [step(general_state) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(out, general))
    assert torch.equal(state, general_state)


def _token_step_call(gen, dtype, per_channel, with_h0, output_final_state, requires_grad):
    """fla's recurrent entry at T = 1 (a decode step of Kimi Linear or Qwen3-Next)."""
    b, h, hv, k, v = 2, 2, 4, 8, 6
    q, kk = _random(gen, b, 1, h, k).to(dtype), _random(gen, b, 1, h, k).to(dtype)
    vv = _random(gen, b, 1, hv, v).to(dtype).requires_grad_(requires_grad)
    decay = (b, 1, hv, k) if per_channel else (b, 1, hv)
    g = -torch.rand(*decay, generator=gen).to(dtype)
    beta = torch.rand(b, 1, hv, generator=gen).to(dtype)
    h0 = _random(gen, b, hv, k, v) * 0.3 if with_h0 else None
    entry = fla.fused_recurrent_kda if per_channel else fla.fused_recurrent_gated_delta_rule
    return h0, lambda: entry(q, kk, vv, g=g, beta=beta, initial_state=h0,
                             output_final_state=output_final_state,
                             use_qk_l2norm_in_kernel=True)


def _spy_token_step(monkeypatch):
    """A list that gets, per call of _torch_direct.kda_token_step, whether it took the call."""
    taken, real = [], _torch_direct.kda_token_step

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        taken.append(result is not None)
        return result
    monkeypatch.setattr(_torch_direct, "kda_token_step", spy)
    return taken


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("with_h0,output_final_state", [(True, True), (False, True),
                                                        (True, False)])
def test_token_step_equals_general_path(monkeypatch, dtype, per_channel, with_h0,
                                        output_final_state):
    """fla's recurrent entries at T = 1 without gradients go to the decode op's C++ kernel
    over a copy of the initial state: the general path's output and final state bit for bit,
    the caller's initial state untouched."""
    if not _torch_native.AVAILABLE:
        pytest.skip("no C++ decode kernels: the token step is not offered")
    taken = _spy_token_step(monkeypatch)
    h0, call = _token_step_call(torch.Generator().manual_seed(3), dtype, per_channel, with_h0,
                                output_final_state, requires_grad=False)
    h0_before = None if h0 is None else h0.clone()
    with torch.no_grad():
        o, ht = call()
    assert taken == [True], "the token step was not taken"
    assert h0 is None or torch.equal(h0, h0_before)
    monkeypatch.setattr(_torch_direct, "kda_token_step", lambda *a, **kw: None)
    with torch.no_grad():
        o_general, ht_general = call()
    assert o.dtype == o_general.dtype and torch.equal(o, o_general)
    assert (ht is None) == (ht_general is None) == (not output_final_state)
    assert ht is None or torch.equal(ht, ht_general)


@pytest.mark.parametrize("per_channel", [False, True])
def test_token_step_from_h0_needs_no_copy_of_it(monkeypatch, per_channel):
    """A float32 step from an initial state goes to linseq::kda_token_step, which reads h0 and
    writes a new final state in one library call (no copy of h0 first): the general path's
    bits, h0 untouched; bfloat16 tokens are left to the decode over a copy."""
    one_step = _torch_native.defined_here("kda_token_step")
    if one_step is None:
        pytest.skip("no C++ decode kernels")
    taken, real = [], one_step

    def spy(*args):
        result = real(*args)
        taken.append(bool(result))
        return result
    direct, step, _ = _delta_rule._token_step_parts()
    monkeypatch.setattr(_delta_rule, "_TOKEN_STEP_PARTS", (direct, step, spy))
    for dtype in (torch.float32, torch.bfloat16):
        h0, call = _token_step_call(torch.Generator().manual_seed(5), dtype, per_channel, True,
                                    True, requires_grad=False)
        h0_before = h0.clone()
        with torch.no_grad():
            o, ht = call()
        assert torch.equal(h0, h0_before)
        with monkeypatch.context() as general:
            general.setattr(_torch_direct, "kda_token_step", lambda *a, **kw: None)
            with torch.no_grad():
                o_general, ht_general = call()
        assert torch.equal(o, o_general) and torch.equal(ht, ht_general)
    assert taken == [True, False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("output_final_state", [True, False])
def test_adapters_token_step_is_the_recurrent_functions(dtype, per_channel, output_final_state):
    """fla._recurrent_token_step, which the transformers adapters call before fla's
    recurrent functions: their output (dtype included) and final state bit for bit where it
    takes the call, None without an initial state or where a gradient is recorded."""
    if not _torch_native.AVAILABLE:
        pytest.skip("no C++ decode kernels: the token step is not offered")
    gen = torch.Generator().manual_seed(6)
    b, h, hv, k, v = 2, 2, 4, 8, 6
    q, kk = _random(gen, b, 1, h, k).to(dtype), _random(gen, b, 1, h, k).to(dtype)
    vv = _random(gen, b, 1, hv, v).to(dtype)
    g = -torch.rand(*((b, 1, hv, k) if per_channel else (b, 1, hv)), generator=gen).to(dtype)
    beta = torch.rand(b, 1, hv, generator=gen).to(dtype)
    h0 = _random(gen, b, hv, k, v) * 0.3
    entry = fla.fused_recurrent_kda if per_channel else fla.fused_recurrent_gated_delta_rule
    o_want, ht_want = entry(q, kk, vv, g=g, beta=beta, initial_state=h0,
                            output_final_state=output_final_state, use_qk_l2norm_in_kernel=True)
    o, ht = fla._recurrent_token_step(q, kk, vv, g, beta, h0, output_final_state, True)
    assert o.dtype == o_want.dtype and torch.equal(o, o_want.detach())
    assert (ht is None) == (ht_want is None) and (ht is None or torch.equal(ht, ht_want))
    assert fla._recurrent_token_step(q, kk, vv, g, beta, None, True, True) is None
    assert fla._recurrent_token_step(q, kk, vv.requires_grad_(True), g, beta, h0, True,
                                     True) is None


def test_token_step_not_taken_where_gradients_are_recorded(monkeypatch):
    taken = _spy_token_step(monkeypatch)
    _, call = _token_step_call(torch.Generator().manual_seed(4), torch.float32, True, True, True,
                               requires_grad=True)
    o, ht = call()
    assert taken == [False]  # the general path, which records the graph
    assert o.grad_fn is not None and ht.grad_fn is not None


def test_direct_call_only_for_plain_eager_tensors():
    plain = torch.zeros(2)
    assert _torch_direct.direct_call(plain, None, torch.nn.Parameter(torch.zeros(1)))
    with torch.device("meta"):  # a function mode: the op (and its fake) must see the call
        assert not _torch_direct.direct_call(plain)
    assert not _torch_direct.direct_call(torch.zeros(2, device="meta"))
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passthrough():
        assert not _torch_direct.direct_call(plain)
