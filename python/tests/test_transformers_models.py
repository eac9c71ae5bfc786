"""Hugging Face transformers' models on linseq, end to end: tiny random-weight Kimi Linear
(KDA), Qwen3-Next and Qwen3.5 (Gated DeltaNet), Mamba and FalconMamba (Mamba1), Mamba2,
Bamba, GraniteMoeHybrid (Granite 4.0-H), NemotronH, FalconH1 and Zamba2 (Mamba2's SSD), LFM2
and LFM2-MoE (gated short conv) through linseq.integrations.transformers, against
transformers' own PyTorch path (routing "torch").

Per model: greedy generation with the cache gives the same tokens and logits within float32
rounding; the logits of a float32 run are as close to a float64 run of the PyTorch path as
the PyTorch path's own float32 logits (factor 2); a training step's gradients match; packed
sequences (cu_seq_lens_q, as DataCollatorWithFlattening passes them) equal separate runs.
LFM2's layers mask the padding themselves: a left-padded prefill, a chunk continuing from the
cache and decode steps give the PyTorch path's logits and cache conv states.
The linseq functions are counted, so a route that silently fell back would fail.
"""

import copy
import importlib

import pytest

from conftest import require

torch = require("torch")
transformers = require("transformers")
import linseq.integrations.transformers as linseq_hf  # noqa: E402
from linseq.compat import causal_conv1d, fla, mamba_ssd, mamba_ssm  # noqa: E402

TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
VOCAB = 100


def _kimi():
    config = transformers.KimiLinearConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16,
        q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        num_local_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        linear_head_dim=16, linear_num_heads=2,
        layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "sparse"],
        **TOKENS)
    return transformers.KimiLinearForCausalLM(config)


def _qwen3_next():
    config = transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
        layer_types=["linear_attention", "full_attention"], **TOKENS)
    return transformers.Qwen3NextForCausalLM(config)


def _qwen3_5():
    config = transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        layer_types=["linear_attention", "full_attention"], **TOKENS)
    return transformers.Qwen3_5ForCausalLM(config)


def _mamba():
    return transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2,
        conv_kernel=4, **TOKENS))


def _falcon_mamba():
    return transformers.FalconMambaForCausalLM(transformers.FalconMambaConfig(
        vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2,
        conv_kernel=4, **TOKENS))


# Mamba2's mixer (SSD) alone and in the hybrids built on it: 8 heads of 16 channels, 2 groups
# of B and C, state 16, chunks of 32 (so the 40- and 70-token runs cross chunks)
_SSD = dict(n_heads=8, d_head=16, n_groups=2, d_state=16, d_conv=4, expand=2, chunk_size=32)


def _mamba2():
    return transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_heads=_SSD["n_heads"],
        head_dim=_SSD["d_head"], n_groups=_SSD["n_groups"], state_size=_SSD["d_state"],
        conv_kernel=_SSD["d_conv"], expand=_SSD["expand"], chunk_size=_SSD["chunk_size"],
        **TOKENS))


def _mamba_prefixed(**more):
    """The hybrids' mamba_* keywords."""
    return {f"mamba_{k}": v for k, v in {**_SSD, **more}.items()}


def _bamba():
    return transformers.BambaForCausalLM(transformers.BambaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, attn_layer_indices=[1],
        **_mamba_prefixed(), **TOKENS))


def _granite_hybrid():
    return transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, layer_types=["mamba", "attention"],
        num_local_experts=0, shared_intermediate_size=96, **_mamba_prefixed(), **TOKENS))


def _nemotron_h():
    return transformers.NemotronHForCausalLM(transformers.NemotronHConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, hybrid_override_pattern="M*-",
        mamba_num_heads=_SSD["n_heads"], mamba_head_dim=_SSD["d_head"], n_groups=_SSD["n_groups"],
        ssm_state_size=_SSD["d_state"], conv_kernel=_SSD["d_conv"], expand=_SSD["expand"],
        chunk_size=_SSD["chunk_size"], **TOKENS))


