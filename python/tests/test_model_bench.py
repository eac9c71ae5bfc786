"""tools/model_bench.py's plumbing on toy models: under both routes its timers see every
kernel call of every linear layer (a missed call would show up as a smaller kernel share,
not as an error), the shares are fractions of the step, and the greedy tokens of linseq's
route equal those of transformers' PyTorch fallback.
"""

import importlib.util
import os

from conftest import ROOT, require

torch = require("torch")
transformers = require("transformers")


def load_tool():
    spec = importlib.util.spec_from_file_location(
        "model_bench", os.path.join(ROOT, "tools", "model_bench.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


# model -> (kernel function of a prefill, of a decode step) besides the conv's (LFM2: none)
SEQUENCE_KERNEL = {"kimi": ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"),
                   "qwen3next": ("torch_chunk_gated_delta_rule",
                                 "torch_recurrent_gated_delta_rule"),
                   "mamba": ("mamba_selective_scan", "mamba_selective_state_update"),
                   "lfm2": ("causal_conv1d_fn", "causal_conv1d_update")}


def linear_layers(tool, name):
    _, config = tool.model_config(name, quick=True)
    types = getattr(config, "layer_types", None)
    if types is None:
        return config.num_hidden_layers
    return types.count("conv" if config.model_type == "lfm2" else "linear_attention")


def test_quick_run_times_every_kernel_call_and_agrees_on_tokens(capsys):
    tool = load_tool()
    threads = torch.get_num_threads()
    try:
        meta, results = tool.main(["--quick", "--prefill", "24", "--decode-batch", "2",
                                   "--decode-steps", "3", "--repeats", "1", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert [r["model"] for r in results] == list(tool.MODEL_NAMES)
    for res in results:
        layers = linear_layers(tool, res["model"])
        prefill_fn, step_fn = SEQUENCE_KERNEL[res["model"]]
        prefill, decode = res["rows"]
        for kind in tool.ROUTES_ORDER:
            assert prefill[kind]["calls_per_step"][prefill_fn] == layers, (res["model"], kind)
            assert prefill[kind]["calls_per_step"]["causal_conv1d_fn"] == layers
            assert decode[kind]["calls_per_step"][step_fn] == layers, (res["model"], kind)
            assert decode[kind]["calls_per_step"]["causal_conv1d_update"] == layers
            for row in (prefill, decode):
                assert 0 < row[kind]["kernel_share"] < 1
        assert decode["same_tokens"], res["model"]
    assert "| Mamba | prefill T=24 |" in capsys.readouterr().out
