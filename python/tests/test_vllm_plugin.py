"""linseq's vLLM plugin in vLLM's CPU build.

Mamba and FalconMamba (which vLLM's CPU build cannot run alone): the tokens vLLM generates
equal transformers' float32 greedy tokens of the same weights (an independent reference:
transformers' own PyTorch scan, no linseq in it). Gated DeltaNet (Qwen3.5): a tiny model
served with linseq and with vLLM's own kernels by one engine, against each other and
transformers' float32 model; and each routed op against vLLM's op on the same tensors, both
against a float64 definition. Mamba2 (opt-in, family "mamba2"): the same, for a tiny Mamba2
and the Mamba2 layer's scan, decode step and conv.

Skipped unless vLLM and transformers import (vLLM's CPU build lives in its own environment,
made by scripts/vllm-venv.sh; `make test-python` runs this file there, where a missing one
is an error). By hand:
    <vllm venv>/bin/python -m pytest python/tests/test_vllm_plugin.py
with PYTHONPATH=python and LINSEQ_LIBRARY naming the built library. vLLM finds the plugin as
an installed linseq would offer it: through the `vllm.general_plugins` entry point that
pyproject.toml declares, put on sys.path here as a distribution's metadata.
"""

import gc
import importlib
import itertools
import os
import sys

import pytest


def _module(name):
    """The module, or the whole file skipped without it; LINSEQ_REQUIRE_VLLM=1 (the vLLM
    environment's run of scripts/test-python.sh) makes a missing one an error instead."""
    if os.environ.get("LINSEQ_REQUIRE_VLLM") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name)


vllm = _module("vllm")
transformers = _module("transformers")
torch = _module("torch")
tomllib = _module("tomllib")

from conftest import ROOT  # noqa: E402

import linseq.integrations.vllm as linseq_vllm  # noqa: E402
from linseq import _torch_native  # noqa: E402

