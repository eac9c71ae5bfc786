#!/usr/bin/env python3
"""Whole models on linseq against transformers' own PyTorch fallback: prefill and decode
tokens/s of KimiLinearForCausalLM (KDA), Qwen3NextForCausalLM (Gated DeltaNet),
MambaForCausalLM (Mamba1 scan) and Lfm2ForCausalLM (gated short conv), and the share of each
step spent inside the kernel functions.

Both routes run in one process with the same threads: `linseq.integrations.transformers`'s
`routing("linseq")` and `routing("torch")` (transformers' PyTorch fallback, the reference even
where fla-core is installed) alternate repeat by repeat, and every figure is a median. Each
function the routing module lists in its ROUTES is wrapped with a timer while a step runs, so
the table gives the kernels' share of a step, the speedup of each kernel call, and the Amdahl
bound of the model's speedup, 1 / (1 - f), f being the fallback's kernel share (the speedup if
the kernels took no time at all).

Random weights, float32, fixed seeds. Prefill is one forward of B=1, T tokens that fills the
cache and keeps the last logits only; decode is one token per sequence per step after a short
prompt, B sequences at once (tokens/s = B / step time). The greedy tokens of the decode runs
are compared between the routes.

    python3 tools/model_bench.py [--quick] [--models kimi,qwen3next,mamba,lfm2]
        [--prefill 512,4096]
        [--decode-batch 1,16] [--decode-steps 16] [--repeats 3] [--threads N] [--contend N]
        [--save-json FILE] [--from-json FILE...] [--plot FILE]

--contend N also times decode beside N busy processes (spinning Python loops, as
`linseq bench --contend` starts); --quick runs tiny models in seconds (the plumbing only).
Prints Markdown tables; --plot writes a PNG (needs matplotlib). Needs torch and transformers.
What a run needs is imported before anything is timed: a missing package ends it at once.

Run time: over 10 minutes per model on a 2-core machine at the default sizes (prefill 512
and 4096, decode batches 1 and 16, 3 repeats, both routes; transformers' fallback is the
slow part), more with --contend; docs/performance.md runs one model per process.
"""
import argparse
import contextlib
import importlib
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time

# kernel function (transformers' name) -> what the tables call it
KERNEL_LABELS = {
    "chunk_kimi_delta_attention": "KDA chunk",
    "recurrent_kimi_delta_attention": "KDA step",
    "torch_chunk_gated_delta_rule": "GDN chunk",
    "torch_recurrent_gated_delta_rule": "GDN step",
    "mamba_selective_scan": "Mamba scan",
    "mamba_selective_state_update": "Mamba step",
    "causal_conv1d_fn": "conv",
    "causal_conv1d_update": "conv step",
}
# the per-call targets: linseq at least this many times faster than the fallback
CALL_TARGETS = {"KDA chunk": 50.0, "GDN chunk": 8.0, "Mamba scan": 30.0}
PREFILL_SHARE_TARGET = 0.05   # linseq's kernels at most 5% of a prefill step
ROUTES_ORDER = ("linseq", "torch")
MODEL_NAMES = ("kimi", "qwen3next", "mamba", "lfm2")
TITLES = {"kimi": "Kimi Linear (KDA)", "qwen3next": "Qwen3-Next (Gated DeltaNet)",
          "mamba": "Mamba", "lfm2": "LFM2 (short conv)"}


# ------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------

def hybrid_layers(n):
    """Three linear-attention layers to one full-attention layer, both models' pattern."""
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]


