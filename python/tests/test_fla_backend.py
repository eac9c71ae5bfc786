"""linseq as a backend of fla-core's dispatch (linseq.integrations.fla_backend), with fla-core
from PyPI: after register(), fla's own chunk_kda, fused_recurrent_kda, fused_kda_gate and
chunk_gated_delta_rule on CPU tensors give linseq.compat.fla's results and gradients, bit for
bit, and the backend's call counter shows each call went through fla's dispatch to linseq;
calls with tensors off the CPU are declined (fla's kernels keep them); FLA_LINSEQ=0 switches
the backend off; and a transformers model whose layers import fla's functions (Kimi Linear)
runs on linseq on the CPU, with the logits of transformers' own PyTorch functions.
"""

import pytest

from conftest import require

torch = require("torch")
fla_backends = require("fla.backends")
from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: E402
from fla.ops.kda import chunk_kda, fused_recurrent_kda  # noqa: E402
from fla.ops.kda.gate import fused_kda_gate  # noqa: E402

from linseq.compat import fla as compat  # noqa: E402
from linseq.integrations import fla_backend  # noqa: E402

B, T, H, K, V = 2, 13, 2, 8, 8


@pytest.fixture(scope="module", autouse=True)
def registered():
    return fla_backend.register()


def _inputs(per_channel_decay=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, d, generator=gen) for d in (K, K, V))
    g_shape = (B, T, H, K) if per_channel_decay else (B, T, H)
    g = -torch.rand(*g_shape, generator=gen)
    beta = torch.rand(B, T, H, generator=gen)
    h0 = torch.randn(B, H, K, V, generator=gen)
    return [q, k, v, g, beta], h0


def _check_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)


def _forward_backward(fn, args, kwargs):
    args = [a.detach().clone().requires_grad_() for a in args]
    out = fn(*args, **kwargs)
    weights = torch.linspace(-1, 1, out[0].numel()).reshape(out[0].shape)
    loss = (out[0] * weights).sum() + (out[1].sum() if out[1] is not None else 0)
    return out, torch.autograd.grad(loss, args)