MIXER = "vllm.model_executor.layers.mamba.mamba_mixer"
# lengths 1 to 40 tokens: with a step budget of 16 tokens the long prompts are prefilled over
# several steps (each resuming from its slot's state) while the short ones already decode
PROMPTS = [[7], [3, 9, 27, 81 % 64, 5], list(range(2, 25)), [(5 * i + 3) % 64 for i in range(40)]]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def offline_vllm(tmp_path_factory):
    """vLLM in this process, a small CPU cache, and the entry point pyproject.toml declares
    installed as a distribution's metadata on sys.path (what `pip install linseq` makes)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        plugins = tomllib.load(f)["project"]["entry-points"]["vllm.general_plugins"]
    site = tmp_path_factory.mktemp("site")
    info = site / "linseq_entry_point-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: linseq-entry-point\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\n" + "".join(f"{k} = {v}\n" for k, v in plugins.items()))
    saved = {k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING",
                                            "VLLM_CPU_KVCACHE_SPACE")}
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    yield site
    sys.path.remove(str(site))
    linseq_vllm.disable()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _tiny_model(kind, path):
    """A random 2-layer model saved at path; its weights drawn wide enough that the mixer,
    not the embedding alone, decides the next token."""
    config_class, model_class = {
        "mamba": (transformers.MambaConfig, transformers.MambaForCausalLM),
        "falcon_mamba": (transformers.FalconMambaConfig, transformers.FalconMambaForCausalLM),
    }[kind]
    config = config_class(vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=2,
                          expand=2, conv_kernel=4, time_step_rank=4, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = model_class(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "A_log" not in name and "norm" not in name:
                p.normal_(0.0, 0.5)
    model.save_pretrained(path)
    return model


def _reference_tokens(model):
    with torch.no_grad():
        return [model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False,
                               min_new_tokens=NEW_TOKENS)[0, len(p):].tolist()
                for p in PROMPTS]


@pytest.mark.parametrize("kind", ["mamba", "falcon_mamba"])
def test_tokens_equal_transformers_float32(kind, offline_vllm, tmp_path):
    model = _tiny_model(kind, tmp_path)
    want = _reference_tokens(model)
    llm = vllm.LLM(model=str(tmp_path), skip_tokenizer_init=True, dtype="float32",
                   max_model_len=64, max_num_batched_tokens=16, enforce_eager=True, seed=0)
    mixer = importlib.import_module(MIXER)
    assert getattr(mixer.selective_scan_fn, "linseq_route", None) == \
        f"{MIXER}.selective_scan_fn", "vLLM did not load linseq's plugin"
    params = vllm.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    got = [list(o.outputs[0].token_ids) for o in outs]
    del llm
    gc.collect()
    assert len({t for seq in want for t in seq}) > len(PROMPTS), want  # not one repeated token
    assert got == want


def test_mamba1_prefix_caching_in_align_mode(offline_vllm, tmp_path, monkeypatch):
    """vLLM's prefix caching of Mamba states (mamba_cache_mode "align": the engine schedules
    prompts in whole blocks and keeps the state at each block's end itself, so the kernels
    get ordinary calls): prompts sharing a 40-token prefix, served one after another, give
    transformers' float32 tokens, and the later ones' prefill starts from the cached state
    (the scan sees fewer of their tokens than they have)."""
    model = _tiny_model("falcon_mamba", tmp_path)
    prefix = [(5 * i + 1) % 64 for i in range(40)]
    prompts = [prefix + [7, 8, 9], prefix + [11, 12], prefix + [7, 8, 9, 10, 3]]
    with torch.no_grad():
        want = [model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False,
                               min_new_tokens=NEW_TOKENS)[0, len(p):].tolist() for p in prompts]
    scanned = []   # (tokens, prompts that started from a state) of each layer's prefill scan
    from linseq import ops
    real = ops.forward_pool

    def spy(op, arrays, pool, src, dst, has, **kw):
        if op == "ssm1":
            scanned.append((int(kw["cu_seqlens"][-1]), int(has.sum())))
        return real(op, arrays, pool, src, dst, has, **kw)
    monkeypatch.setattr(ops, "forward_pool", spy)
    llm = vllm.LLM(model=str(tmp_path), skip_tokenizer_init=True, dtype="float32",
                   max_model_len=128, max_num_batched_tokens=64, enforce_eager=True, seed=0,
                   block_size=16, enable_prefix_caching=True, mamba_cache_mode="align")
    params = vllm.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    got, prefill_tokens = [], []
    for p in prompts:
        scanned.clear()
        got.append(list(llm.generate([{"prompt_token_ids": p}], params)[0].outputs[0].token_ids))
        prefill_tokens.append(sum(n for n, _ in scanned) // model.config.num_hidden_layers)
    del llm
    gc.collect()
    assert got == want
    assert prefill_tokens[0] == len(prompts[0]), prefill_tokens
    assert all(n < len(p) for n, p in zip(prefill_tokens[1:], prompts[1:])), prefill_tokens


def test_opt_out_and_disable_leave_vllms_functions(monkeypatch):
    mixer = importlib.import_module(MIXER)
    linseq_vllm.disable()
    vllms = (mixer.selective_scan_fn, mixer.selective_state_update)
    monkeypatch.setenv(linseq_vllm.OPT_OUT_VARIABLE, "0")
    assert linseq_vllm.register() == ()
    assert (mixer.selective_scan_fn, mixer.selective_state_update) == vllms
    monkeypatch.delenv(linseq_vllm.OPT_OUT_VARIABLE)
    routed = linseq_vllm.register()
    assert f"{MIXER}.selective_scan_fn" in routed and f"{MIXER}.selective_state_update" in routed
    assert mixer.selective_scan_fn is not vllms[0]
    assert linseq_vllm.enable() == routed   # idempotent
    linseq_vllm.disable()
    assert (mixer.selective_scan_fn, mixer.selective_state_update) == vllms


def test_gdn_is_routed_only_when_asked(monkeypatch):
    ops = importlib.import_module("vllm._custom_ops")
    linseq_vllm.disable()
    own = ops.chunk_gated_delta_rule_cpu
    monkeypatch.delenv(linseq_vllm.OPT_OUT_VARIABLE, raising=False)
    assert not any("gated_delta" in name for name in linseq_vllm.register())
    assert ops.chunk_gated_delta_rule_cpu is own
    for value in ("all", "gdn", "mamba1,gdn"):
        linseq_vllm.disable()
        monkeypatch.setenv(linseq_vllm.OPT_OUT_VARIABLE, value)
        routed = linseq_vllm.register()
        assert "vllm._custom_ops.chunk_gated_delta_rule_cpu" in routed, value
        assert ops.chunk_gated_delta_rule_cpu is not own
        assert (f"{MIXER}.selective_scan_fn" in routed) == (value != "gdn"), value
    monkeypatch.setenv(linseq_vllm.OPT_OUT_VARIABLE, "mamba3")
    with pytest.raises(ValueError, match="LINSEQ_VLLM.*mamba3"):
        linseq_vllm.register()
    linseq_vllm.disable()
    assert ops.chunk_gated_delta_rule_cpu is own


def test_prefix_caching_is_refused_by_name():
    t = torch.zeros(4, 3)
    with pytest.raises(NotImplementedError, match="block_idx_first_scheduled_token"):
        linseq_vllm._selective_scan(t, torch.zeros(2, 4, 2), t, torch.zeros(4, 2),
                                    torch.zeros(2, 3), torch.zeros(2, 3),
                                    query_start_loc=torch.tensor([0, 3], dtype=torch.int32),
                                    cache_indices=torch.tensor([1], dtype=torch.int32),
                                    block_idx_first_scheduled_token=torch.zeros(1))


def test_decode_step_on_a_bf16_pool_into_other_slots():
    """vLLM's decode call on a bfloat16 pool, each request read from one slot and written to
    another, vLLM's null block 0 as padding; naive.ssm1 (float64) is the reference."""
    import torch.nn.functional as F

    import naive
    g = torch.Generator().manual_seed(1)
    b, d, N = 3, 6, 4
    pool = torch.randn(8, d, N, generator=g).to(torch.bfloat16)
    before = pool.clone()
    x, dt, z = (torch.randn(b, d, generator=g) for _ in range(3))
    A = -torch.rand(d, N, generator=g) - 0.5
    B, C = torch.randn(b, N, generator=g), torch.randn(b, N, generator=g)
    D, dt_bias = torch.randn(d, generator=g), torch.randn(d, generator=g)
    src = torch.tensor([[2], [0], [5]], dtype=torch.int32)   # request 1: padding
    dst = torch.tensor([[6], [0], [1]], dtype=torch.int32)
    out = torch.empty(b, d)
    linseq_vllm._state_update(pool, x, dt, A, B, C, D, dt_bias, z=z, dt_softplus=True,
                              state_batch_indices=src, dst_state_batch_indices=dst, out=out)
    step = F.softplus(dt + dt_bias)
    for i, (s, t) in ((0, (2, 6)), (2, (5, 1))):
        def one(v):
            return v[i][None, None]
        y, h = naive.ssm1(one(x), A, one(B), one(C), D, one(step), gate=one(z),
                          h0=before[s].float()[None])
        torch.testing.assert_close(out[i], y[0, 0].float(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(pool[t].float(), h[0].float(), rtol=8e-3, atol=1e-3)
    untouched = [r for r in range(8) if r not in (6, 1)]
    assert torch.equal(pool[untouched], before[untouched])


# ------------------------------------------------------------------------------------------
# Gated DeltaNet and its conv: linseq's adapters against vLLM's own CPU ops on the same
# tensors, both against float64 definitions
# ------------------------------------------------------------------------------------------

class _VllmOwnOps:
    """vllm._custom_ops as vLLM defines it: its own function where linseq's plugin has put
    one of its routes (an op-contract test compares linseq with vLLM, not with itself)."""

    def __getattr__(self, name):
        import vllm._custom_ops as vllm_ops
        return linseq_vllm._outside.get((vllm_ops.__name__, name), getattr(vllm_ops, name))


def _vllm_ops():
    return _VllmOwnOps()


def _gdn_reference(q, k, v, g, beta, h0, eps=1e-5):   # eps: vLLM's l2norm
    """One sequence of the gated delta rule in float64, token by token: q, k [T, H, K], v
    [T, HV, V], g (log decay), beta [T, HV], h0 [HV, K, V]. Returns o [T, HV, V] and the
    final state."""
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    K, group = q.shape[-1], v.shape[1] // q.shape[1]
    q = (q / torch.sqrt((q * q).sum(-1, keepdim=True) + eps)) * K ** -0.5
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + eps)
    q, k = q.repeat_interleave(group, 1), k.repeat_interleave(group, 1)
    S = h0.double().clone()
    o = torch.zeros(v.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        S = S * g[t].exp()[:, None, None]
        u = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", S, k[t]))
        S = S + torch.einsum("hk,hv->hkv", k[t], u)
        o[t] = torch.einsum("hkv,hk->hv", S, q[t])
    return o, S


def _gdn_gate(a, b, A_log, dt_bias):
    """Qwen3-Next's decay and beta from the raw a, b, in float64."""
    g = -A_log.double().exp() * torch.nn.functional.softplus(a.double() + dt_bias.double())
    return g, torch.sigmoid(b.double())


def _paged_pool(slots, *row, generator, scale=0.1):
    """A float32 pool whose rows lie a page apart, wider than a row (a view of vLLM's cache
    pages), filled with random states."""
    n = int(torch.tensor(row).prod())
    pages = torch.randn(slots, n + 16, generator=generator) * scale
    return pages[:, :n].unflatten(1, row)


def _close(got, want, what, tol=2e-2):
    """Within tol of the largest |want| (bfloat16 inputs and outputs)."""
    err = (got.double() - want.double()).abs().max().item()
    scale = max(want.double().abs().max().item(), 1e-6)
    assert err <= tol * scale, f"{what}: error {err:.3g} over {scale:.3g}"


HV, HEAD_DIM = 4, 128   # vLLM's CPU GDN prefill takes head dim 128 only


def _gdn_tokens(n, g, H=2):
    """q, k [1, n, H, 128], v [1, n, HV, 128] and the raw a, b [n, HV], in bfloat16 (vLLM's
    CPU GDN ops take bfloat16 activations)."""
    def rand(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)
    return (rand(1, n, H, HEAD_DIM), rand(1, n, H, HEAD_DIM), rand(1, n, HV, HEAD_DIM),
            rand(n, HV), rand(n, HV))


def _gdn_params(g):
    """A_log [HV] float32 and dt_bias [HV] bfloat16, as vLLM's layer holds them."""
    A_log = torch.log(torch.empty(HV).uniform_(1, 16, generator=g))
    return A_log, (torch.randn(HV, generator=g) * 0.5).to(torch.bfloat16)


def test_gdn_prefill_equals_vllms_op_and_float64():
    """Three prompts packed, one of them empty; two continue from their slots, one starts
    from zeros (vLLM's layer zeroes its slot); the pool's rows a page apart."""
    g = torch.Generator().manual_seed(2)
    cu = torch.tensor([0, 21, 21, 60], dtype=torch.int32)
    slots = torch.tensor([5, 2, 0], dtype=torch.int32)
    has_initial = torch.tensor([True, True, False])
    q, k, v, a, b = _gdn_tokens(60, g)
    A_log, dt_bias = _gdn_params(g)
    gate, beta = _vllm_ops().fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    pool = _paged_pool(7, HV, HEAD_DIM, HEAD_DIM, generator=g)
    pool[slots[~has_initial].long()] = 0
    before = pool.clone()
    pools, outs = {}, {}
    for side, fn in (("vllm", _vllm_ops().chunk_gated_delta_rule_cpu),
                     ("linseq", linseq_vllm._chunk_gated_delta_rule)):
        pools[side] = pool.clone()
        outs[side], _ = fn(query=q, key=k, value=v, g=gate, beta=beta,
                           initial_state=pools[side], output_final_state=True, cu_seqlens=cu,
                           head_first=False, use_qk_l2norm_in_kernel=True,
                           initial_state_indices=slots)
    g64, beta64 = _gdn_gate(a, b, A_log, dt_bias.float())
    for s in range(3):
        span = slice(int(cu[s]), int(cu[s + 1]))
        o, S = _gdn_reference(q[0, span], k[0, span], v[0, span], g64[span], beta64[span],
                              before[slots[s]])
        for side in outs:
            if span.stop > span.start:
                _close(outs[side][0, span], o, f"{side} o of prompt {s}")
            _close(pools[side][slots[s]], S, f"{side} state of prompt {s}", tol=1e-2)
    untouched = [r for r in range(7) if r not in slots.tolist()]
    assert torch.equal(pools["linseq"][untouched], before[untouched])


@pytest.mark.parametrize("bf16_products", [True, False])
def test_gdn_bf16_prompts_take_bf16_products(monkeypatch, bf16_products):
    """vLLM hands the prefill bfloat16 tokens, and computes in bf16 itself: on a CPU where
    it pays (bf16_products_pay), linseq's chunked forward then runs the products only the
    output reads on bf16 operands (exec->products). The final states are bit for bit those
    of the same call on float32 copies (float32 products); o differs from that call's,
    rounded, but stays within bf16's error of it. Where it does not pay, o is that call's
    o rounded."""
    monkeypatch.setattr(linseq_vllm, "_products_choice", [bf16_products])
    g = torch.Generator().manual_seed(12)
    cu = torch.tensor([0, 70, 150], dtype=torch.int32)
    slots = torch.tensor([3, 1], dtype=torch.int32)
    q, k, v, a, b = _gdn_tokens(150, g)
    A_log, dt_bias = _gdn_params(g)
    gate, beta = _vllm_ops().fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    pool = _paged_pool(5, HV, HEAD_DIM, HEAD_DIM, generator=g)
    outs, pools = {}, {}
    for name, tokens in (("bf16", (q, k, v, gate, beta)),
                         ("f32", [t.float() for t in (q, k, v, gate, beta)])):
        tq, tk, tv, tg, tb = tokens
        pools[name] = pool.clone()
        outs[name], _ = linseq_vllm._chunk_gated_delta_rule(
            query=tq, key=tk, value=tv, g=tg, beta=tb, initial_state=pools[name],
            output_final_state=True, cu_seqlens=cu, head_first=False,
            use_qk_l2norm_in_kernel=True, initial_state_indices=slots)
    assert outs["bf16"].dtype == torch.bfloat16 and torch.equal(pools["bf16"], pools["f32"])
    wide = outs["f32"].float()
    if not bf16_products:
        assert torch.equal(outs["bf16"], outs["f32"].to(torch.bfloat16))
        return
    assert not torch.equal(outs["bf16"], outs["f32"].to(torch.bfloat16))
    assert (outs["bf16"].float() - wide).abs().max() <= 2 ** -6 * wide.abs().max()


@pytest.mark.parametrize("vendor, flags, forced, pays", [
    ("AuthenticAMD", "fpu avx512f avx512_bf16 avx512vl", "", True),
    ("AuthenticAMD", "fpu avx2 fma", "", False),
    ("GenuineIntel", "fpu avx512f avx512_bf16 amx_bf16", "", False),
    ("GenuineIntel", "fpu avx512f avx512_bf16", "bf16", True),
    ("AuthenticAMD", "fpu avx512f avx512_bf16", "f32", False)])
def test_bf16_products_by_cpu(monkeypatch, tmp_path, vendor, flags, forced, pays):
    """The GDN prefill's bf16 products where the CPU's bf16 dot product beats its float32
    FMAs (AMD's with AVX512-BF16), else float32 products; LINSEQ_VLLM_PRODUCTS decides
    instead where set, and a value it does not know is refused by name."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: {flags}\n\n"
                       f"processor\t: 1\nvendor_id\t: {vendor}\nflags\t\t: {flags}\n")
    monkeypatch.setattr(linseq_vllm, "_products_choice", [])
    monkeypatch.setenv(linseq_vllm.PRODUCTS_VARIABLE, forced)
    assert linseq_vllm.bf16_products_pay(str(cpuinfo)) is pays
    assert linseq_vllm.bf16_products_pay("/nonexistent") is pays   # decided once
    monkeypatch.setattr(linseq_vllm, "_products_choice", [])
    monkeypatch.setenv(linseq_vllm.PRODUCTS_VARIABLE, "fast")
    with pytest.raises(ValueError, match="LINSEQ_VLLM_PRODUCTS"):
        linseq_vllm.bf16_products_pay(str(cpuinfo))
    monkeypatch.setattr(linseq_vllm, "_products_choice", [])
    monkeypatch.delenv(linseq_vllm.PRODUCTS_VARIABLE)
    assert linseq_vllm.bf16_products_pay(str(tmp_path / "missing")) is False


def test_gdn_decode_equals_vllms_op_and_float64():
    """One token per request over the pool, the fused gate from the raw a, b; a request
    padded with slot -1 (linseq's side only: vLLM's op reads and writes row -1 of the pool)
    gets output 0 and leaves the pool as it was."""
    g = torch.Generator().manual_seed(3)
    n = 4
    slots = torch.tensor([3, 0, -1, 6], dtype=torch.int32)
    q, k, v, a, b = _gdn_tokens(n, g)
    A_log, dt_bias = _gdn_params(g)
    pool = _paged_pool(8, HV, HEAD_DIM, HEAD_DIM, generator=g)
    before = pool.clone()
    real = slots >= 0
    vllm_pool = pool.clone()
    o_vllm = _vllm_ops().fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=q[:, real], k=k[:, real], v=v[:, real], a=a[real],
        b=b[real], initial_state_source=vllm_pool, initial_state_indices=slots[real],
        cu_seqlens=torch.arange(int(real.sum()) + 1, dtype=torch.int32),
        use_qk_l2norm_in_kernel=True)
    o = linseq_vllm._gated_delta_update(
        A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
        initial_state_indices=slots, cu_seqlens=torch.arange(n + 1, dtype=torch.int32),
        use_qk_l2norm_in_kernel=True)
    assert o.shape == (n, 1, HV, HEAD_DIM) and o_vllm.shape == (int(real.sum()), 1, HV, HEAD_DIM)
    g64, beta64 = _gdn_gate(a, b, A_log, dt_bias.float())
    for i, j in ((0, 0), (1, 1), (3, 2)):
        ref_o, ref_S = _gdn_reference(q[0, i:i + 1], k[0, i:i + 1], v[0, i:i + 1],
                                      g64[i:i + 1], beta64[i:i + 1], before[slots[i]])
        _close(o[i], ref_o, f"linseq o of request {i}")
        _close(o_vllm[j], ref_o, f"vllm o of request {i}")
        # linseq's state is exact in float32 (the bfloat16 inputs widened exactly)
        _close(pool[slots[i]], ref_S, f"linseq state of request {i}", tol=1e-5)
        _close(vllm_pool[slots[i]], ref_S, f"vllm state of request {i}", tol=1e-2)
    assert torch.all(o[2] == 0)
    untouched = [r for r in range(8) if r not in (3, 0, 6)]
    assert torch.equal(pool[untouched], before[untouched])


def test_gdn_bf16_tokens_read_as_they_are():
    """vLLM's bfloat16 q, k, v, a, b go to the library as they are (no float32 copies): the
    output and the states are those of the same call on float32 copies, o rounded once to
    bfloat16, bit for bit, on a float32 pool (rows a page apart) and a bfloat16 one."""
    g = torch.Generator().manual_seed(9)
    n = 3
    slots = torch.tensor([5, -1, 1], dtype=torch.int32)
    q, k, v, a, b = _gdn_tokens(n, g)
    assert all(t.dtype == torch.bfloat16 for t in (q, k, v, a, b))
    A_log, dt_bias = _gdn_params(g)
    for pool_dtype in (torch.float32, torch.bfloat16):
        pool = _paged_pool(8, HV, HEAD_DIM, HEAD_DIM, generator=g).to(pool_dtype)
        wide_pool = pool.clone()
        calls = {}
        for name, tokens, target in (("bf16", (q, k, v, a, b), pool),
                                     ("f32", [t.float() for t in (q, k, v, a, b)], wide_pool)):
            tq, tk, tv, ta, tb = tokens
            calls[name] = linseq_vllm._gated_delta_update(
                A_log=A_log, dt_bias=dt_bias, q=tq, k=tk, v=tv, a=ta, b=tb,
                initial_state_source=target, initial_state_indices=slots,
                cu_seqlens=torch.arange(n + 1, dtype=torch.int32), use_qk_l2norm_in_kernel=True)
        assert calls["bf16"].dtype == torch.bfloat16
        assert torch.equal(calls["bf16"], calls["f32"].to(torch.bfloat16)), pool_dtype
        assert torch.equal(pool, wide_pool), pool_dtype


def test_gdn_speculative_decode_equals_vllms_op_and_float64():
    """Three draft tokens per request, each request resuming from the slot of its last
    accepted token and leaving the state after each draft token in that token's slot."""
    g = torch.Generator().manual_seed(4)
    n, T = 2, 3
    spec_slots = torch.tensor([[1, 4, 7, 2], [3, 5, 6, 0]], dtype=torch.int32)
    accepted = torch.tensor([2, 1], dtype=torch.int32)
    cu = torch.arange(0, n * T + 1, T, dtype=torch.int32)
    q, k, v, a, b = _gdn_tokens(n * T, g)
    A_log, dt_bias = _gdn_params(g)
    pool = _paged_pool(8, HV, HEAD_DIM, HEAD_DIM, generator=g)
    before = pool.clone()
    # the layer's spec call: q, k, v [tokens, heads, dim]
    args = dict(A_log=A_log, dt_bias=dt_bias, q=q[0], k=k[0], v=v[0], a=a, b=b,
                spec_state_indices=spec_slots, num_accepted_tokens=accepted, cu_seqlens=cu,
                use_qk_l2norm_in_kernel=True)
    vllm_pool = pool.clone()
    o_vllm = _vllm_ops().fused_sigmoid_gating_delta_rule_update_spec_cpu(
        initial_state_source=vllm_pool, **args)
    o = linseq_vllm._gated_delta_update_spec(initial_state_source=pool, **args)
    g64, beta64 = _gdn_gate(a, b, A_log, dt_bias.float())
    for i in range(n):
        S = before[spec_slots[i, accepted[i] - 1]]
        for t in range(T):
            at = slice(i * T + t, i * T + t + 1)
            ref_o, S = _gdn_reference(q[0, at], k[0, at], v[0, at], g64[at], beta64[at], S)
            _close(o.reshape(n * T, HV, HEAD_DIM)[at], ref_o, f"linseq o {i},{t}")
            _close(o_vllm.reshape(n * T, HV, HEAD_DIM)[at], ref_o, f"vllm o {i},{t}")
            _close(pool[spec_slots[i, t]], S, f"linseq state {i},{t}", tol=1e-5)
            _close(vllm_pool[spec_slots[i, t]], S, f"vllm state {i},{t}", tol=1e-2)
    assert torch.equal(pool[spec_slots[:, T:].reshape(-1).long()],
                       before[spec_slots[:, T:].reshape(-1).long()])


def test_gdn_decode_on_a_bf16_pool_reads_and_writes_it_in_place(monkeypatch):
    """vLLM's bfloat16 state pool (its default, the model's dtype) goes to the library as it
    lies, no copy of its rows (_on_pool is not called): the output is the float32 pool's
    on the same widened values, bit for bit, and each state the float32 one rounded once."""
    g = torch.Generator().manual_seed(8)
    n = 3
    slots = torch.tensor([4, 1, 6], dtype=torch.int32)
    q, k, v, a, b = _gdn_tokens(n, g)
    A_log, dt_bias = _gdn_params(g)
    wide = _paged_pool(8, HV, HEAD_DIM, HEAD_DIM, generator=g).to(torch.bfloat16).float()
    half = wide.to(torch.bfloat16)
    before = half.clone()
    args = dict(A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b,
                initial_state_indices=slots, cu_seqlens=torch.arange(n + 1, dtype=torch.int32),
                use_qk_l2norm_in_kernel=True)
    o_wide = linseq_vllm._gated_delta_update(initial_state_source=wide, **args)

    def no_copy(*args, **kwargs):
        raise AssertionError("the bf16 pool was copied")
    monkeypatch.setattr(linseq_vllm, "_on_pool", no_copy)
    o_half = linseq_vllm._gated_delta_update(initial_state_source=half, **args)
    assert torch.equal(o_half, o_wide)
    assert torch.equal(half, wide.to(torch.bfloat16))
    untouched = [r for r in range(8) if r not in slots.tolist()]
    assert torch.equal(half[untouched], before[untouched])


def _conv_reference(x, weight, bias, state):
    """silu(causal conv) of x [T, dim] after the width-1 inputs in state [dim, width-1], in
    float64; and the last width-1 inputs."""
    width, T = weight.shape[1], x.shape[0]
    xs = torch.cat([state.double(), x.double().t()], dim=1)
    y = sum(weight.double()[:, j:j + 1] * xs[:, j:j + T] for j in range(width))
    return torch.nn.functional.silu(y + bias.double()[:, None]).t(), xs[:, -(width - 1):]


def _conv_setup(g, slots, dim=64, width=4):
    """A bfloat16 weight, vLLM's packing of it, and a bfloat16 conv-state pool in vLLM's
    default layout: [slots, width-1, dim] memory seen as [slots, dim, width-1]."""
    weight = (torch.randn(dim, width, generator=g) * 0.5).to(torch.bfloat16)
    bias = (torch.randn(dim, generator=g) * 0.5).to(torch.bfloat16)
    packed = _vllm_ops().causal_conv1d_weight_pack(weight.contiguous().clone())
    pool = torch.randn(slots, width - 1, dim, generator=g).to(torch.bfloat16).transpose(1, 2)
    return weight, bias, packed, pool


def test_conv_prefill_equals_vllms_op_and_float64():
    """Three packed prompts (one empty), one continuing from its slot; vLLM's packed weight
    and its default conv-state layout; an empty prompt padded with slot -1 on linseq's side
    (vLLM's op writes out of the pool's bounds for it)."""
    g = torch.Generator().manual_seed(5)
    weight, bias, packed, pool = _conv_setup(g, 6)
    cu = torch.tensor([0, 9, 9, 14, 14], dtype=torch.int32)
    slots = torch.tensor([4, 1, 2, -1], dtype=torch.int32)
    has_initial = torch.tensor([True, False, False, False])
    x = torch.randn(14, 64, generator=g).to(torch.bfloat16)
    before = pool.clone()
    outs, pools = {}, {}
    for side, fn, n in (("vllm", _vllm_ops().causal_conv1d_fwd_cpu, 3),
                        ("linseq", linseq_vllm._conv_forward, 4)):
        pools[side] = pool.transpose(1, 2).clone().transpose(1, 2)
        outs[side] = fn(x=x.transpose(0, 1), weight=packed, bias=bias, conv_states=pools[side],
                        query_start_loc=cu[:n + 1], cache_indices=slots[:n],
                        has_initial_state=has_initial[:n], silu_activation=True,
                        is_weight_packed=True).transpose(0, 1)
    for s in range(3):
        span = slice(int(cu[s]), int(cu[s + 1]))
        start = before[slots[s]] if has_initial[s] else torch.zeros(64, 3)
        y, state = _conv_reference(x[span], weight, bias, start)
        for side in outs:
            if span.stop > span.start:
                _close(outs[side][span], y, f"{side} y of prompt {s}")
                _close(pools[side][slots[s]], state, f"{side} state of prompt {s}")
    untouched = [0, 3, 5]
    assert torch.equal(pools["linseq"][untouched], before[untouched])


def test_conv_decode_equals_vllms_op_and_float64():
    g = torch.Generator().manual_seed(6)
    weight, bias, packed, pool = _conv_setup(g, 5)
    slots = torch.tensor([3, 0, -1], dtype=torch.int32)   # -1: padding, linseq's side only
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    before = pool.clone()
    outs, pools = {}, {}
    for side, fn, n in (("vllm", _vllm_ops().causal_conv1d_update_cpu, 2),
                        ("linseq", linseq_vllm._conv_update, 3)):
        pools[side] = pool.transpose(1, 2).clone().transpose(1, 2)
        outs[side] = fn(x=x[:n], conv_states=pools[side], weight=packed, bias=bias,
                        silu_activation=True, conv_state_indices=slots[:n],
                        is_weight_packed=True)
    assert torch.all(outs["linseq"][2] == 0)
    for i in (0, 1):
        y, state = _conv_reference(x[i:i + 1], weight, bias, before[slots[i]])
        for side in outs:
            _close(outs[side][i], y[0], f"{side} y of request {i}")
            _close(pools[side][slots[i]], state, f"{side} state of request {i}")
    assert torch.equal(pools["linseq"][[1, 2, 4]], before[[1, 2, 4]])
    assert torch.equal(pools["linseq"], pools["vllm"])


def test_conv_decode_on_a_pool_layout_the_library_cannot_read_runs_on_a_copy():
    """A conv-state pool whose rows are contiguous in neither of linseq's layouts ([slots,
    dim, width-1] over [width-1, slots, dim] memory) runs on a float32 copy of its rows:
    the same outputs and states as on vLLM's default layout."""
    g = torch.Generator().manual_seed(9)
    weight, bias, packed, pool = _conv_setup(g, 5)
    slots = torch.tensor([3, 0, -1], dtype=torch.int32)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    scattered = pool.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    assert torch.equal(scattered, pool) and not scattered.transpose(1, 2)[0].is_contiguous()
    outs = [linseq_vllm._conv_update(x=x, conv_states=p, weight=packed, bias=bias,
                                     silu_activation=True, conv_state_indices=slots,
                                     is_weight_packed=True) for p in (pool, scattered)]
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(scattered, pool)


def _without_native_steps(monkeypatch):
    """The plugin's Python path for every call (as where the C++ kernels are not loaded)."""
    monkeypatch.setattr(linseq_vllm, "_native_step", lambda name: None)


def _native_or_skip(name):
    """The C++ step, skipped without the C++ kernels (an error in the vLLM environment's
    run, which builds them)."""
    step = linseq_vllm._native_step(name)
    if step is None and os.environ.get("LINSEQ_REQUIRE_VLLM") != "1":
        pytest.skip(f"linseq's C++ kernels are not loaded here ({_torch_native.WHY_NOT})")
    assert step is not None, _torch_native.WHY_NOT
    return step


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("token_dtype", [torch.float32, torch.bfloat16])
def test_gdn_decode_in_cpp_equals_the_python_path(pool_dtype, token_dtype, monkeypatch):
    """The C++ step (linseq::vllm_gdn_decode) takes vLLM's common decode call, a padded
    request and int64 [batch, 1] slots included, and gives the Python path's output and
    pool bit for bit; a form it does not take (float16 tokens) is left to the Python path."""
    step = _native_or_skip("vllm_gdn_decode")
    g = torch.Generator().manual_seed(21)
    n = 3
    slots = torch.tensor([[5], [-1], [2]])
    q, k, v, a, b = (t.to(token_dtype) for t in _gdn_tokens(n, g))
    A_log, dt_bias = _gdn_params(g)
    pool = _paged_pool(8, HV, HEAD_DIM, HEAD_DIM, generator=g).to(pool_dtype)
    args = (A_log, dt_bias, q, k, v, a, b)
    cu = torch.arange(n + 1, dtype=torch.int32)
    pools = {side: pool.clone() for side in ("cpp", "python")}
    taken = step(*args, pools["cpp"], slots, cu, True, linseq_vllm.GDN_L2NORM_EPS)
    assert len(taken) == 1 and taken[0].dtype == token_dtype
    _without_native_steps(monkeypatch)
    o = linseq_vllm._gated_delta_update(*args, pools["python"], slots, cu, True)
    assert torch.equal(taken[0], o)
    assert torch.equal(pools["cpp"], pools["python"])
    assert not torch.equal(pools["cpp"], pool)
    half = [t.to(torch.float16) for t in (q, k, v, a, b)]
    assert step(A_log, dt_bias, *half, pool, slots, cu, True, 1e-5) == []


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows_apart", [False, True])
def test_conv_update_in_cpp_equals_the_python_path(x_dtype, rows_apart, monkeypatch):
    """The C++ step (linseq::vllm_conv_update) takes vLLM's decode conv over its default
    conv-state layout, bf16 bias included, x dense or a slice of a wider projection (the
    Mamba2 layer's), and gives the Python path's output and pool bit for bit; a pool in the
    other layout is left to the Python path."""
    step = _native_or_skip("vllm_conv_update")
    g = torch.Generator().manual_seed(22)
    weight, bias, packed, pool = _conv_setup(g, 5)
    slots = torch.tensor([3, -1, 0], dtype=torch.int32)
    x = torch.randn(3, 100 if rows_apart else 64, generator=g).to(x_dtype)[:, :64]
    taps = linseq_vllm._conv_taps(packed, True)
    pools = {side: pool.transpose(1, 2).clone().transpose(1, 2) for side in ("cpp", "python")}
    taken = step(x, pools["cpp"], taps, bias, True, slots, None)
    assert len(taken) == 1 and taken[0].dtype == x_dtype
    _without_native_steps(monkeypatch)
    y = linseq_vllm._conv_update(x=x, conv_states=pools["python"], weight=packed, bias=bias,
                                 silu_activation=True, conv_state_indices=slots,
                                 is_weight_packed=True)
    assert torch.equal(taken[0], y)
    assert torch.equal(pools["cpp"], pools["python"])
    assert step(x, pool.contiguous(), taps, bias, True, slots, None) == []


def test_cpp_steps_refuse_a_slot_out_of_range_before_any_write():
    """A slot past the pool: the library's refusal, naming the rows, and no row written."""
    gdn, conv = _native_or_skip("vllm_gdn_decode"), _native_or_skip("vllm_conv_update")
    g = torch.Generator().manual_seed(23)
    q, k, v, a, b = _gdn_tokens(2, g)
    A_log, dt_bias = _gdn_params(g)
    pool = _paged_pool(4, HV, HEAD_DIM, HEAD_DIM, generator=g).to(torch.bfloat16)
    before = pool.clone()
    with pytest.raises(ValueError, match="rows"):
        gdn(A_log, dt_bias, q, k, v, a, b, pool, torch.tensor([1, 4]), None, True, 1e-5)
    assert torch.equal(pool, before)
    weight, bias, packed, states = _conv_setup(g, 3)
    before = states.clone()
    with pytest.raises(ValueError, match="rows"):
        conv(torch.randn(2, 64).to(torch.bfloat16), states, linseq_vllm._conv_taps(packed, True),
             bias, True, torch.tensor([0, 7], dtype=torch.int32), None)
    assert torch.equal(states, before)


# ------------------------------------------------------------------------------------------
# A tiny Qwen3.5-like model served by vLLM: linseq against vLLM's kernels and transformers
# ------------------------------------------------------------------------------------------

def _tiny_gdn_model(kind, path):
    """A random 2-layer model with one Gated DeltaNet layer and one full-attention layer
    (head dims 128, as vLLM's CPU GDN prefill requires), Qwen3.5-like (dense) or
    Qwen3-Next-like (4 experts, 2 per token), saved at path, its weights rounded to bfloat16
    (the dtype vLLM's CPU GDN layer runs in) so that transformers' float32 model computes on
    the same weights."""
    sizes = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                 linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128,
                 linear_value_head_dim=128, layer_types=["linear_attention", "full_attention"],
                 tie_word_embeddings=False, max_position_embeddings=256)
    if kind == "qwen3_next":
        config = transformers.Qwen3NextConfig(num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=32,
                                              shared_expert_intermediate_size=32, **sizes)
        model_class = transformers.Qwen3NextForCausalLM
    else:
        config = transformers.Qwen3_5TextConfig(**sizes)
        model_class = transformers.Qwen3_5ForCausalLM
    return _saved_with_bf16_weights(model_class, config, path)


def _saved_with_bf16_weights(model_class, config, path):
    """A float32 model of config, its weights drawn N(0, 0.5) (A_log, dt_bias and the norms
    kept) and rounded to bfloat16 (the dtype vLLM serves it in) so that transformers' float32
    model computes on the same weights, saved at path."""
    torch.manual_seed(0)
    model = model_class(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not any(s in name for s in ("A_log", "dt_bias", "norm")):
                p.normal_(0.0, 0.5)
            p.copy_(p.to(torch.bfloat16).float())
    model.save_pretrained(path)
    return model


def _prompt_logprobs(output):
    """The log-probability vLLM gives each prompt token after the first."""
    return torch.tensor([next(iter(d.values())).logprob for d in output.prompt_logprobs[1:]])


def _reference_logprobs(model, tokens):
    """transformers' float32 log-probabilities [len(tokens) - 1, vocab] of each next token."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, :-1].double()
    return torch.log_softmax(logits, -1)


# bfloat16 activations: log-probabilities of vLLM's kernels stray from the float32 reference
# by up to a few percent of their size (measured: 2%), linseq's by as much
LOGPROB_TOLERANCE = dict(rtol=0.03, atol=0.05)


def _spy_on_pool_ops(monkeypatch):
    """The (pool function, op) pairs the GDN adapters called, as a list filled in; a call
    the C++ steps took as ("cpp decode_pool", its op)."""
    calls = []
    real, real_step = linseq_vllm._on_vllms_pool, linseq_vllm._native_step
    step_ops = {"vllm_gdn_decode": "kda", "vllm_conv_update": "causal_conv1d",
                "vllm_ssd_decode": "ssd"}

    def spy(function, op, *args, **kwargs):
        calls.append((function, op))
        return real(function, op, *args, **kwargs)

    def step_spy(name):
        step = real_step(name)
        if step is None:
            return None

        def spied(*args):
            taken = step(*args)
            if taken:
                calls.append(("cpp decode_pool", step_ops[name]))
            return taken
        return spied
    monkeypatch.setattr(linseq_vllm, "_on_vllms_pool", spy)
    monkeypatch.setattr(linseq_vllm, "_native_step", step_spy)
    return calls


def _serve_each_side(path, monkeypatch, sides, ops):
    """{side: vLLM's outputs for PROMPTS} from one engine serving the model at path, each
    side's routing set by sides[side] (None: vLLM's own kernels; else the families to
    enable); a linseq side must make exactly ops' prefill and decode pool calls (the decode
    in C++ where the C++ steps are loaded), vLLM's none. The routing is reset after."""
    calls = _spy_on_pool_ops(monkeypatch)
    llm = vllm.LLM(model=str(path), skip_tokenizer_init=True, dtype="bfloat16",
                   max_model_len=64, max_num_batched_tokens=16, enforce_eager=True, seed=0,
                   enable_prefix_caching=False)
    params = vllm.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True,
                                 prompt_logprobs=0)
    decode = "decode_pool" if linseq_vllm._native_step("vllm_conv_update") is None \
        else "cpp decode_pool"
    runs = {}
    try:
        for side, families in sides.items():
            linseq_vllm.disable()
            if families is not None:
                linseq_vllm.enable(families)
            calls.clear()
            runs[side] = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
            want = set() if families is None else {(f, op) for f in ("forward_pool", decode)
                                                   for op in ops}
            assert set(calls) == want, side
    finally:
        linseq_vllm.disable()
        linseq_vllm.enable()
        del llm
        gc.collect()
    return runs


