#!/usr/bin/env python3
"""The markdown table of `linseq bench suite` for docs/performance.md.

Runs `linseq bench suite --json` (or reads its saved output) and prints the table; with
--write FILE it replaces the text between the lines `<!-- suite-table:begin -->` and
`<!-- suite-table:end -->` of FILE instead. Needs python3 only; not run by make or CI. The
suite takes several minutes.

    python3 tools/perf/suite_table.py [--cli build/linseq] [--write docs/performance.md]
        [--save-json FILE] [--from-json FILE] [-- more bench suite options]
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

from doc_block import replace_block



def run_suite(cli, extra):
    cmd = [cli, "bench", "suite", "--json", *extra]
    lines = []
    # Streamed, so that a run of several minutes shows its progress on stderr.
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            if line.strip():
                lines.append(line)
                r = json.loads(line)
                if r.get("op") != "peak":
                    print(f"  {r['case']}, {r['threads']} threads: "
                          f"{r['median_s'] * 1e3:.3f} ms", file=sys.stderr, flush=True)
    if proc.returncode != 0:
        sys.exit(f"suite_table: {' '.join(cmd)} failed ({proc.returncode})")
    return lines


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine() or "unknown CPU"


def fmt_time(s):
    if s >= 1.0:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def fmt_num(x):
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def pct(frac):
    return "-" if frac is None else f"{100 * frac:.1f}%"


def scaling_note(threads, speedup):
    """"2 threads: 1.47x faster than 1" (or "... slower"): a ratio below 1 reads as a
    slowdown, never as "0.68x faster"."""
    if speedup >= 1:
        return f"{threads} threads: {speedup:.2f}x faster than 1"
    return f"{threads} threads: {1 / speedup:.2f}x slower than 1"


def note(r):
    if "ratio_to_forward" in r:
        return f"{r['ratio_to_forward']:.2f}x the forward"
    if "scaling_speedup" in r:
        return scaling_note(r["scaling_threads"], r["scaling_speedup"])
    if r["shape"].get("H") == 1 and r["threads"] == 1:
        return f"{r['us_per_token']:.1f} us per token"
    return ""


def table(lines):
    objs = [json.loads(line) for line in lines if line.strip()]
    peak = next((o for o in objs if o.get("op") == "peak"), None)
    results = [o for o in objs if o.get("op") != "peak"]
    if not results:
        sys.exit("suite_table: no results")
    out = []
    isa = results[0]["isa"]
    when = datetime.date.today().isoformat()
    out.append(f"Measured {when} on {cpu_model()}, {os.cpu_count()} processors, isa {isa}.")
    if peak:
        n = peak["threads"]
        out.append(f"Measured peak: fp32 FMA {peak['fma_gflops_1_thread']:.0f} GFLOP/s on 1 "
                   f"thread, {peak['fma_gflops']:.0f} on {n}; triad bandwidth "
                   f"{peak['bw_gbytes_per_s_1_thread']:.1f} GB/s on 1 thread, "
                   f"{peak['bw_gbytes_per_s']:.1f} on {n}.")
    out.append("")
    out.append("| case | threads | median | tokens/s | GFLOP/s | % FMA peak | GB/s "
               "| % bandwidth | note |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        busy = " *" if r.get("contended") else ""
        out.append(f"| {r['case']}{busy} | {r['threads']} | {fmt_time(r['median_s'])} "
                   f"| {fmt_num(r['tokens_per_s'])} | {r['gflops']:.3g} "
                   f"| {pct(r['peak_flops_fraction'])} | {r['gbytes_per_s']:.3g} "
                   f"| {pct(r['peak_bw_fraction'])} | {note(r)} |")
    if any(r.get("contended") for r in results):
        out.append("")
        out.append("\\* fewer processors were busy than threads while timing: another process "
                   "was running, so this row says more about the machine's load than the kernel.")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default="build/linseq", help="the linseq binary")
    ap.add_argument("--write", metavar="FILE",
                    help="replace the table between the suite-table markers of FILE")
    ap.add_argument("--save-json", help="also write bench's JSON lines to this file")
    ap.add_argument("--from-json", help="format saved JSON lines instead of running bench")
    ap.add_argument("extra", nargs="*", help="options passed on to `linseq bench suite`")
    args = ap.parse_args()

    if args.from_json:
        with open(args.from_json) as f:
            lines = f.readlines()
    else:
        if not os.access(args.cli, os.X_OK):
            sys.exit(f"suite_table: no executable '{args.cli}' (run make first)")
        lines = run_suite(args.cli, args.extra)
        if args.save_json:
            with open(args.save_json, "w") as f:
                f.writelines(lines)
    md = table(lines)
    if not args.write:
        sys.stdout.write(md)
        return
    replace_block(args.write, "suite-table", md, "suite_table")

if __name__ == "__main__":
    main()