def model_config(name, quick):
    """(model class, config) at the benchmark's size: hidden 1024, dense MLPs 2816 wide,
    vocabulary 32000; the linear layers' heads are K = V = 128 wide, their value width twice
    the hidden size as in the released models (--quick: a toy of each)."""
    import transformers as tf

    hidden, inner, vocab = (64, 128, 256) if quick else (1024, 2816, 32000)
    heads, head_dim = (2, 32) if quick else (16, 128)
    if name == "kimi":
        layers = 4 if quick else 8
        return tf.KimiLinearForCausalLM, tf.KimiLinearConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=inner,
            num_hidden_layers=layers, num_attention_heads=max(2, heads // 2),
            num_key_value_heads=max(2, heads // 2), kv_lora_rank=head_dim * 4, q_lora_rank=None,
            qk_rope_head_dim=head_dim // 2, qk_nope_head_dim=head_dim, v_head_dim=head_dim,
            linear_num_heads=heads, linear_head_dim=head_dim,
            layer_types=hybrid_layers(layers), mlp_layer_types=["dense"] * layers,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if name == "qwen3next":
        layers = 4 if quick else 8
        return tf.Qwen3NextForCausalLM, tf.Qwen3NextConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=inner,
            num_hidden_layers=layers, num_attention_heads=max(2, heads // 2), num_key_value_heads=2,
            head_dim=head_dim, linear_num_key_heads=heads // 2, linear_num_value_heads=heads,
            linear_key_head_dim=head_dim, linear_value_head_dim=head_dim,
            layer_types=hybrid_layers(layers), mlp_only_layers=list(range(layers)),
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if name == "mamba":
        return tf.MambaForCausalLM, tf.MambaConfig(
            vocab_size=vocab, hidden_size=hidden, state_size=16, expand=2, conv_kernel=4,
            num_hidden_layers=2 if quick else 16, use_mambapy=False,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if name == "lfm2":
        # conv layers (in_proj -> B, C, x; C * conv3(B * x)) with attention at every third
        return tf.Lfm2ForCausalLM, tf.Lfm2Config(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=inner,
            block_auto_adjust_ff_dim=False, num_hidden_layers=4 if quick else 16,
            num_attention_heads=max(2, heads), num_key_value_heads=max(2, heads // 2),
            layer_types=["full_attention" if i % 3 == 2 else "conv"
                         for i in range(4 if quick else 16)],
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
    raise SystemExit(f"model_bench: unknown model {name!r} (expected one of {MODEL_NAMES})")


def build_model(name, quick):
    import torch

    cls, config = model_config(name, quick)
    torch.manual_seed(0)
    model = cls(config).to(torch.float32).eval()
    n_params = sum(p.numel() for p in model.parameters())
    return model, config, n_params


def describe(name, config, n_params):
    if name == "mamba":
        shape = (f"hidden {config.hidden_size}, {config.num_hidden_layers} Mamba layers "
                 f"(d_inner {config.intermediate_size}, N {config.state_size})")
    elif name == "lfm2":
        n_conv = config.layer_types.count("conv")
        shape = (f"hidden {config.hidden_size}, {config.num_hidden_layers} layers ({n_conv} "
                 f"gated short conv of width {config.conv_L_cache}, "
                 f"{config.num_hidden_layers - n_conv} full attention), "
                 f"dense MLP {config.intermediate_size}")
    else:
        n_full = config.layer_types.count("full_attention")
        heads = (f"{config.linear_num_heads} heads" if name == "kimi" else
                 f"{config.linear_num_key_heads} key and {config.linear_num_value_heads} "
                 f"value heads")
        width = config.linear_head_dim if name == "kimi" else config.linear_key_head_dim
        shape = (f"hidden {config.hidden_size}, {config.num_hidden_layers} layers "
                 f"({config.num_hidden_layers - n_full} linear with {heads} of {width}, "
                 f"{n_full} full attention), dense MLP {config.intermediate_size}")
    return f"{shape}, vocab {config.vocab_size}, {n_params / 1e6:.0f} M parameters"


# ------------------------------------------------------------------------------------------
# Timing the kernel functions
# ------------------------------------------------------------------------------------------

def routing_module():
    return importlib.import_module("linseq.integrations.transformers")


def module_of(key):
    return importlib.import_module(key) if isinstance(key, str) else key


class KernelClock:
    """Wraps every routed function of the model modules with a timer while a route is
    active; calls[name] is the list of (seconds) of each call since the last reset."""

    def __init__(self, routes):
        self.routes = routes
        self.calls = {}

    def reset(self):
        self.calls = {}

    def total(self):
        return sum(sum(v) for v in self.calls.values())

    def _timed(self, name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.calls.setdefault(name, []).append(time.perf_counter() - start)
        timed.__wrapped__ = fn
        return timed

    @contextlib.contextmanager
    def installed(self):
        """Wrap what the route bound (inside routing(kind)); put it back on exit."""
        saved = []
        try:
            for key, functions in self.routes.items():
                module = module_of(key)
                for name in functions:
                    current = getattr(module, name, None)
                    if current is None:
                        continue
                    saved.append((module, name, current))
                    setattr(module, name, self._timed(name, current))
            yield self
        finally:
            for module, name, current in reversed(saved):
                setattr(module, name, current)


@contextlib.contextmanager
def route(kind, clock):
    with routing_module().routing(kind), clock.installed():
        yield


# ------------------------------------------------------------------------------------------
# Busy processes
# ------------------------------------------------------------------------------------------

@contextlib.contextmanager
def busy_processes(n):
    """n processes spinning beside the timing; stopped (by their own handles) on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.2 if n else 0)
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


# ------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------

def tokens(config, batch, length, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, config.vocab_size, (batch, length), generator=g)


def prefill_once(model, ids):
    import torch

    with torch.inference_mode():
        start = time.perf_counter()
        model(input_ids=ids, use_cache=True, logits_to_keep=1)
        return time.perf_counter() - start


def decode_run(model, ids, steps, clock, samples=None):
    """Prompt ids [B, P], then `steps` greedy steps of one token, each timed into samples;
    returns the greedy tokens."""
    import torch

    # Mamba names its cache `cache`, the attention hybrids `past_key_values`
    cache_name = ("past_key_values" if "past_key_values" in
                  inspect.signature(model.forward).parameters else "cache")
    generated = []
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        cache = out[cache_name]
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(steps):
            generated.append(nxt)
            clock.reset()
            start = time.perf_counter()
            out = model(input_ids=nxt, use_cache=True, logits_to_keep=1, **{cache_name: cache})
            seconds = time.perf_counter() - start
            if samples is not None:
                samples.add(seconds, clock.total(), clock.calls)
            cache = out[cache_name]
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    return torch.cat(generated, dim=1).tolist()


class Samples:
    """One route's timed steps: step seconds, kernel seconds, and every kernel call."""

    def __init__(self):
        self.steps, self.kernel, self.calls = [], [], {}

    def add(self, step_s, kernel_s, calls):
        self.steps.append(step_s)
        self.kernel.append(kernel_s)
        for name, v in calls.items():
            self.calls.setdefault(name, []).extend(v)

    def summary(self):
        return {"step_s": statistics.median(self.steps), "steps_s": self.steps,
                "kernel_share": statistics.median(k / s for s, k in zip(self.steps,
                                                                        self.kernel)),
                "call_s": {n: statistics.median(v) for n, v in self.calls.items() if v},
                "calls_per_step": {n: round(len(v) / len(self.steps))
                                   for n, v in self.calls.items()}}


def measure_prefill(model, config, length, repeats, clock):
    ids = tokens(config, 1, length, seed=length)
    samples = {k: Samples() for k in ROUTES_ORDER}
    for rep in range(repeats):
        order = ROUTES_ORDER if rep % 2 == 0 else ROUTES_ORDER[::-1]
        for kind in order:
            with route(kind, clock):
                clock.reset()
                seconds = prefill_once(model, ids)
                samples[kind].add(seconds, clock.total(), clock.calls)
    row = {"phase": "prefill", "batch": 1, "T": length, "load": os.getloadavg()[0]}
    row.update({kind: samples[kind].summary() for kind in ROUTES_ORDER})
    return row


def measure_decode(model, config, batch, prompt, steps, repeats, clock, contend):
    ids = tokens(config, batch, prompt, seed=batch)
    samples = {k: Samples() for k in ROUTES_ORDER}
    greedy = {}
    with busy_processes(contend):
        load = os.getloadavg()[0]
        for rep in range(repeats):
            order = ROUTES_ORDER if rep % 2 == 0 else ROUTES_ORDER[::-1]
            for kind in order:
                with route(kind, clock):
                    greedy[kind] = decode_run(model, ids, steps, clock, samples[kind])
    row = {"phase": "decode", "batch": batch, "T": 1, "contend": contend, "load": load,
           "steps": steps, "prompt": prompt,
           "same_tokens": greedy["linseq"] == greedy["torch"]}
    row.update({kind: samples[kind].summary() for kind in ROUTES_ORDER})
    return row


def warm_up(model, config, clock):
    """One short prefill and decode per route: first-call costs out of the timing."""
    ids = tokens(config, 1, 64, seed=7)
    for kind in ROUTES_ORDER:
        with route(kind, clock):
            prefill_once(model, ids)
            decode_run(model, ids[:, :8], 2, clock)


def bench_model(name, args, checkpoint):
    """Times one model; checkpoint(result) after each row, so a long run that is stopped
    keeps what it measured."""
    model, config, n_params = build_model(name, args.quick)
    clock = KernelClock(routing_module().ROUTES)
    warm_up(model, config, clock)
    result = {"model": name, "description": describe(name, config, n_params), "rows": []}

    def done(row):
        result["rows"].append(row)
        print_progress(name, row)
        checkpoint(result)

    for length in args.prefill:
        done(measure_prefill(model, config, length, args.repeats, clock))
    for contend in sorted({0, args.contend}):
        for batch in args.decode_batch:
            done(measure_decode(model, config, batch, args.prompt, args.decode_steps,
                                args.repeats, clock, contend))
    return result


def print_progress(name, row):
    t = row["torch"]["step_s"]
    ls = row["linseq"]["step_s"]
    print(f"# {name} {case_label(row)}: fallback {t * 1e3:.1f} ms, linseq {ls * 1e3:.1f} ms, "
          f"{t / ls:.2f}x (load {row['load']:.1f})", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# Tables
# ------------------------------------------------------------------------------------------

def case_label(row):
    if row["phase"] == "prefill":
        return f"prefill T={row['T']}"
    busy = f", {row['contend']} busy" if row.get("contend") else ""
    return f"decode B={row['batch']}{busy}"


def tokens_per_s(row, kind):
    return row["batch"] * row["T"] / row[kind]["step_s"]


def amdahl_bound(row):
    return 1.0 / (1.0 - row["torch"]["kernel_share"])


def fmt_rate(x):
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def model_table(results):
    lines = ["| model | case | fallback tokens/s | linseq tokens/s | speedup | "
             "kernel share fallback | kernel share linseq | Amdahl bound | speedup / bound | "
             "load |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for res in results:
        for row in res["rows"]:
            speedup = row["torch"]["step_s"] / row["linseq"]["step_s"]
            bound = amdahl_bound(row)
            lines.append(
                f"| {TITLES[res['model']]} | {case_label(row)} | "
                f"{fmt_rate(tokens_per_s(row, 'torch'))} | "
                f"{fmt_rate(tokens_per_s(row, 'linseq'))} | {speedup:.2f}x | "
                f"{row['torch']['kernel_share']:.1%} | {row['linseq']['kernel_share']:.1%} | "
                f"{bound:.2f}x | {speedup / bound:.0%} | {row['load']:.1f} |")
    return "\n".join(lines)


def call_table(results):
    """Per kernel function and case: median time of one call under each route."""
    lines = ["| model | case | kernel | calls/step | fallback per call | linseq per call | "
             "speedup | target |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for res in results:
        for row in res["rows"]:
            if row.get("contend"):
                continue
            for name, t in sorted(row["torch"]["call_s"].items()):
                ls = row["linseq"]["call_s"].get(name)
                if ls is None:
                    continue
                label = KERNEL_LABELS.get(name, name)
                target = CALL_TARGETS.get(label) if row["phase"] == "prefill" else None
                verdict = "" if target is None else (
                    f">= {target:.0f}x: " + ("met" if t / ls >= target else "missed"))
                lines.append(
                    f"| {TITLES[res['model']]} | {case_label(row)} | {label} | "
                    f"{row['torch']['calls_per_step'].get(name, 0)} | {fmt_time(t)} | "
                    f"{fmt_time(ls)} | {t / ls:.1f}x | {verdict} |")
    return "\n".join(lines)


def fmt_time(s):
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


def verdicts(results):
    """The issue's targets, one line each."""
    out = []
    for res in results:
        title = TITLES[res["model"]]
        for row in res["rows"]:
            share = row["linseq"]["kernel_share"]
            if row["phase"] == "prefill":
                ok = share <= PREFILL_SHARE_TARGET
                out.append(f"- {title}, {case_label(row)}: linseq's kernels {share:.1%} of the "
                           f"step (target <= 5%): {'met' if ok else 'missed'}")
            else:
                ratio = row["linseq"]["step_s"] / row["torch"]["step_s"]
                out.append(f"- {title}, {case_label(row)}: linseq step / fallback step "
                           f"{ratio:.2f} (target <= 1): {'met' if ratio <= 1 else 'missed'}; "
                           f"greedy tokens {'equal' if row['same_tokens'] else 'DIFFER'}")
    return "\n".join(out)


def header(meta):
    threads = f"{meta['threads']} thread" + ("s" if meta["threads"] != 1 else "")
    return (f"Measured {meta['date']} on {meta['cpu']}, {threads} (torch and "
            f"linseq), torch {meta['torch']}, transformers {meta['transformers']}; "
            f"{meta['repeats']} alternating repeats per route, medians; load average "
            f"{meta['load_before']:.1f} before, {meta['load_after']:.1f} after.")


def report(meta, results):
    parts = [header(meta), ""]
    for res in results:
        parts.append(f"- {TITLES[res['model']]}: {res['description']}")
    parts += ["", model_table(results), "", call_table(results), "", verdicts(results)]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------
# Plot
# ------------------------------------------------------------------------------------------

def plot(results, out, meta):
    """Per model and case: the measured speedup (bar) and its Amdahl bound (marker)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    labels, speedups, bounds, colours = [], [], [], []
    palette = {"kimi": "tab:blue", "qwen3next": "tab:orange", "mamba": "tab:green",
               "lfm2": "tab:purple"}
    for res in results:
        for row in res["rows"]:
            if row.get("contend"):
                continue
            labels.append(f"{res['model']}\n{case_label(row).replace(' ', chr(10), 1)}")
            speedups.append(row["torch"]["step_s"] / row["linseq"]["step_s"])
            bounds.append(amdahl_bound(row))
            colours.append(palette.get(res["model"], "tab:gray"))
    fig, ax = plt.subplots(figsize=(max(7.5, 0.75 * len(labels)), 4.5))
    xs = list(range(len(labels)))
    ax.bar(xs, speedups, color=colours, label="measured speedup (linseq / fallback)")
    ax.plot(xs, bounds, "k_", markersize=22, markeredgewidth=2,
            label="Amdahl bound 1 / (1 - fallback kernel share)")
    for x, s in zip(xs, speedups):
        ax.annotate(f"{s:.1f}x", (x, s), ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}x"))
    ax.set_ylabel("model step speedup over transformers' PyTorch fallback")
    ax.set_title(f"Whole models on linseq, float32, random weights\n"
                 f"{meta['threads']} thread{'s' if meta['threads'] != 1 else ''}, "
                 f"{meta['cpu']}, medians")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


# ------------------------------------------------------------------------------------------

def csv_ints(text):
    return [int(x) for x in text.split(",") if x]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny models, seconds: the plumbing")
    p.add_argument("--models", default=",".join(MODEL_NAMES))
    p.add_argument("--prefill", type=csv_ints, default=None, help="prefill lengths T")
    p.add_argument("--decode-batch", type=csv_ints, default=None)
    p.add_argument("--decode-steps", type=int, default=None)
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens before decode")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--contend", type=int, default=0,
                   help="also time decode beside N busy processes")
    p.add_argument("--save-json", help="write the results here")
    p.add_argument("--from-json", nargs="+", metavar="FILE",
                   help="tables and plot from saved results (of one or more runs), no timing")
    p.add_argument("--plot", help="write the speedup plot (PNG) here")
    args = p.parse_args(argv)
    quick = args.quick
    args.prefill = args.prefill or ([64] if quick else [512, 4096])
    args.decode_batch = args.decode_batch or ([1, 2] if quick else [1, 16])
    args.decode_steps = args.decode_steps or (4 if quick else 16)
    args.repeats = args.repeats or (1 if quick else 3)
    args.models = [m for m in args.models.split(",") if m]
    return args


def save(path, meta, results):
    if path:
        with open(path, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


def run(args):
    import torch
    import transformers

    import linseq

    torch.set_num_threads(args.threads)
    linseq.set_num_threads(args.threads)
    meta = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "threads": args.threads,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "repeats": args.repeats, "load_before": os.getloadavg()[0],
            "argv": sys.argv[1:]}
    results = []

    def checkpoint(result):
        meta["load_after"] = os.getloadavg()[0]
        save(args.save_json, meta, results + [result])

    for name in args.models:
        results.append(bench_model(name, args, checkpoint))
    meta["load_after"] = os.getloadavg()[0]
    return meta, results


def require(modules):
    """Imports every module the run will need before anything is timed, so that a missing
    one (matplotlib for --plot, say) ends the tool at once, naming it, not after the
    benchmarks."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            sys.exit(f"model_bench: needs {name} ({e}); nothing was run")


def main(argv=None):
    args = parse_args(argv)
    require((["matplotlib"] if args.plot else []) + ([] if args.from_json else [
        "torch", "transformers", "linseq", "linseq.integrations.transformers"]))
    if args.from_json:   # several runs (one per model, say) make one table
        saved = []
        for path in args.from_json:
            with open(path) as f:
                saved.append(json.load(f))
        meta = dict(saved[0]["meta"], load_after=saved[-1]["meta"]["load_after"])
        results = [res for run_ in saved for res in run_["results"]]
    else:
        meta, results = run(args)
    save(args.save_json, meta, results)
    print(report(meta, results))
    if args.plot:
        plot(results, args.plot, meta)
    return meta, results


if __name__ == "__main__":
    main()