CASES = {
    "chunk_kda": (chunk_kda, compat.chunk_kda, True,
                  dict(use_qk_l2norm_in_kernel=True, output_final_state=True)),
    "fused_recurrent_kda": (fused_recurrent_kda, compat.fused_recurrent_kda, True,
                            dict(use_qk_l2norm_in_kernel=True, output_final_state=True)),
    "chunk_gated_delta_rule": (chunk_gated_delta_rule, compat.chunk_gated_delta_rule, False,
                               dict(use_qk_l2norm_in_kernel=True, output_final_state=True)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("with_state", [False, True])
def test_fla_function_runs_on_linseq(name, with_state):
    fla_fn, compat_fn, per_channel, kwargs = CASES[name]
    args, h0 = _inputs(per_channel)
    if with_state:
        kwargs = dict(kwargs, initial_state=h0)
    before = fla_backend.calls[name]
    got, got_grads = _forward_backward(fla_fn, args, kwargs)
    assert fla_backend.calls[name] == before + 1
    want, want_grads = _forward_backward(compat_fn, args, kwargs)
    _check_same(got, want)
    _check_same(got_grads, want_grads)
    assert all(g.abs().sum() > 0 for g in got_grads)


def test_packed_sequences_and_gate_in_kernel():
    args, _ = _inputs()
    packed = [a.reshape(1, B * T, *a.shape[2:]) for a in args]
    cu = torch.tensor([0, 5, B * T], dtype=torch.long)
    gen = torch.Generator().manual_seed(1)
    A_log, dt_bias = torch.randn(H, generator=gen), torch.randn(H * K, generator=gen)
    kwargs = dict(cu_seqlens=cu, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                  use_beta_sigmoid_in_kernel=True, output_final_state=True)
    _check_same(chunk_kda(*packed, **kwargs), compat.chunk_kda(*packed, **kwargs))
    # the gate on its own, fla's fused_kda_gate
    before = fla_backend.calls["fused_kda_gate"]
    got = fused_kda_gate(args[3], A_log, dt_bias)
    assert fla_backend.calls["fused_kda_gate"] == before + 1
    assert torch.equal(got, compat.fused_kda_gate(args[3], A_log, dt_bias))


def test_recurrent_forward_writes_the_state_in_place():
    """fla's fused_recurrent_kda_fwd with inplace_final_state (its default, the decode path
    of serving code): the final state overwrites initial_state, out= receives the output."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    args, h0 = _inputs(seed=2)
    state, out = h0.clone(), torch.empty_like(args[2])
    o, final = fused_recurrent_kda_fwd(*args, initial_state=state, scale=0.3, out=out)
    want_o, want_final = compat.fused_recurrent_kda(*args, initial_state=h0, scale=0.3,
                                                    output_final_state=True)
    assert final is state and o is out
    assert torch.equal(state, want_final) and torch.equal(out, want_o)
    with pytest.raises(ValueError, match="initial_state"):
        fused_recurrent_kda_fwd(*args)


def test_register_is_idempotent(registered):
    assert fla_backend.register() is registered
    for name in ("kda", "gated_delta_rule"):
        registry = fla_backends._operation_registries[name]
        types = [b.backend_type for b in registry._get_sorted_backends()]
        assert types.count(fla_backend.BACKEND_TYPE) == 1, types
    args, _ = _inputs()
    before = fla_backend.calls["chunk_kda"]
    chunk_kda(*args)
    assert fla_backend.calls["chunk_kda"] == before + 1


def test_tensors_off_the_cpu_are_declined(registered):
    backend = registered()
    args, _ = _inputs()
    meta = [a.to("meta") for a in args]
    mixed = [args[0].to("meta")] + args[1:]
    for verifier in (backend.chunk_kda_verifier, backend.fused_recurrent_kda_fwd_verifier,
                     backend.chunk_gated_delta_rule_verifier, backend.fused_kda_gate_verifier):
        assert verifier(*args)[0]
        accepted, reason = verifier(*meta)
        assert not accepted and "meta" in reason
        assert not verifier(*mixed)[0]
    # fla's own context parallelism and graph capture stay with fla
    assert not backend.chunk_kda_verifier(*args, cp_context=object())[0]
    assert not backend.chunk_kda_verifier(*args, use_graph=True)[0]
    # a state pool on the CPU is linseq's too (linseq.compat.fla.fused_recurrent_kda_fwd)
    assert backend.fused_recurrent_kda_fwd_verifier(
        *args, ssm_state_indices=torch.zeros(B, dtype=torch.long))[0]


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("FLA_LINSEQ", "0")
    args, _ = _inputs()
    before = fla_backend.calls["chunk_kda"]
    try:
        chunk_kda(*args)  # fla's own kernels: on a machine without a GPU they raise
    except Exception:  # noqa: BLE001 - whatever fla's path does, linseq must not run
        pass
    assert fla_backend.calls["chunk_kda"] == before


def test_kimi_linear_layers_reach_linseq_through_fla():
    transformers = require("transformers")
    modeling = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    if modeling.chunk_kimi_delta_attention.__wrapped__ is None:
        pytest.skip("transformers did not bind fla's chunk_kda")
    config = transformers.KimiLinearConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, head_dim=16, linear_head_dim=16,
        linear_num_heads=2, layer_types=["linear_attention"], mlp_layer_types=["dense"],
        pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    model = transformers.KimiLinearForCausalLM(config).eval()
    ids = torch.randint(3, 64, (2, 20))
    before = fla_backend.calls["chunk_kda"]
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
    assert fla_backend.calls["chunk_kda"] == before + 1
    # the reference: transformers' own PyTorch function, which the fla-bound wrapper hides
    torch_fn = modeling.chunk_kimi_delta_attention.__wrapped__
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(modeling, "chunk_kimi_delta_attention", torch_fn)
        reference = model(ids, use_cache=False).logits
    assert fla_backend.calls["chunk_kda"] == before + 1
    torch.testing.assert_close(logits, reference, rtol=1e-4, atol=1e-4)
