#!/usr/bin/env python3
"""Time several `linseq bench` command lines in alternation and compare them in one table.

On a shared machine whose speed drifts from minute to minute, two figures compare only when
they were measured side by side: this runs each command line once per round, in turn, for
--rounds rounds, and prints a markdown table of each line's median over the rounds of bench's
per-call medians, the range over rounds, and its ratio to the first line (or to --base).
Needs python3 only; not run by make or CI. Run time: --rounds x the lines (x the binaries)
bench calls, each about a second or 10 calls of its op.

    python3 tools/perf/alternate.py [--cli build/linseq] [--rounds 5] [--base 0]
        "kda --H 32 --T 512" "kda --H 32 --T 512 --dtype bf16"

Each line gets `--json --no-peak` appended, unless it asks for the peak fractions with
--peak (then the medians of the FMA and bandwidth fractions are shown too). To compare two
builds (before and after a change), give --cli several binaries, comma-separated: every line
then runs on each of them in turn.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(cli, line, peak):
    cmd = [cli, "bench", *line.split(), "--json"] + ([] if peak else ["--no-peak"])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(s) for s in out.splitlines() if s.strip()]
    return [r for r in rows if r.get("op") != "peak"][-1]


def fmt_ms(s):
    ms = s * 1e3
    return f"{ms:.3f}" if ms < 10 else f"{ms:.1f}"


def table(lines, results, base, peak):
    """lines: the row labels; results: per line, its bench results over the rounds."""
    head = "| `linseq bench ...` | median ms | range ms | / line " + str(base + 1) + " |"
    rule = "|---|---|---|---|"
    if peak:
        head += " FMA peak | triad |"
        rule += "---|---|"
    out = [head, rule]
    med = [statistics.median(r["median_s"] for r in rs) for rs in results]
    for i, (line, rs) in enumerate(zip(lines, results)):
        times = [r["median_s"] for r in rs]
        row = (f"| `{line}` | {fmt_ms(med[i])} | {fmt_ms(min(times))}-{fmt_ms(max(times))} | "
               f"{med[i] / med[base]:.2f} |")
        if peak:
            fl = [r["peak_flops_fraction"] for r in rs if r.get("peak_flops_fraction") is not None]
            bw = [r["peak_bw_fraction"] for r in rs if r.get("peak_bw_fraction") is not None]
            row += (f" {statistics.median(fl):.0%} |" if fl else " |")
            row += (f" {statistics.median(bw):.0%} |" if bw else " |")
        out.append(row)
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default="build/linseq",
                    help="the linseq binary, or several comma-separated (each line runs on each)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--base", type=int, default=0, help="the line the ratios divide by (0-based)")
    ap.add_argument("--peak", action="store_true", help="measure the peak in each run too")
    ap.add_argument("--save-json", help="also write every bench result to this file")
    ap.add_argument("lines", nargs="+", help="`linseq bench` arguments, one string per line")
    args = ap.parse_args()
    clis = args.cli.split(",")
    for cli in clis:
        if not os.access(cli, os.X_OK):
            sys.exit(f"alternate: no executable '{cli}' (run make first)")
    runs = [(cli, line) for line in args.lines for cli in clis]
    labels = [line if len(clis) == 1 else f"{line}` on `{cli}" for cli, line in runs]
    if not 0 <= args.base < len(runs):
        sys.exit(f"alternate: --base must name one of the {len(runs)} rows (0-based)")
    results = [[] for _ in runs]
    for rnd in range(args.rounds):
        for i, (cli, line) in enumerate(runs):
            r = run(cli, line, args.peak)
            r["line"], r["cli"] = line, cli
            results[i].append(r)
            print(f"  round {rnd + 1}: {labels[i]}: {r['median_s'] * 1e3:.3f} ms",
                  file=sys.stderr, flush=True)
    if args.save_json:
        with open(args.save_json, "w") as f:
            for rs in results:
                f.writelines(json.dumps(r) + "\n" for r in rs)
    sys.stdout.write(table(labels, results, args.base, args.peak))
    print(f"\nMedians of {args.rounds} alternating rounds; load average after: "
          f"{os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