def _assert_agree_with_transformers(model, runs):
    """linseq's run near transformers' float32 model (_assert_near_transformers), vLLM's
    kernels' prompt log-probabilities too, and the two sides' within bfloat16's noise."""
    ours, theirs = ([_prompt_logprobs(o).double() for o in runs[s]] for s in ("linseq", "vllm"))
    _assert_near_transformers(model, [list(o.outputs[0].token_ids) for o in runs["linseq"]],
                              ours)
    _assert_near_transformers(model, None, theirs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **LOGPROB_TOLERANCE)


def _assert_near_transformers(model, generated, prompt_logprobs):
    """Each token of generated[i] (None: not checked) is, by transformers' float32
    log-probabilities after the same tokens, the most likely one or within bfloat16's noise
    of it (bfloat16 can swap two near-equal tokens, and the sequences part); prompt_logprobs[i]
    (PROMPTS[i]'s tokens after its first) within that noise of transformers'."""
    if generated is not None:
        assert len({t for seq in generated for t in seq}) > len(PROMPTS), generated
        for prompt, tokens in zip(PROMPTS, generated):
            ref = _reference_logprobs(model, prompt + tokens)
            positions = torch.arange(len(prompt) - 1, ref.shape[0])
            torch.testing.assert_close(ref[positions, torch.tensor(tokens)],
                                       ref[positions].max(-1).values, **LOGPROB_TOLERANCE)
    for prompt, logprobs in zip(PROMPTS, prompt_logprobs):
        if len(prompt) > 1:
            ref = _reference_logprobs(model, prompt)
            want = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
            torch.testing.assert_close(torch.as_tensor(logprobs).double(), want,
                                       **LOGPROB_TOLERANCE)


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_next"])
def test_gdn_model_on_linseq_agrees_with_vllms_kernels_and_transformers(
        kind, offline_vllm, tmp_path, monkeypatch):
    """One engine, its GDN ops routed to linseq, then vLLM's own, then linseq again (the
    same outputs). Prompts of 1 to 40 tokens under a 16-token step budget: long prompts are
    prefilled over several steps (resuming from their slots) while short ones decode.
    linseq's tokens and log-probabilities agree with vLLM's kernels' and transformers'
    float32 model's of the same weights (_assert_agree_with_transformers)."""
    model = _tiny_gdn_model(kind, tmp_path)
    runs = _serve_each_side(tmp_path, monkeypatch,
                            {"linseq": "all", "vllm": None, "linseq again": "all"},
                            ("kda", "causal_conv1d"))
    again = runs["linseq again"]
    assert [o.outputs[0].token_ids for o in runs["linseq"]] == [o.outputs[0].token_ids
                                                               for o in again]
    for ours, repeated, prompt in zip(runs["linseq"], again, PROMPTS):
        if len(prompt) > 1:
            assert torch.equal(_prompt_logprobs(ours), _prompt_logprobs(repeated))
    _assert_agree_with_transformers(model, runs)