def _falcon_h1():
    return transformers.FalconH1ForCausalLM(transformers.FalconH1Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        **_mamba_prefixed(d_ssm=_SSD["n_heads"] * _SSD["d_head"]), **TOKENS))


def _zamba2():
    return transformers.Zamba2ForCausalLM(transformers.Zamba2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, attention_head_dim=32,
        layers_block_type=["mamba", "hybrid"], hybrid_layer_ids=[1], num_mem_blocks=1,
        mamba_headdim=_SSD["d_head"], n_mamba_heads=_SSD["n_heads"],
        mamba_ngroups=_SSD["n_groups"], mamba_d_state=_SSD["d_state"],
        mamba_d_conv=_SSD["d_conv"], mamba_expand=_SSD["expand"], chunk_size=_SSD["chunk_size"],
        **TOKENS))


# LFM2's short conv: in_proj -> B, C, x; C * conv(B * x); conv_bias in one, not the other
_LFM2 = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
             num_attention_heads=2, num_key_value_heads=1, conv_L_cache=3,
             layer_types=["conv", "full_attention", "conv"], **TOKENS)


def _lfm2():
    return transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
        conv_bias=True, block_auto_adjust_ff_dim=False, **_LFM2))


def _lfm2_moe():
    return transformers.Lfm2MoeForCausalLM(transformers.Lfm2MoeConfig(
        moe_intermediate_size=32, num_dense_layers=1, num_experts=4, num_experts_per_tok=2,
        **_LFM2))


LFM2_MODELS = {"lfm2": _lfm2, "lfm2_moe": _lfm2_moe}
SSD_MODELS = {"mamba2": _mamba2, "bamba": _bamba, "granitemoehybrid": _granite_hybrid,
              "nemotron_h": _nemotron_h, "falcon_h1": _falcon_h1, "zamba2": _zamba2}
MODELS = {"kimi_linear": _kimi, "qwen3_next": _qwen3_next, "qwen3_5": _qwen3_5,
          "mamba": _mamba, "falcon_mamba": _falcon_mamba, **SSD_MODELS, **LFM2_MODELS}
# Not packable in transformers itself: Mamba's and Mamba2's models do not pass the packing
# keywords to their blocks, and GraniteMoeHybrid's attention layers without rotary positions
# do not keep packed sequences apart (its Mamba2 layers alone do: checked by hand)
PACKABLE = ["kimi_linear", "qwen3_next", "qwen3_5", "bamba", "nemotron_h", "falcon_h1",
            "zamba2", *LFM2_MODELS]

# the linseq functions each model's prefill, decode and training must reach (a decode step
# of the delta rules: fla's recurrent functions' token step, which the adapters call first)
LINSEQ_FUNCTIONS = {
    "kimi_linear": {"chunk_kda", "_recurrent_token_step", "causal_conv1d_fn",
                    "causal_conv1d_update"},
    "qwen3_next": {"chunk_gated_delta_rule", "_recurrent_token_step",
                   "causal_conv1d_fn", "causal_conv1d_update"},
    "mamba": {"selective_scan_fn", "selective_state_update", "causal_conv1d_fn",
              "causal_conv1d_update"},
}
LINSEQ_FUNCTIONS["qwen3_5"] = LINSEQ_FUNCTIONS["qwen3_next"]
LINSEQ_FUNCTIONS["falcon_mamba"] = LINSEQ_FUNCTIONS["mamba"]
LINSEQ_FUNCTIONS.update({name: {"mamba_chunk_scan_combined", "selective_state_update",
                                "causal_conv1d_fn", "causal_conv1d_update"}
                         for name in SSD_MODELS})
LINSEQ_FUNCTIONS.update({name: {"causal_conv1d_fn", "causal_conv1d_update"}
                         for name in LFM2_MODELS})
