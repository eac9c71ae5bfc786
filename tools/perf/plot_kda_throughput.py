#!/usr/bin/env python3
"""KDA forward throughput against sequence length, chunked and recurrent: a plot for
docs/performance.md.

Runs `linseq bench kda --json` at B=1, H=16, K=V=128 (per-channel decay) for T = 256 ..
16384, chunked with chunk 16, 32 and 64 (the default) and recurrent, and writes
docs/kda_throughput.png (tokens/s against T, log x axis).
Needs python3 and matplotlib (checked before any benchmark runs); not run by make or CI.
Takes about 6 minutes on a 2-core machine: 28 points, each run for about a second or at
least 10 calls (the recurrent ones at long T take longer).

    python3 tools/perf/plot_kda_throughput.py [--cli build/linseq] [--out docs/kda_throughput.png]
        [--threads N] [--repeats N] [--save-json FILE] [--from-json FILE]
"""
import argparse
import json
import os
import subprocess
import sys

T_VALUES = [256, 512, 1024, 2048, 4096, 8192, 16384]
# (label, bench options): the chunked forward at three chunk sizes, and the recurrent one
CONFIGS = [
    ("chunked, chunk 64 (default)", ["--mode", "chunked", "--chunk-size", "64"]),
    ("chunked, chunk 32", ["--mode", "chunked", "--chunk-size", "32"]),
    ("chunked, chunk 16", ["--mode", "chunked", "--chunk-size", "16"]),
    ("recurrent", ["--mode", "recurrent"]),
]
SHAPE = ["--B", "1", "--H", "16", "--K", "128", "--V", "128"]


def config_label(r):
    if r["mode"] == "recurrent":
        return "recurrent"
    c = r.get("chunk_size", 64)
    return f"chunked, chunk {c}" + (" (default)" if c == 64 else "")


def run_point(cli, options, t, extra):
    cmd = [cli, "bench", "kda", *SHAPE, "--T", str(t), *options, "--no-peak", "--json",
           *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"plot_kda_throughput: {' '.join(cmd)} failed ({proc.returncode}): "
                 f"{proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def pyplot():
    """matplotlib's pyplot (Agg backend), imported before anything runs: a missing matplotlib
    ends the script at once, not after minutes of benchmarks."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        sys.exit(f"plot_kda_throughput: needs matplotlib (pip install matplotlib): {e}; "
                 f"nothing was run")
    return plt


def plot(results, out, plt):
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for (label, _), marker in zip(CONFIGS, ["o", "^", "v", "s"]):
        pts = sorted((r["shape"]["T"], r["tokens_per_s"]) for r in results
                     if config_label(r) == label)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=label)
    # Points timed while another process held a processor are marked, not hidden.
    busy = [(r["shape"]["T"], r["tokens_per_s"]) for r in results if r.get("contended")]
    if busy:
        ax.plot([p[0] for p in busy], [p[1] for p in busy], "x", color="red", markersize=10,
                linestyle="none", label="machine busy while timed")
    ax.set_xscale("log", base=2)
    ts = sorted({r["shape"]["T"] for r in results})
    ax.set_xticks(ts)
    ax.set_xticklabels([str(t) for t in ts])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel("tokens/s")
    first = results[0]
    ax.set_title(f"linseq KDA forward, B=1 H=16 K=V=128 per-channel decay\n"
                 f"{first['threads']} threads, {first['isa']}, median of each point")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default="build/linseq", help="the linseq binary")
    ap.add_argument("--out", default="docs/kda_throughput.png")
    ap.add_argument("--threads", type=int, help="passed to bench (default: all processors)")
    ap.add_argument("--repeats", type=int, help="passed to bench (default: about 1 s a point)")
    ap.add_argument("--save-json", help="also write the results, one JSON object a line")
    ap.add_argument("--from-json", help="plot saved results instead of running bench")
    args = ap.parse_args()
    plt = pyplot()

    if args.from_json:
        with open(args.from_json) as f:
            results = [json.loads(line) for line in f if line.strip()]
    else:
        if not os.access(args.cli, os.X_OK):
            sys.exit(f"plot_kda_throughput: no executable '{args.cli}' (run make first)")
        extra = []
        if args.threads:
            extra += ["--threads", str(args.threads)]
        if args.repeats:
            extra += ["--repeats", str(args.repeats)]
        results = []
        for label, options in CONFIGS:
            for t in T_VALUES:
                r = run_point(args.cli, options, t, extra)
                print(f"{label:28s} T={t:6d}  {r['tokens_per_s']:10.0f} tokens/s  "
                      f"median {r['median_s'] * 1e3:9.2f} ms", flush=True)
                results.append(r)
        if args.save_json:
            with open(args.save_json, "w") as f:
                for r in results:
                    f.write(json.dumps(r) + "\n")
    if not results:
        sys.exit("plot_kda_throughput: no results")
    plot(results, args.out, plt)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
