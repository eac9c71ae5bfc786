"""torch.compile(fullgraph=True) of Hugging Face transformers' Kimi Linear (KDA), Qwen3-Next
(Gated DeltaNet), Mamba (Mamba1), Mamba2 (SSD) and LFM2 (gated short conv) models on linseq's
kernels, routed there by linseq.integrations.transformers.

fullgraph=True raises at the first graph break, so a passing compile is the whole model as
one graph. The graphs AOT autograd hands to the compiler are recorded: each must call
linseq's custom ops (a route that fell back to transformers' own PyTorch functions would
fail), and the compiled model must equal the eager one on linseq: a prefill that fills the
cache (logits and the cache's conv and recurrent states), a decode step that updates those
states in place, and a training step's loss and gradients. Tiny random-weight
models; backend aot_eager (the traced graph, no code generation) keeps the file fast. Packed
sequences (cu_seq_lens_q) compile as one graph too (and in Bamba, a Mamba2 hybrid, and
LFM2).
"""

import pytest

from conftest import require

torch = require("torch")
transformers = require("transformers")
import linseq.integrations.transformers as linseq_hf  # noqa: E402

TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
VOCAB = 96


def _kimi():
    return transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16,
        q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        num_local_experts=4, num_experts_per_tok=2, linear_head_dim=16, linear_num_heads=2,
        layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "sparse"],
        **TOKENS))


def _qwen3_next():
    return transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
        layer_types=["linear_attention", "full_attention"], **TOKENS))


def _mamba():
    return transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2,
        conv_kernel=4, **TOKENS))


def _mamba2():
    return transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16,
        n_groups=2, state_size=16, conv_kernel=4, expand=2, chunk_size=32, **TOKENS))


def _bamba():
    """A Mamba2 hybrid: transformers' Mamba2 model does not pass packed sequences on; Bamba
    does."""
    return transformers.BambaForCausalLM(transformers.BambaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, attn_layer_indices=[1], mamba_n_heads=8,
        mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=32, **TOKENS))


def _lfm2():
    return transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, conv_bias=True,
        block_auto_adjust_ff_dim=False, layer_types=["conv", "full_attention", "conv"],
        **TOKENS))


MODELS = {"kimi_linear": _kimi, "qwen3_next": _qwen3_next, "mamba": _mamba, "mamba2": _mamba2,
          "lfm2": _lfm2}
# packed sequences: the ops that must read them inside the graph
PACKED_OPS = {"kimi_linear": {"linseq.kda", "linseq.causal_conv_seq_idx"},
              "qwen3_next": {"linseq.kda", "linseq.causal_conv_seq_idx"},
              "bamba": {"linseq.ssd_seq_idx", "linseq.causal_conv_seq_idx"},
              "lfm2": {"linseq.causal_conv_seq_idx"}}

# the linseq custom ops each compiled graph must call (KDA and Gated DeltaNet share
# linseq::kda; Mamba's training step is its fused mixer, linseq's conv and scan)
PREFILL_OPS = {"kimi_linear": {"linseq.kda", "linseq.causal_conv1d"},
               "qwen3_next": {"linseq.kda", "linseq.causal_conv1d"},
               "mamba": {"linseq.ssm1", "linseq.causal_conv1d"},
               "mamba2": {"linseq.ssd", "linseq.causal_conv1d"},
               "lfm2": {"linseq.causal_conv1d"}}
DECODE_OPS = {"kimi_linear": {"linseq.kda", "linseq.conv_state_update"},
              "qwen3_next": {"linseq.kda", "linseq.conv_state_update"},
              "mamba": {"linseq.mamba_state_update", "linseq.conv_state_update"},
              "mamba2": {"linseq.mamba_state_update", "linseq.conv_state_update"},
              "lfm2": {"linseq.conv_state_update"}}