# a training step: Mamba's is the fused mixer (transformers' own mamba_inner_fn is a stub);
# FalconMamba's fused mixer is not routed (see ROUTES), its layer runs unfused
TRAINING_FUNCTIONS = {
    "kimi_linear": {"chunk_kda", "causal_conv1d_fn"},
    "qwen3_next": {"chunk_gated_delta_rule", "causal_conv1d_fn"},
    "qwen3_5": {"chunk_gated_delta_rule", "causal_conv1d_fn"},
    "mamba": {"mamba_inner_fn"},
    "falcon_mamba": {"selective_scan_fn", "causal_conv1d_fn"},
    # transformers' fused Mamba2 mixer is a stub: the unfused layer runs on linseq's conv and SSD
    **{name: {"mamba_chunk_scan_combined", "causal_conv1d_fn"} for name in SSD_MODELS},
    **{name: {"causal_conv1d_fn"} for name in LFM2_MODELS},
}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models: one PyTorch thread is fastest and keeps the timing steady on a busy
    2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def linseq_calls(monkeypatch):
    """{linseq drop-in name: [data pointer of its first argument per call]}: the adapters
    look the drop-ins up at call time, so every routed call is recorded here."""
    seen = {}
    for module in (fla, mamba_ssm, mamba_ssd, causal_conv1d):
        for name in ("chunk_kda", "fused_recurrent_kda", "chunk_gated_delta_rule",
                     "fused_recurrent_gated_delta_rule", "_recurrent_token_step",
                     "selective_scan_fn",
                     "selective_state_update", "mamba_inner_fn", "causal_conv1d_fn",
                     "causal_conv1d_update", "mamba_chunk_scan_combined"):
            real = getattr(module, name, None)
            if real is None:
                continue

            def spy(*args, _real=real, _name=name, **kwargs):
                seen.setdefault(_name, []).append(args[0].data_ptr())
                return _real(*args, **kwargs)
            monkeypatch.setattr(module, name, spy)
    return seen


def _model(name, seed=0):
    torch.manual_seed(seed)
    model = MODELS[name]()
    if model.config.model_type in ("kimi_linear", "qwen3_next", "lfm2_moe"):
        model.set_experts_implementation("eager")   # grouped_mm has no float64 kernel
    if "mamba" not in model.config.model_type:
        # a slow decay (exp(A_log) = 0.05): the delta rule remembers tens of tokens, across
        # chunks and, were packed sequences not kept apart, across sequences
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if param_name.endswith("A_log"):
                    param.fill_(-3.0)
    return model


def _tokens(shape, seed):
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def _relative_error(candidate, reference):
    return float((candidate.double() - reference.double()).abs().max()
                 / reference.double().abs().max())


