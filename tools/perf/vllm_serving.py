#!/usr/bin/env python3
"""Small random models served offline by vLLM's CPU build, with its own kernels and with
linseq's plugin, alternating in one run: time to first token and decode tokens per second.

Models (random weights, saved in a temporary folder): a Qwen3.5-like and a Qwen3-Next-like
model (Gated DeltaNet layers and one full-attention layer, bfloat16: vLLM's CPU GDN layer
runs in bfloat16 only), qwen3_5_wide (the Qwen3.5-like model with the GDN layer of the
released Qwen3-Next and Qwen3.5 models: 16 key and 32 value heads of 128, so that the GDN
layers take the share of a decode step they take there, rather than a small model's), and
a Mamba2 (bfloat16, as such models are served), served by vLLM's
kernels and by linseq's; Mamba and FalconMamba (float32), served by linseq only, since
vLLM's CPU build cannot run them alone (see linseq/integrations/vllm.py).

One engine per model; its ops are switched between the sides with linseq's enable() and
disable() (the plugin rebinds the names vLLM's layers call at call time), so both sides run
in the same engine, caches and threads. Each round runs, per side (the first side
alternating from round to round): one prompt of --prompt tokens with 1 new token (TTFT: its
engine steps, a whole prefill), then --batch prompts of 16 tokens with 1 + --new tokens
(decode tokens per second: the batch over the median time of the engine steps after the
prefill; the engine runs in this process, each step synchronously). The table
gives the medians over the rounds and the range of the per-round ratios, with the load
average and the command line. The VM's speed drifts, so only the ratios of one run mean
much. Not run by make or CI; about 5 minutes at the defaults.

Run it in the environment scripts/vllm-venv.sh makes, with linseq from this tree:
    make -j2 lib
    PYTHONPATH=python LINSEQ_LIBRARY=build/liblinseq.so \\
        "$(sh scripts/vllm-venv.sh)/bin/python" tools/perf/vllm_serving.py \\
        [--threads 1] [--rounds 5] [--models qwen3_5,qwen3_next,mamba2,mamba,falcon_mamba] \\
        [--write docs/performance.md]

Threads: both sides get --threads. vLLM's ops run on torch's intra-op (OpenMP) threads,
which are set here before vLLM starts: vLLM's in-process engine does not lower them itself
(its CPU worker replaces torch.set_num_threads with a no-op before it would set 1), so
without this vLLM's GDN ops ran on every CPU against linseq's one thread, and their OpenMP
workers spun between regions beside the step's serial code. The engine's own count is read
back and checked (serving_threads), and the table's header states it. linseq's pool gets
the same count; VLLM_CPU_OMP_THREADS_BIND names the CPUs for vLLM releases that bind.
"""
import argparse
import datetime
import gc
import os
import shlex
import statistics
import sys
import tempfile
import time

SIDES = ("vllm", "linseq")
GDN_MODELS = ("qwen3_5", "qwen3_next", "qwen3_5_wide")
BOTH_SIDES = GDN_MODELS + ("mamba2",)   # the models vLLM's CPU build runs alone, in bfloat16


def model_config(kind):
    """transformers' config and model class of a small random model of each kind: hidden
    256, 4 layers (the GDN models: 3 GDN layers, 8 value heads of 128, and 1 attention
    layer; qwen3_5_wide 16 key and 32 value heads of 128; Mamba2: 8 heads of 64 channels,
    state 128, one group), vocabulary 256."""
    import transformers
    if kind == "mamba2":
        return (transformers.Mamba2Config(vocab_size=256, hidden_size=256, state_size=128,
                                          num_hidden_layers=4, expand=2, conv_kernel=4,
                                          n_groups=1, head_dim=64, num_heads=8,
                                          chunk_size=256, tie_word_embeddings=False),
                transformers.Mamba2ForCausalLM)
    if kind in ("mamba", "falcon_mamba"):
        config_class, model_class = {
            "mamba": (transformers.MambaConfig, transformers.MambaForCausalLM),
            "falcon_mamba": (transformers.FalconMambaConfig,
                             transformers.FalconMambaForCausalLM)}[kind]
        return config_class(vocab_size=256, hidden_size=256, state_size=16,
                            num_hidden_layers=4, expand=2, conv_kernel=4, time_step_rank=16,
                            tie_word_embeddings=False), model_class
    sizes = dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                 linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=128,
                 linear_value_head_dim=128, tie_word_embeddings=False,
                 layer_types=["linear_attention"] * 3 + ["full_attention"],
                 max_position_embeddings=4096)
    if kind == "qwen3_5_wide":
        sizes.update(linear_num_key_heads=16, linear_num_value_heads=32)
    if kind == "qwen3_next":
        return (transformers.Qwen3NextConfig(num_experts=4, num_experts_per_tok=2,
                                             moe_intermediate_size=128,
                                             shared_expert_intermediate_size=128, **sizes),
                transformers.Qwen3NextForCausalLM)
    return transformers.Qwen3_5TextConfig(**sizes), transformers.Qwen3_5ForCausalLM