# Two ranks of a tensor-parallel engine, run in a process of their own (vLLM's workers start
# with the environment it is given): tokens and prompt log-probabilities as JSON, and in each
# worker, whether vLLM's GDN ops are linseq's routes there.
_TENSOR_PARALLEL_RUN = """
import json, sys
import vllm
import vllm._custom_ops

def routed(worker):
    return getattr(vllm._custom_ops.chunk_gated_delta_rule_cpu, "linseq_route", None)

path, prompts, new_tokens, out = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
llm = vllm.LLM(model=path, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=64,
               max_num_batched_tokens=16, enforce_eager=True, seed=0,
               enable_prefix_caching=False, tensor_parallel_size=2,
               distributed_executor_backend="mp")
params = vllm.SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True,
                             prompt_logprobs=0)
outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
json.dump({"tokens": [list(o.outputs[0].token_ids) for o in outs],
           "logprobs": [[next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]]
                        for o in outs],
           "routed": llm.collective_rpc(routed)}, open(out, "w"))
"""


def test_gdn_model_on_two_tensor_parallel_ranks(offline_vllm, tmp_path):
    """vLLM's CPU build serving a tiny Qwen3.5-like model over two tensor-parallel worker
    processes (a core each), linseq routed in each worker through the plugin's entry point:
    every rank's GDN ops are linseq's, and the tokens and prompt log-probabilities agree with
    transformers' float32 model as the single-process run's do."""
    import json
    import subprocess
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two worker processes of a core each need two cores")
    model = _tiny_gdn_model("qwen3_5", tmp_path / "model")
    out = tmp_path / "run.json"
    # insecure serialization: the workers run the function routed() (collective_rpc) sent
    # from this test's own process
    env = dict(os.environ, LINSEQ_VLLM="gdn", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ALLOW_INSECURE_SERIALIZATION="1",
               VLLM_CPU_OMP_THREADS_BIND="|".join(map(str, sorted(os.sched_getaffinity(0))[:2])),
               PYTHONPATH=os.pathsep.join([str(offline_vllm), os.path.join(ROOT, "python"),
                                           os.environ.get("PYTHONPATH", "")]))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    done = subprocess.run([sys.executable, "-c", _TENSOR_PARALLEL_RUN, str(tmp_path / "model"),
                           json.dumps(PROMPTS), str(NEW_TOKENS), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(out.read_text())
    assert run["routed"] == ["vllm._custom_ops.chunk_gated_delta_rule_cpu"] * 2
    _assert_near_transformers(model, run["tokens"], run["logprobs"])


def test_serving_tool_gives_vllms_ops_the_threads_linseq_gets(tmp_path):
    """tools/perf/vllm_serving.py compares vLLM's kernels and linseq's in one in-process
    engine at --threads each. vLLM's ops run on torch's intra-op threads, which that engine
    leaves at one per CPU (its CPU worker makes torch.set_num_threads a no-op before its own
    call that would lower them), so a "1 thread" table gave vLLM's GDN ops every CPU against
    linseq's one: the tool must start torch on --threads, and say so in its header."""
    import re
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"),
                                                       os.environ.get("PYTHONPATH", "")]))
    env.pop("OMP_NUM_THREADS", None)   # what the tool's user has by default
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "perf", "vllm_serving.py"),
                           "--threads", "1", "--rounds", "1", "--models", "qwen3_5",
                           "--prompt", "16", "--batch", "2", "--new", "2"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    threads = re.search(r"torch's intra-op threads (\d+)", done.stdout)
    assert threads and threads.group(1) == "1", done.stdout[-2000:]