@pytest.mark.parametrize("name", MODELS)
def test_greedy_generation_matches_pytorch_path(name, linseq_calls):
    model = _model(name).eval()
    prompt = _tokens((2, 24), 1)
    runs = {}
    for kind in ("torch", "linseq"):
        linseq_calls.clear()
        with linseq_hf.routing(kind), torch.no_grad():
            out = model.generate(prompt, max_new_tokens=32, min_new_tokens=32,
                                 do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
        runs[kind] = (out.sequences, torch.stack(out.logits, 1), set(linseq_calls))
    torch_run, linseq_run = runs["torch"], runs["linseq"]
    assert torch_run[2] == set()
    assert LINSEQ_FUNCTIONS[name] <= linseq_run[2], "linseq was not called"
    assert linseq_run[0].shape[1] == 24 + 32
    assert torch.equal(linseq_run[0], torch_run[0])
    assert _relative_error(linseq_run[1], torch_run[1]) < 1e-5


@pytest.mark.parametrize("name", MODELS)
def test_logits_as_close_to_float64_as_the_pytorch_path(name):
    model = _model(name).eval()
    model64 = copy.deepcopy(model).double()
    ids = _tokens((2, 70), 2)   # past one 64-token chunk
    with torch.no_grad():
        with linseq_hf.routing("torch"):
            judge = model64(ids, use_cache=False).logits
            pytorch = model(ids, use_cache=False).logits
        with linseq_hf.routing("linseq"):
            linseq = model(ids, use_cache=False).logits
    float32_rounding = 2.0 ** -24 * float(judge.abs().max())
    pytorch_error = float((pytorch.double() - judge).abs().max())
    linseq_error = float((linseq.double() - judge).abs().max())
    assert linseq_error <= 2 * max(pytorch_error, float32_rounding), (linseq_error,
                                                                      pytorch_error)


@pytest.mark.parametrize("name", MODELS)
def test_training_step_gradients_match(name, linseq_calls):
    model = _model(name).train()
    ids = _tokens((2, 40), 3)
    grads, losses = {}, {}
    for kind in ("torch", "linseq"):
        linseq_calls.clear()
        model.zero_grad(set_to_none=True)
        with linseq_hf.routing(kind):
            loss = model(ids, labels=ids, use_cache=False).loss
            loss.backward()
        losses[kind] = loss.item()
        grads[kind] = {n: p.grad.clone() for n, p in model.named_parameters()
                       if p.grad is not None}
    assert TRAINING_FUNCTIONS[name] <= set(linseq_calls), "linseq was not called"
    assert abs(losses["linseq"] - losses["torch"]) <= 1e-5 * abs(losses["torch"])
    assert grads["linseq"].keys() == grads["torch"].keys()
    assert len(grads["torch"]) == sum(1 for p in model.parameters() if p.requires_grad)
    largest = max(float(g.abs().max()) for g in grads["torch"].values())
    for param, reference in grads["torch"].items():
        error = float((grads["linseq"][param] - reference).abs().max())
        assert error <= 1e-4 * float(reference.abs().max()) + 1e-6 * largest, param


def _fused_mixer_step(name, model, ids, mask, monkeypatch, fused):
    """(loss, gradients) of a training step on transformers' PyTorch path, its fused-mixer
    stub replaced by linseq's mamba_split_conv1d_scan_combined when `fused`."""
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")

    def mixer(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
              initial_states=None, dt_limit=(0.0, float("inf")), return_final_states=False,
              activation="silu", rmsnorm_weight=None, rmsnorm_eps=1e-6, outproj_weight=None,
              outproj_bias=None, headdim=None, ngroups=1, norm_before_gate=True, **kwargs):
        return mamba_ssd.mamba_split_conv1d_scan_combined(
            zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states,
            None, dt_limit, return_final_states, activation, rmsnorm_weight, rmsnorm_eps,
            outproj_weight, outproj_bias, headdim, ngroups, norm_before_gate)
    model.zero_grad(set_to_none=True)
    with monkeypatch.context() as patch, linseq_hf.routing("torch"):
        if fused:
            patch.setattr(module, "mamba2_split_conv1d_scan_combined", mixer)
        labels = ids if mask is None else ids.masked_fill(mask == 0, -100)
        loss = model(ids, attention_mask=mask, labels=labels, use_cache=False).loss
        loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()
                         if p.grad is not None}


@pytest.mark.parametrize("name", SSD_MODELS)
def test_fused_mixer_equals_the_unfused_layer_only_without_leading_padding(name,
                                                                           monkeypatch):
    """linseq's mamba_split_conv1d_scan_combined in the layers' fused training call gives
    their unfused PyTorch layer's loss and gradients on an unpadded batch; on a left-padded
    one it cannot (the layers hand it no padding mask, and it runs the padding tokens'
    silu(conv bias) into the state, where the unfused layer zeroes them), which is why ROUTES
    leaves that call to transformers. Should this start failing, transformers now gives the
    fused call the mask: route it then."""
    model = _model(name).train()
    with torch.no_grad():   # a trained model's conv bias (transformers initialises it to 0)
        for module in model.modules():
            if isinstance(module, torch.nn.Conv1d) and module.bias is not None:
                module.bias.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(5))
    ids = _tokens((2, 40), 3)
    for mask in (None, torch.cat([torch.zeros(2, 10), torch.ones(2, 30)], 1).long()):
        unfused = _fused_mixer_step(name, model, ids, mask, monkeypatch, fused=False)
        fused = _fused_mixer_step(name, model, ids, mask, monkeypatch, fused=True)
        loss_error = abs(fused[0] - unfused[0]) / abs(unfused[0])
        largest = max(float(g.abs().max()) for g in unfused[1].values())
        grad_error = max(float((fused[1][p] - g).abs().max()) for p, g in unfused[1].items())
        if mask is None:
            assert fused[1].keys() == unfused[1].keys()
            assert loss_error <= 1e-6 and grad_error <= 1e-5 * largest, (loss_error,
                                                                           grad_error)
        else:
            assert grad_error > 1e-3 * largest, "the fused mixer now sees the padding"


