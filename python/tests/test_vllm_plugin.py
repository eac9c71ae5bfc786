"""linseq's vLLM plugin serves Mamba and FalconMamba in vLLM's CPU build, and the tokens vLLM
generates equal transformers' float32 greedy tokens of the same weights (an independent
reference: transformers' own PyTorch scan, no linseq in it).

Skipped unless vLLM and transformers import (vLLM's CPU build lives in its own environment,
made by scripts/vllm-venv.sh; `make test` does not run this file). Run it there:
    <vllm venv>/bin/python -m pytest python/tests/test_vllm_plugin.py
with PYTHONPATH=python and LINSEQ_LIBRARY naming the built library. vLLM finds the plugin as
an installed linseq would offer it: through the `vllm.general_plugins` entry point that
pyproject.toml declares, put on sys.path here as a distribution's metadata.
"""

import gc
import importlib
import os
import sys

import pytest

vllm = pytest.importorskip("vllm")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
tomllib = pytest.importorskip("tomllib")

from conftest import ROOT  # noqa: E402

import linseq.integrations.vllm as linseq_vllm  # noqa: E402

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
    yield
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