def test_a_call_the_route_declines_runs_on_vllms_op():
    """softplus_beta 2 (linseq's gate has beta 1): the routed function gives vLLM's result,
    written to vLLM's pool as vLLM's op writes it."""
    g = torch.Generator().manual_seed(7)
    q, k, v, a, b = _gdn_tokens(2, g)
    A_log, dt_bias = _gdn_params(g)
    pool = _paged_pool(3, HV, HEAD_DIM, HEAD_DIM, generator=g)
    linseq_vllm.enable("all")
    routed = importlib.import_module("vllm._custom_ops").fused_sigmoid_gating_delta_rule_update_cpu
    vllms = linseq_vllm._outside[("vllm._custom_ops",
                                  "fused_sigmoid_gating_delta_rule_update_cpu")]
    assert routed is not vllms
    outs, pools = [], []
    for fn in (routed, vllms):
        pools.append(pool.clone())
        outs.append(fn(A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b,
                       initial_state_source=pools[-1],
                       initial_state_indices=torch.tensor([2, 0], dtype=torch.int32),
                       cu_seqlens=torch.arange(3, dtype=torch.int32),
                       use_qk_l2norm_in_kernel=True, softplus_beta=2.0))
    assert torch.equal(outs[0], outs[1]) and torch.equal(pools[0], pools[1])
    assert not torch.equal(pools[0], pool)