def save_model(kind, path):
    import torch
    config, model_class = model_config(kind)
    torch.manual_seed(0)
    model_class(config).save_pretrained(path)


class Engine:
    """One offline vLLM engine over a saved model, and the timed requests."""

    def __init__(self, kind, path, args):
        import vllm
        self.vllm = vllm
        self.args = args
        self.llm = vllm.LLM(model=path, skip_tokenizer_init=True, enforce_eager=True,
                            dtype="bfloat16" if kind in BOTH_SIDES else "float32",
                            max_model_len=args.prompt + 64,
                            max_num_batched_tokens=max(args.prompt, 2048), seed=0,
                            enable_prefix_caching=False)
        serving_threads(args.threads)   # as vLLM's start-up left them
        self.requests = 0
        self.long = [[(7 * i + 3) % 256 for i in range(args.prompt)]]
        self.short = [[(11 * i + 5 * b) % 256 for i in range(16)] for b in range(args.batch)]

    def step_seconds(self, prompts, new_tokens):
        """The prompts as requests of new_tokens tokens each; the time of each engine step
        until all are done (the engine runs in this process, each step synchronously)."""
        engine = self.llm.llm_engine
        params = self.vllm.SamplingParams(max_tokens=new_tokens, temperature=0.0,
                                          ignore_eos=True)
        for p in prompts:
            self.requests += 1
            engine.add_request(f"timed-{self.requests}", {"prompt_token_ids": p}, params)
        seconds = []
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            engine.step()
            seconds.append(time.perf_counter() - start)
        return seconds

    def measure(self):
        """(TTFT in seconds: the steps until the long prompt's first token, decode tokens
        per second: the batch over the median decode step, the steps after the batch's
        prefill)."""
        ttft = sum(self.step_seconds(self.long, 1))
        decode_steps = self.step_seconds(self.short, 1 + self.args.new)[1:]
        return ttft, self.args.batch / statistics.median(decode_steps)


def serving_environment(threads):
    """The in-process engine on `threads` threads: torch's intra-op count set before vLLM
    starts (it then makes torch.set_num_threads a no-op), by call as well as by
    OMP_NUM_THREADS, which an OpenMP already loaded (vLLM puts torch's libgomp in LD_PRELOAD
    for the processes it starts) has read before this runs."""
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1",
                      VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}",
                      OMP_NUM_THREADS=str(threads))
    import torch
    torch.set_num_threads(threads)


def serving_threads(threads):
    """torch's intra-op thread count in this process, which vLLM's ops run on, refused
    unless it is the --threads linseq gets (an unequal count would be compared)."""
    import torch
    if torch.get_num_threads() != threads:
        raise RuntimeError(f"vLLM's ops would run on {torch.get_num_threads()} threads against "
                           f"linseq's {threads}")
    return threads


def switch(side):
    import linseq.integrations.vllm as linseq_vllm
    if side == "linseq":
        assert linseq_vllm.enable("all"), "linseq's plugin routed nothing"
    else:
        linseq_vllm.disable()