TRAINING_OPS = {name: ops | {op + "_backward" for op in ops}
                for name, ops in PREFILL_OPS.items()}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models: one PyTorch thread is fastest on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every model's forward enters through the same transformers wrappers: without a reset
    their compiled entries pile up across tests towards Dynamo's recompile limit."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _recording_backend():
    """(backend, names): aot_eager that records the op of every call in the forward and
    backward graphs, an in-place op under its functionalized wrapper by its own name."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    names = set()

    def compile_graph(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function":
                functionalized = "auto_functionalized" in str(node.target)
                op = node.args[0] if functionalized else node.target
                names.add(str(op).removesuffix(".default"))
        return make_boxed_func(gm.forward)
    return aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph), names


def _model(name):
    torch.manual_seed(0)
    return {**MODELS, "bamba": _bamba}[name]()


def _tokens(shape, seed):
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def _assert_same(got, want):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def _states(cache):
    """The conv and recurrent states of the cache's linear-attention / Mamba layers."""
    return [state for layer in cache.layers
            for states in (getattr(layer, "conv_states", None),
                           getattr(layer, "recurrent_states", None)) if states
            for state in states.values() if state is not None]


def _assert_same_states(got, want):
    want_states = _states(want)
    assert want_states and len(_states(got)) == len(want_states)
    for got_state, want_state in zip(_states(got), want_states):
        _assert_same(got_state, want_state)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_prefill_and_decode_compile_as_one_graph(name):
    model = _model(name).eval()
    ids = _tokens((2, 21), 1)
    backend, graph_ops = _recording_backend()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with linseq_hf.routing("linseq"), torch.no_grad():
        eager = model(ids, use_cache=True)
        prefill = compiled(ids, use_cache=True)
        _assert_same(prefill.logits, eager.logits)
        _assert_same_states(prefill.cache, eager.cache)
        assert PREFILL_OPS[name] <= graph_ops, graph_ops

        # a decode step: the conv and SSM states are updated where they lie, so the
        # compiled step's cache must hold what the eager step's holds
        graph_ops.clear()
        token = eager.logits[:, -1:].argmax(-1)
        want = model(token, cache=eager.cache, use_cache=True).logits
        got = compiled(token, cache=prefill.cache, use_cache=True).logits
        _assert_same(got, want)
        _assert_same_states(prefill.cache, eager.cache)
        assert DECODE_OPS[name] <= graph_ops, graph_ops


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_step_compiles_as_one_graph(name):
    model = _model(name).train()
    ids = _tokens((2, 19), 2)
    backend, graph_ops = _recording_backend()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    results = []
    with linseq_hf.routing("linseq"):
        for run in (model, compiled):
            model.zero_grad()
            loss = run(ids, labels=ids, use_cache=False).loss
            loss.backward()
            results.append((loss.detach(), {n: p.grad.clone()
                                            for n, p in model.named_parameters()
                                            if p.grad is not None}))
    (eager_loss, eager_grads), (loss, grads) = results
    assert TRAINING_OPS[name] <= graph_ops, graph_ops
    _assert_same(loss, eager_loss)
    assert grads.keys() == eager_grads.keys()
    assert len(grads) == sum(1 for p in model.parameters() if p.requires_grad)
    for param, want in eager_grads.items():
        _assert_same(grads[param], want)


@pytest.mark.parametrize("name", sorted(PACKED_OPS))
def test_packed_sequences_compile_as_one_graph(name):
    """Packed sequences as DataCollatorWithFlattening passes them (cu_seq_lens_q): the conv's
    seq_idx, the delta rule's cu_seqlens and the SSD scan's seq_idx are read inside linseq's
    ops, so the graph does not break on their values; compiled equals eager, which equals
    separate runs."""
    model = _model(name).eval()
    lengths = (13, 21, 6)
    ids = _tokens((1, sum(lengths)), 3)
    cu = torch.tensor([0, 13, 34, 40], dtype=torch.int32)
    packing = dict(position_ids=torch.cat([torch.arange(n) for n in lengths])[None],
                   cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=21, max_length_k=21)
    backend, graph_ops = _recording_backend()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with linseq_hf.routing("linseq"), torch.no_grad():
        separate = torch.cat([model(ids[:, start:end], use_cache=False).logits
                              for start, end in zip(cu[:-1], cu[1:])], 1)
        eager = model(ids, use_cache=False, **packing).logits
        got = compiled(ids, use_cache=False, **packing).logits
    _assert_same(eager, separate)
    _assert_same(got, eager)
    assert PACKED_OPS[name] <= graph_ops, graph_ops