# ------------------------------------------------------------------------------------------
# Mamba2 (MambaMixer2: Mamba2, FalconH1, GraniteMoeHybrid, NemotronH, Zamba2): linseq's
# adapters against vLLM's own CPU scan, decode step and conv, both against float64
# ------------------------------------------------------------------------------------------

MIXER2 = "vllm.model_executor.layers.mamba.mamba_mixer2"
SSU_DISPATCH = "vllm.model_executor.layers.mamba.ops.ssu_dispatch"
M2_HEADS, M2_HEAD_DIM, M2_GROUPS, M2_DSTATE = 4, 8, 2, 16


def _vllms_mamba2_scan():
    """vLLM's CPU prefill scan, from the module that defines it (linseq routes the name the
    layer imported)."""
    from vllm.model_executor.layers.mamba.ops.ssd_combined import (
        mamba_chunk_scan_combined_varlen)
    return mamba_chunk_scan_combined_varlen


def _vllms_mamba2_state_update():
    """vLLM's CPU decode step: the backend its dispatcher runs on a CPU platform."""
    from vllm.config.mamba import MambaConfig
    return importlib.import_module(SSU_DISPATCH).CPUSSUBackend(MambaConfig())


def _ssd_reference(x, dt, A, B, C, D, z, dt_bias, softplus, h0):
    """One sequence of Mamba2's scan in float64, token by token: x, z [T, H, P], dt [T, H],
    B, C [T, G, N], A, dt_bias [H], D [H] (or None), h0 [H, P, N]. Returns y [T, H, P] and
    the final state."""
    x, dt, B, C = (t.double() for t in (x, dt, B, C))
    heads, groups = x.shape[1], B.shape[1]
    B, C = (t.repeat_interleave(heads // groups, 1) for t in (B, C))
    if dt_bias is not None:
        dt = dt + dt_bias.double()
    if softplus:
        dt = torch.nn.functional.softplus(dt)
    S = h0.double().clone()
    y = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        decay = torch.exp(dt[t] * A.double())
        S = decay[:, None, None] * S + (dt[t][:, None] * x[t])[:, :, None] * B[t][:, None, :]
        y[t] = torch.einsum("hpn,hn->hp", S, C[t])
        if D is not None:
            y[t] += D.double()[:, None] * x[t]
        if z is not None:
            y[t] *= torch.nn.functional.silu(z[t].double())
    return y, S


def _ssd_tokens(n, g, dtype):
    """x [n, H, P], dt [n, H], B, C [n, G, N], z [n, H, P] in dtype."""
    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)
    return (rand(n, M2_HEADS, M2_HEAD_DIM), rand(n, M2_HEADS, scale=0.5),
            rand(n, M2_GROUPS, M2_DSTATE), rand(n, M2_GROUPS, M2_DSTATE),
            rand(n, M2_HEADS, M2_HEAD_DIM))


def _ssd_params(g):
    """A (-exp(A_log)), D and dt_bias [H] in float32, as MambaMixer2 holds them."""
    A = -torch.empty(M2_HEADS).uniform_(1, 4, generator=g)
    return A, torch.randn(M2_HEADS, generator=g), torch.randn(M2_HEADS, generator=g) * 0.5


def _same_rounded(dtype):
    """Tolerances of two float32 results rounded to dtype once: float32 rounding apart, in
    bfloat16 one step of it (2**-8 of the value) where the two fall either side of a tie."""
    return dict(rtol=8e-3, atol=1e-6) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)