def run_model(kind, args, folder):
    """{side: [(ttft, tokens/s) per round]} of one model."""
    path = os.path.join(folder, kind)
    save_model(kind, path)
    sides = SIDES if kind in BOTH_SIDES else ("linseq",)
    switch("linseq")
    engine = Engine(kind, path, args)
    for side in sides:   # warm-up: the first requests of an engine pay one-off costs
        switch(side)
        engine.measure()
    results = {side: [] for side in sides}
    for r in range(args.rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            switch(side)
            results[side].append(engine.measure())
        print(f"{kind} round {r + 1}: " + ", ".join(
            f"{s} TTFT {results[s][-1][0] * 1e3:.1f} ms, {results[s][-1][1]:.0f} tok/s"
            for s in sides), file=sys.stderr)
    switch("linseq")
    del engine
    gc.collect()
    return results


def cell(values, fmt):
    return fmt(statistics.median(values))


def ratio_cell(a, b):
    """median(a) / median(b) and the range of the per-round ratios."""
    per_round = [x / y for x, y in zip(a, b)]
    return (f"{statistics.median(a) / statistics.median(b):.2f}x "
            f"({min(per_round):.2f}x-{max(per_round):.2f}x)")


def table(all_results):
    """Medians, and best / best: each side's best round (the one other work disturbed
    least), compared."""
    rows = ["| model | TTFT vLLM | TTFT linseq | vLLM / linseq | best / best | "
            "decode tok/s vLLM | decode tok/s linseq | linseq / vLLM | best / best |",
            "|---|---|---|---|---|---|---|---|---|"]
    for kind, results in all_results.items():
        ttft = {s: [m[0] * 1e3 for m in v] for s, v in results.items()}
        tps = {s: [m[1] for m in v] for s, v in results.items()}
        ms, per_s = (lambda v: f"{v:.1f} ms"), (lambda v: f"{v:.0f}")
        if "vllm" in results:
            rows.append(f"| {kind} | {cell(ttft['vllm'], ms)} | {cell(ttft['linseq'], ms)} | "
                        f"{ratio_cell(ttft['vllm'], ttft['linseq'])} | "
                        f"{min(ttft['vllm']) / min(ttft['linseq']):.2f}x | "
                        f"{cell(tps['vllm'], per_s)} | {cell(tps['linseq'], per_s)} | "
                        f"{ratio_cell(tps['linseq'], tps['vllm'])} | "
                        f"{max(tps['linseq']) / max(tps['vllm']):.2f}x |")
        else:
            rows.append(f"| {kind} | cannot run | {cell(ttft['linseq'], ms)} | - | - | "
                        f"cannot run | {cell(tps['linseq'], per_s)} | - | - |")
    return "\n".join(rows) + "\n"


def header(args, load_before):
    import torch
    import vllm

    import linseq
    from suite_table import cpu_model
    return (f"vLLM {vllm.__version__} (CPU build) on torch {torch.__version__}, linseq "
            f"{linseq.version()} ({linseq.isa()}), {datetime.date.today()}, {cpu_model()}; "
            f"{args.threads} thread(s) each side (vLLM's ops: torch's intra-op threads "
            f"{torch.get_num_threads()}); load average {load_before} before, "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} after. {args.rounds} "
            f"alternating round(s) after one warm-up a side. TTFT: one prompt of "
            f"{args.prompt} tokens, 1 new token; decode: {args.batch} prompts of 16 tokens, "
            f"{args.new} new tokens each, tokens/s by the median step. Medians over the rounds; ratios: the medians', "
            f"then the range of the per-round ratios; best / best: the ratio of each side's best "
            f"round (above 1: linseq faster).\n\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=1024, help="TTFT prompt length")
    parser.add_argument("--batch", type=int, default=8, help="decode requests")
    parser.add_argument("--new", type=int, default=32, help="decode tokens per request")
    parser.add_argument("--models", default="qwen3_5,qwen3_next,mamba2,mamba,falcon_mamba")
    parser.add_argument("--write", metavar="MARKDOWN",
                        help="put the table between the vllm-serving markers of this file")
    args = parser.parse_args()
    serving_environment(args.threads)
    import linseq
    linseq.set_num_threads(args.threads)
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory() as folder:
        results = {kind: run_model(kind, args, folder) for kind in args.models.split(",")}
    command = "PYTHONPATH=python LINSEQ_LIBRARY=build/liblinseq.so $VENV/bin/python " + \
        shlex.join(["tools/perf/vllm_serving.py", *sys.argv[1:]])
    text = header(args, load_before) + table(results) + f"\n`{command}`\n"
    print(text)
    if args.write:
        from doc_block import replace_block
        replace_block(args.write, "vllm-serving", text, "vllm_serving.py")


if __name__ == "__main__":
    main()