@pytest.mark.parametrize("name", PACKABLE)
def test_packed_sequences_equal_separate_runs(name, linseq_calls):
    model = _model(name).eval()
    lengths = (23, 41, 9)
    parts = [_tokens((1, n), 10 + i) for i, n in enumerate(lengths)]
    cu = torch.tensor([0, 23, 64, 73], dtype=torch.int32)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with linseq_hf.routing("linseq"), torch.no_grad():
        separate = torch.cat([model(p, use_cache=False).logits for p in parts], 1)
        linseq_calls.clear()
        packed = model(torch.cat(parts, 1), position_ids=positions, cu_seq_lens_q=cu,
                       cu_seq_lens_k=cu, max_length_q=41, max_length_k=41,
                       use_cache=False).logits
    assert {"causal_conv1d_fn"} <= set(linseq_calls)
    assert _relative_error(packed, separate) < 1e-5


def _conv_states(cache):
    """The cache's conv state tensors, one per conv layer."""
    return [layer.conv_states[0] for layer in cache.layers
            if getattr(layer, "conv_states", None)]


def _padded_prefill_chunk_and_decode(model, ids, mask):
    """(logits of each call, conv states after each call, the conv state tensors the decode
    steps found) of a left-padded prefill, a 5-token chunk continuing from the cache (the
    conv reads the cached state through transformers' concatenation) and 3 decode steps
    (in-place state updates)."""
    logits, states = [], []
    out = model(ids[:, :20], attention_mask=mask[:, :20], use_cache=True)
    logits.append(out.logits)
    states.append([s.clone() for s in _conv_states(out.cache)])
    out = model(ids[:, 20:], attention_mask=mask, cache=out.cache, use_cache=True)
    logits.append(out.logits)
    states.append([s.clone() for s in _conv_states(out.cache)])
    decoded_into = _conv_states(out.cache)
    for _ in range(3):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        out = model(out.logits[:, -1:].argmax(-1), attention_mask=mask, cache=out.cache,
                    use_cache=True)
        logits.append(out.logits)
        states.append([s.clone() for s in _conv_states(out.cache)])
    assert all(a is b for a, b in zip(_conv_states(out.cache), decoded_into, strict=True))
    return logits, states


@pytest.mark.parametrize("name", LFM2_MODELS)
def test_padded_prefill_chunk_and_decode_match_pytorch_path(name, linseq_calls):
    model = _model(name).eval()
    ids = _tokens((2, 25), 5)
    mask = torch.ones_like(ids)
    mask[0, :7] = 0   # row 0 left-padded: the layer zeroes those tokens before in_proj
    runs = {}
    for kind in ("torch", "linseq"):
        linseq_calls.clear()
        with linseq_hf.routing(kind), torch.no_grad():
            runs[kind] = _padded_prefill_chunk_and_decode(model, ids, mask)
        if kind == "linseq":
            assert {"causal_conv1d_fn", "causal_conv1d_update"} <= set(linseq_calls)
            # 2 conv layers: prefill, chunk, then one in-place update per decode step
            assert len(linseq_calls["causal_conv1d_update"]) == 2 * 3
    (torch_logits, torch_states), (logits, states) = runs["torch"], runs["linseq"]
    for got, want in zip(logits, torch_logits, strict=True):
        assert _relative_error(got, want) < 1e-5
    for got_step, want_step in zip(states, torch_states, strict=True):
        assert len(want_step) == 2
        for got, want in zip(got_step, want_step, strict=True):
            assert _relative_error(got, want) < 1e-6