# (D and z given, dt_softplus): the layer passes D, no z, softplus; the others the op's
# contract allows (dt_bias is added before the softplus, or alone without it)
SSD_CASES = [(True, False, True), (True, True, True), (False, False, False)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_D_z, with_z, softplus", SSD_CASES)
def test_mamba2_prefill_equals_vllms_op_and_float64(dtype, with_D_z, with_z, softplus):
    """Three packed prompts, the first and last continuing from a state, the middle one new
    (the layer passes zeros for it); the final states in the state dtype (bfloat16: the
    library writes the returned tensor in place). The same call with initial_states None."""
    g = torch.Generator().manual_seed(11)
    cu = torch.tensor([0, 6, 7, 30], dtype=torch.int32)
    x, dt, B, C, z = _ssd_tokens(30, g, dtype)
    A, D, dt_bias = _ssd_params(g)
    D, z = (D if with_D_z else None), (z if with_z else None)
    if not softplus:   # dt + dt_bias is the step itself: small and positive
        dt, dt_bias = (dt.abs() * 0.2).to(dtype), dt_bias.abs() * 0.1
    initial = (torch.randn(3, M2_HEADS, M2_HEAD_DIM, M2_DSTATE, generator=g) * 0.3).to(dtype)
    initial[1] = 0
    for given in (initial, None):
        outs, states = {}, {}
        for side, fn in (("vllm", _vllms_mamba2_scan()), ("linseq", linseq_vllm._ssd_chunk_scan)):
            outs[side] = torch.full(x.shape, float("nan"), dtype=dtype)
            states[side] = fn(x, dt, A, B, C, 16, cu, None, None, torch.zeros(1), outs[side],
                              D=D, z=z, dt_bias=dt_bias, initial_states=given,
                              dt_softplus=softplus, state_dtype=dtype)
            assert states[side].dtype == dtype and states[side].shape == initial.shape
        for s in range(3):
            span = slice(int(cu[s]), int(cu[s + 1]))
            h0 = initial[s] if given is not None else torch.zeros(initial.shape[1:])
            y, S = _ssd_reference(x[span], dt[span], A, B[span], C[span], D,
                                  None if z is None else z[span], dt_bias, softplus, h0)
            for side in outs:
                _close(outs[side][span], y, f"{side} y of prompt {s}", tol=1e-2)
                _close(states[side][s], S, f"{side} state of prompt {s}", tol=1e-2)
        # both round one float32 result once: float32 rounding apart, one bfloat16 step
        torch.testing.assert_close(outs["linseq"], outs["vllm"], **_same_rounded(dtype))
        torch.testing.assert_close(states["linseq"], states["vllm"], **_same_rounded(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mamba2_prefill_chunk_states_for_prefix_caching(dtype):
    """return_intermediate_states (vLLM's align mode): the state after each chunk of
    cu_chunk_seqlens, each prompt's final state at its last chunk. Three packed prompts in
    chunks of 16: one from token 0 (16 + 16 + 8), one resuming 11 tokens into a block from a
    state (5 + 16 + 3), one of a single chunk; each chunk's state is the float64 scan's after
    that many tokens, and y as without the states. vLLM's CPU kernel returns the final states
    alone for this call, which the layer then indexes by chunk (an IndexError)."""
    g = torch.Generator().manual_seed(12)
    lengths, chunks = (40, 24, 7), [16, 16, 8, 5, 16, 3, 7]
    cu = torch.tensor([0, 40, 64, 71], dtype=torch.int32)
    cu_chunks = torch.tensor([0] + list(itertools.accumulate(chunks)), dtype=torch.int32)
    last = torch.tensor([2, 5, 6], dtype=torch.int32)
    x, dt, B, C, _ = _ssd_tokens(71, g, dtype)
    A, D, dt_bias = _ssd_params(g)
    initial = (torch.randn(3, M2_HEADS, M2_HEAD_DIM, M2_DSTATE, generator=g) * 0.3).to(dtype)
    initial[0] = 0
    out, plain_out = (torch.full(x.shape, float("nan"), dtype=dtype) for _ in range(2))
    states = linseq_vllm._ssd_chunk_scan(x, dt, A, B, C, 16, cu, cu_chunks, last,
                                         torch.zeros(1), out, D=D, dt_bias=dt_bias,
                                         initial_states=initial, dt_softplus=True,
                                         return_intermediate_states=True, state_dtype=dtype)
    assert states.dtype == dtype and states.shape == (len(chunks),) + initial.shape[1:]
    linseq_vllm._ssd_chunk_scan(x, dt, A, B, C, 16, cu, None, None, torch.zeros(1), plain_out,
                                D=D, dt_bias=dt_bias, initial_states=initial,
                                dt_softplus=True, state_dtype=dtype)
    chunk = 0
    for s in range(3):
        start, ends = int(cu[s]), []
        while chunk <= int(last[s]):
            ends.append((chunk, int(cu_chunks[chunk + 1])))
            chunk += 1
        for c, end in ends:
            span = slice(start, end)
            y, S = _ssd_reference(x[span], dt[span], A, B[span], C[span], D, None, dt_bias,
                                  True, initial[s])
            _close(states[c], S, f"state after chunk {c} (prompt {s})", tol=1e-2)
        _close(out[start:int(cu[s + 1])], y, f"y of prompt {s}", tol=1e-2)
    # the pieces restart the library's chunks at vLLM's ends: rounding apart from one pass
    torch.testing.assert_close(out, plain_out, **_same_rounded(dtype))
    with pytest.raises(linseq_vllm._Declined, match="multiples of chunk_size"):
        linseq_vllm._ssd_chunk_scan(x, dt, A, B, C, 16, cu, torch.tensor(
            [0, 16, 30, 40, 45, 61, 64, 71], dtype=torch.int32), last, torch.zeros(1), out,
            D=D, dt_bias=dt_bias, dt_softplus=True, return_intermediate_states=True)


def test_mamba2_prefix_caching_in_align_mode(offline_vllm, tmp_path, monkeypatch):
    """Mamba2's prefix caching in vLLM's align mode, which vLLM's CPU build cannot run on its
    own kernels (its scan returns no chunk states, and it keeps checkpoints with a Triton
    kernel), routed to linseq. Prompts sharing a 40-token prefix, served one after another,
    give the tokens transformers' float32 model of the same weights ranks first (within
    bfloat16's noise), and the later ones' prefill starts from the checkpoint at token 32
    (the scan sees 10 and 13 of their 42 and 45 tokens). Then one batch (a prompt resuming
    from the cache, a new one of four chunks, a short one: several prompts' chunk states in
    one scan) gives the tokens of the same engine without prefix caching."""
    model = _tiny_mamba2_model(tmp_path)
    prefix = [(5 * i + 1) % 64 for i in range(40)]
    prompts = [prefix + [7, 8, 9], prefix + [11, 12], prefix + [7, 8, 9, 10, 3]]
    other = [(3 * i + 2) % 64 for i in range(57)]
    batch = [prefix + [5, 6, 7], other, other[:20]]
    scanned = []   # the tokens of each layer's prefill scan
    real = linseq_vllm._pool_call

    def spy(function, op, arrays, *args, **kwargs):
        if op == "ssd" and function.startswith("forward_pool"):
            scanned.append(arrays["x"].shape[1])
        return real(function, op, arrays, *args, **kwargs)
    monkeypatch.setattr(linseq_vllm, "_pool_call", spy)
    linseq_vllm.disable()
    linseq_vllm.enable(("mamba2",))
    params = vllm.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    runs = {}
    try:
        for caching in (True, False):
            llm = vllm.LLM(model=str(tmp_path), skip_tokenizer_init=True, dtype="bfloat16",
                           max_model_len=128, max_num_batched_tokens=64, enforce_eager=True,
                           seed=0, block_size=16, enable_prefix_caching=caching,
                           **({"mamba_cache_mode": "align"} if caching else {}))
            got, prefill_tokens = [], []
            for p in prompts if caching else ():
                scanned.clear()
                got.append(list(llm.generate([{"prompt_token_ids": p}],
                                             params)[0].outputs[0].token_ids))
                prefill_tokens.append(sum(scanned) // model.config.num_hidden_layers)
            runs[caching] = (got, prefill_tokens, [
                list(o.outputs[0].token_ids)
                for o in llm.generate([{"prompt_token_ids": p} for p in batch], params)])
            del llm
            gc.collect()
    finally:
        linseq_vllm.disable()
        linseq_vllm.enable()
    got, prefill_tokens, batch_tokens = runs[True]
    assert prefill_tokens == [43, 10, 13], prefill_tokens
    for prompt, tokens in zip(prompts, got):
        ref = _reference_logprobs(model, prompt + tokens)
        positions = torch.arange(len(prompt) - 1, ref.shape[0])
        torch.testing.assert_close(ref[positions, torch.tensor(tokens)],
                                   ref[positions].max(-1).values, **LOGPROB_TOLERANCE)
    assert batch_tokens == runs[False][2]


def _mamba2_decode_args(g, batch, dtype, with_D_z):
    """The layer's decode call: x, z [batch, H, P], dt expanded over headdim, A over
    headdim and dstate, D and dt_bias over headdim (stride 0, as MambaMixer2 passes them)."""
    x, dt, B, C, z = _ssd_tokens(batch, g, dtype)
    A, D, dt_bias = _ssd_params(g)
    P, N = M2_HEAD_DIM, M2_DSTATE
    return dict(x=x, dt=dt[:, :, None].expand(-1, -1, P), A=A[:, None, None].expand(-1, P, N),
                B=B, C=C, D=D[:, None].expand(-1, P) if with_D_z else None,
                dt_bias=dt_bias[:, None].expand(-1, P), z=z if with_D_z else None,
                dt_softplus=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_D_z", [True, False])
def test_mamba2_decode_equals_vllms_op_and_float64(dtype, with_D_z):
    """One token per request over the pool in place (float32 rows a page apart, or vLLM's
    bfloat16 pool), vLLM's [batch, 1] slot column; request 1 on vLLM's null block (0) and,
    on linseq's side only, request 3 on slot -1 (vLLM's op indexes the pool with it): both
    padding, output 0, no state touched."""
    g = torch.Generator().manual_seed(12)
    slots = torch.tensor([[4], [0], [2], [-1]], dtype=torch.int32)
    args = _mamba2_decode_args(g, 4, dtype, with_D_z)
    pool = _paged_pool(6, M2_HEADS, M2_HEAD_DIM, M2_DSTATE, generator=g, scale=0.5)
    pool = pool if dtype == torch.float32 else pool.to(dtype)
    before = pool.clone()
    pools, outs = {}, {}
    for side, fn, n in (("vllm", _vllms_mamba2_state_update(), 3),
                        ("linseq", linseq_vllm._ssd_state_update, 4)):
        pools[side] = pool.clone()
        outs[side] = torch.full((n, M2_HEADS, M2_HEAD_DIM), float("nan"), dtype=dtype)
        mine = {k: v[:n] if k in ("x", "dt", "B", "C", "z") and v is not None else v
                for k, v in args.items()}
        fn(pools[side], state_batch_indices=slots[:n], dst_state_batch_indices=slots[:n],
           out=outs[side], **mine)
    D = None if args["D"] is None else args["D"][:, 0]
    for i in (0, 2):
        at = slice(i, i + 1)
        y, S = _ssd_reference(args["x"][at], args["dt"][at, :, 0], args["A"][:, 0, 0],
                              args["B"][at], args["C"][at], D,
                              None if args["z"] is None else args["z"][at],
                              args["dt_bias"][:, 0], True, before[slots[i, 0]])
        for side in outs:
            _close(outs[side][i], y[0], f"{side} y of request {i}", tol=1e-2)
            _close(pools[side][slots[i, 0]], S, f"{side} state of request {i}", tol=1e-2)
        torch.testing.assert_close(outs["linseq"][i], outs["vllm"][i], **_same_rounded(dtype))
    assert torch.all(outs["linseq"][[1, 3]] == 0)
    torch.testing.assert_close(pools["linseq"], pools["vllm"], **_same_rounded(dtype))
    untouched = [0, 1, 3, 5]
    assert torch.equal(pools["linseq"][untouched], before[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_D_z", [True, False])
def test_mamba2_decode_in_cpp_equals_the_python_path(dtype, with_D_z, monkeypatch):
    """The C++ step (linseq::vllm_ssd_decode) takes the Mamba2 layer's decode call (the
    stride-0 per-head tensors, vLLM's null block and -1 as padding, a request moved to
    another slot) and gives the Python path's output and pool bit for bit; per-channel dt
    (values along headdim) is left to the Python path, which declines it."""
    step = _native_or_skip("vllm_ssd_decode")
    g = torch.Generator().manual_seed(24)
    src = torch.tensor([4, 0, 2, -1], dtype=torch.int32)
    dst = torch.tensor([1, 0, 2, -1], dtype=torch.int32)
    args = _mamba2_decode_args(g, 4, dtype, with_D_z)
    pool = _paged_pool(6, M2_HEADS, M2_HEAD_DIM, M2_DSTATE, generator=g, scale=0.5).to(dtype)
    pools = {side: pool.clone() for side in ("cpp", "python")}
    outs = {side: torch.full((4, M2_HEADS, M2_HEAD_DIM), float("nan"), dtype=dtype)
            for side in pools}
    call = [args[k] for k in ("x", "dt", "A", "B", "C", "D", "dt_bias", "z", "dt_softplus")]
    taken = step(pools["cpp"], *call, src, dst, 0, outs["cpp"], None)
    assert len(taken) == 1 and taken[0] is outs["cpp"]
    _without_native_steps(monkeypatch)
    linseq_vllm._ssd_state_update(pools["python"], state_batch_indices=src,
                                  dst_state_batch_indices=dst, out=outs["python"], **args)
    assert torch.equal(outs["cpp"], outs["python"])
    assert torch.equal(pools["cpp"], pools["python"])
    assert torch.equal(pools["cpp"][[0, 3, 4, 5]], pool[[0, 3, 4, 5]])
    varying = args["dt"] + torch.linspace(0, 1, M2_HEAD_DIM)
    assert step(pool, args["x"], varying, *call[2:], src, dst, 0, None, None) == []


def _mamba2_conv_setup(g, slots, dim=48, width=4):
    """A bfloat16 [dim, width] weight as MambaMixer2 holds it (not packed) and a bfloat16
    conv-state pool in vLLM's default layout ([slots, width-1, dim] memory seen as [slots,
    dim, width-1])."""
    weight = (torch.randn(dim, width, generator=g) * 0.5).to(torch.bfloat16)
    bias = (torch.randn(dim, generator=g) * 0.5).to(torch.bfloat16)
    pool = torch.randn(slots, width - 1, dim, generator=g).to(torch.bfloat16).transpose(1, 2)
    return weight, bias, pool


def test_mamba2_conv_prefill_equals_vllms_op_and_float64():
    """Three packed prompts, the first continuing from its slot, the last padded with
    vLLM's PAD_SLOT_ID (-1): no state written for it."""
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn
    g = torch.Generator().manual_seed(13)
    weight, bias, pool = _mamba2_conv_setup(g, 6)
    cu = torch.tensor([0, 9, 14, 17], dtype=torch.int32)
    slots = torch.tensor([4, 1, -1], dtype=torch.int32)
    has_initial = torch.tensor([True, False, True])
    x = torch.randn(17, 48, generator=g).to(torch.bfloat16)
    before = pool.clone()
    outs, pools = {}, {}
    for side, fn in (("vllm", causal_conv1d_fn), ("linseq", linseq_vllm._mixer2_conv_forward)):
        pools[side] = pool.transpose(1, 2).clone().transpose(1, 2)
        outs[side] = fn(x.transpose(0, 1), weight, bias, activation="silu",
                        conv_states=pools[side], has_initial_state=has_initial,
                        cache_indices=slots, metadata=None,
                        query_start_loc=cu).transpose(0, 1)
    for s in range(2):
        span = slice(int(cu[s]), int(cu[s + 1]))
        start = before[slots[s]] if has_initial[s] else torch.zeros(48, 3)
        y, state = _conv_reference(x[span], weight, bias, start)
        for side in outs:
            _close(outs[side][span], y, f"{side} y of prompt {s}")
            _close(pools[side][slots[s]], state, f"{side} state of prompt {s}")
    assert torch.equal(pools["linseq"], pools["vllm"])
    untouched = [0, 2, 3, 5]
    assert torch.equal(pools["linseq"][untouched], before[untouched])


def test_mamba2_conv_decode_equals_vllms_op_and_float64():
    """One token per request, vLLM's [batch, 1] slot column, request 1 on the null block."""
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update
    g = torch.Generator().manual_seed(14)
    weight, bias, pool = _mamba2_conv_setup(g, 5)
    slots = torch.tensor([[3], [0], [2]], dtype=torch.int32)
    x = torch.randn(3, 48, generator=g).to(torch.bfloat16)
    before = pool.clone()
    outs, pools = {}, {}
    for side, fn in (("vllm", causal_conv1d_update), ("linseq", linseq_vllm._mixer2_conv_update)):
        pools[side] = pool.transpose(1, 2).clone().transpose(1, 2)
        outs[side] = fn(x, pools[side], weight, bias, "silu", conv_state_indices=slots,
                        num_accepted_tokens=None, query_start_loc=None, max_query_len=1)
    assert torch.all(outs["linseq"][1] == 0)
    for i in (0, 2):
        y, state = _conv_reference(x[i:i + 1], weight, bias, before[slots[i, 0]])
        for side in outs:
            _close(outs[side][i], y[0], f"{side} y of request {i}")
            _close(pools[side][slots[i, 0]], state, f"{side} state of request {i}")
    assert torch.equal(pools["linseq"], pools["vllm"])
    assert torch.equal(pools["linseq"][[0, 1, 4]], before[[0, 1, 4]])


def test_mamba2_is_routed_only_when_asked(monkeypatch):
    mixer2 = importlib.import_module(MIXER2)
    linseq_vllm.disable()
    own = mixer2.mamba_chunk_scan_combined_varlen
    monkeypatch.delenv(linseq_vllm.OPT_OUT_VARIABLE, raising=False)
    assert not any(name.startswith(MIXER2) for name in linseq_vllm.register())
    assert mixer2.mamba_chunk_scan_combined_varlen is own
    for value in ("all", "mamba2", "gdn,mamba2"):
        linseq_vllm.disable()
        monkeypatch.setenv(linseq_vllm.OPT_OUT_VARIABLE, value)
        routed = linseq_vllm.register()
        assert {f"{MIXER2}.{name}" for name in ("mamba_chunk_scan_combined_varlen",
                                                 "selective_state_update", "causal_conv1d_fn",
                                                 "causal_conv1d_update")} <= set(routed), value
        assert mixer2.mamba_chunk_scan_combined_varlen is not own
    linseq_vllm.disable()
    assert mixer2.mamba_chunk_scan_combined_varlen is own


def test_a_mamba2_call_the_route_declines_runs_on_vllms_op(monkeypatch):
    """A decode step whose dt differs along headdim (linseq's SSD has one dt per head): the
    routed function gives vLLM's result, the pool written as vLLM's op writes it."""
    g = torch.Generator().manual_seed(15)
    args = _mamba2_decode_args(g, 2, torch.float32, True)
    args["dt"] = args["dt"].contiguous() + torch.rand(args["dt"].shape, generator=g)
    pool = torch.randn(3, M2_HEADS, M2_HEAD_DIM, M2_DSTATE, generator=g)
    slots = torch.tensor([[2], [1]], dtype=torch.int32)
    # the backend vLLM's dispatcher runs, as an engine on a CPU platform sets it
    monkeypatch.setattr(importlib.import_module(SSU_DISPATCH), "_mamba_ssu_backend",
                        _vllms_mamba2_state_update())
    linseq_vllm.enable(("mamba2",))
    try:
        routed = importlib.import_module(MIXER2).selective_state_update
        assert getattr(routed, "linseq_route", None) == f"{MIXER2}.selective_state_update"
        outs, pools = [], []
        for fn in (routed, _vllms_mamba2_state_update()):
            pools.append(pool.clone())
            outs.append(torch.empty(2, M2_HEADS, M2_HEAD_DIM))
            fn(pools[-1], state_batch_indices=slots, dst_state_batch_indices=slots,
               out=outs[-1], **args)
    finally:
        linseq_vllm.disable()
    assert torch.equal(outs[0], outs[1]) and torch.equal(pools[0], pools[1])
    assert not torch.equal(pools[0], pool)


def _tiny_mamba2_model(path):
    """A random 2-layer Mamba2 (8 heads of 16 channels, state 16, one group: transformers'
    gated norm then matches vLLM's) saved at path, its weights rounded to bfloat16 (the dtype
    vLLM serves it in) so that transformers' float32 model computes on the same weights."""
    config = transformers.Mamba2Config(vocab_size=64, hidden_size=64, state_size=16,
                                       num_hidden_layers=2, expand=2, conv_kernel=4,
                                       n_groups=1, head_dim=16, num_heads=8, chunk_size=16,
                                       tie_word_embeddings=False)
    return _saved_with_bf16_weights(transformers.Mamba2ForCausalLM, config, path)


def test_mamba2_model_on_linseq_agrees_with_vllms_kernels_and_transformers(
        offline_vllm, tmp_path, monkeypatch):
    """One engine serving a tiny Mamba2, its Mamba2 layer routed to linseq, then on vLLM's
    own kernels. Prompts of 1 to 40 tokens under a 16-token step budget: long prompts are
    prefilled over several steps (resuming from their slots) while short ones decode.
    linseq's tokens and log-probabilities agree with vLLM's kernels' and transformers'
    float32 model's of the same weights (_assert_agree_with_transformers)."""
    model = _tiny_mamba2_model(tmp_path)
    runs = _serve_each_side(tmp_path, monkeypatch, {"linseq": ("mamba2",), "vllm": None},
                            ("ssd", "causal_conv1d"))
    _assert_agree_with_transformers(model, runs)


def test_mamba2_bad_shapes_are_refused_by_name_and_leave_the_pool():
    """A decode step whose B does not match the pool's dstate, and a prefill whose
    initial_states do not match its prompts: a ValueError naming the argument and the
    expected shape, the pool and out as they were."""
    g = torch.Generator().manual_seed(16)
    args = _mamba2_decode_args(g, 2, torch.float32, True)
    args["B"] = args["B"][..., :-1]
    pool = torch.randn(3, M2_HEADS, M2_HEAD_DIM, M2_DSTATE, generator=g)
    before, out = pool.clone(), torch.zeros(2, M2_HEADS, M2_HEAD_DIM)
    slots = torch.tensor([[2], [1]], dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"B, C: expected \[slots, {M2_HEADS}, {M2_HEAD_DIM}"):
        linseq_vllm._ssd_state_update(pool, state_batch_indices=slots, out=out, **args)
    assert torch.equal(pool, before) and torch.all(out == 0)
    x, dt, B, C, _ = _ssd_tokens(9, g, torch.float32)
    A, D, dt_bias = _ssd_params(g)
    out = torch.zeros(x.shape)
    with pytest.raises(ValueError, match=r"initial_states: expected \[2, "):
        linseq_vllm._ssd_chunk_scan(x, dt, A, B, C, 16, torch.tensor([0, 4, 9]), None, None,
                                    torch.zeros(1), out, D=D, dt_bias=dt_bias,
                                    initial_states=torch.zeros(3, M2_HEADS, M2_HEAD_DIM,
                                                               M2_DSTATE),
                                    dt_softplus=True)
    assert torch.all(out == 0)