@pytest.mark.parametrize("name", ["qwen3_next", "mamba"])
def test_conv_and_scan_inputs_reach_the_kernels_without_copies(name, linseq_calls,
                                                               seen_pointers):
    """The models' [B,D,T] tensors (transposed [B,T,D] projections) are read in place."""
    pointers = seen_pointers
    model = _model(name).eval()
    with linseq_hf.routing("linseq"), torch.no_grad():
        model(_tokens((2, 16), 4), use_cache=False)
    handed = linseq_calls["causal_conv1d_fn"] + linseq_calls.get("selective_scan_fn", [])
    assert handed and all(p in pointers for p in handed)


def test_enable_disable_and_routing_restore_the_originals():
    linseq_hf.disable()
    names = [f"{m}.{f}" for m, functions in linseq_hf.ROUTES.items() for f in functions]

    def current():
        return {n: getattr(importlib.import_module(n.rsplit(".", 1)[0]), n.rsplit(".", 1)[1])
                for n in names}
    before = current()
    routed = linseq_hf.enable()
    assert set(routed) == set(names)   # transformers 5.24 has every model of ROUTES
    enabled = current()
    assert all(getattr(enabled[n], "linseq_route", None) == n for n in names)
    assert linseq_hf.enable() == routed and current() == enabled   # idempotent
    with linseq_hf.routing("torch"):
        inside = current()
        assert all(inside[n] is getattr(before[n], "__wrapped__", before[n]) for n in names)
    assert current() == enabled
    with pytest.raises(ValueError, match="kind"):
        with linseq_hf.routing("fla"):
            pass
    assert set(linseq_hf.disable()) == set(names)
    assert all(current()[n] is before[n] for n in names)
    assert linseq_hf.disable() == ()


def test_missing_models_and_changed_signatures_are_skipped(monkeypatch):
    mamba = "transformers.models.mamba.modeling_mamba"
    monkeypatch.setitem(linseq_hf.ROUTES, "transformers.models.no_such_model.modeling_x",
                        {"causal_conv1d_fn": linseq_hf.ROUTES[mamba]["causal_conv1d_fn"]})
    # an adapter whose arguments differ from the transformers function's is not installed
    monkeypatch.setitem(linseq_hf.ROUTES, mamba, {
        **linseq_hf.ROUTES[mamba],
        "causal_conv1d_update": linseq_hf.ROUTES[mamba]["causal_conv1d_fn"]})
    try:
        routed = linseq_hf.enable()
    finally:
        linseq_hf.disable()
    assert not any("no_such_model" in n for n in routed)
    assert f"{mamba}.causal_conv1d_update" not in routed
    assert f"{mamba}.causal_conv1d_fn" in routed


def test_calls_linseq_does_not_run_go_to_the_pytorch_function(linseq_calls):
    import transformers.models.mamba.modeling_mamba as modeling
    reference = modeling.causal_conv1d_fn.__wrapped__
    x = torch.randn(2, 8, 12, dtype=torch.float64)
    weight = torch.randn(8, 4, dtype=torch.float64)
    with linseq_hf.routing("linseq"):
        conv = modeling.causal_conv1d_fn
        assert torch.equal(conv(x, weight, None, activation="silu"),
                           reference(x, weight, None, activation="silu"))   # float64
        x32, w32 = x.float(), weight.float()
        assert torch.equal(conv(x32, w32, None, activation="gelu"),
                           reference(x32, w32, None, activation="gelu"))    # activation
        assert "causal_conv1d_fn" not in linseq_calls
        out = conv(x32, w32, None, activation="silu")
    assert linseq_calls["causal_conv1d_fn"]
    assert _relative_error(out, reference(x32, w32, None, activation="silu")) < 1e-5


def test_packed_offsets_that_do_not_cover_the_row_are_refused():
    import transformers.models.qwen3_next.modeling_qwen3_next as modeling
    x = torch.randn(1, 8, 12)
    weight = torch.randn(8, 4)
    with linseq_hf.routing("linseq"):
        with pytest.raises(ValueError, match="cu_seq_lens_q"):
            modeling.causal_conv1d_fn(x, weight, None, activation="silu",
                                      cu_seq_lens_q=torch.tensor([0, 5, 10]))
