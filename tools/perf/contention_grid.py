#!/usr/bin/env python3
"""The busy-machine table of docs/performance.md: each op on 1 thread and on all, beside N busy processes.

For every case below and every N of --busy, runs `linseq bench CASE --contend N --json
--no-peak` once with --threads 1 and once with the default thread count (all processors),
alternating the two, --rounds times; prints each pair's medians (the median over rounds of
bench's per-call medians) and their ratio. The library's goal: beside busy processes, the
default thread count is never more than 1.25x slower than one thread; on a quiet machine
(N = 0) it is at least 1.8x faster (ratio <= 0.56). With --write FILE the table replaces
the text between `<!-- contention-table:begin -->` and `<!-- contention-table:end -->`.
Needs python3 only; not run by make or CI. The default grid takes about 14 minutes on a
2-core machine, and while it runs `linseq bench --contend` keeps up to 8 busy processes
(the largest N of --busy) spinning beside it: the machine is fully loaded meanwhile.

    python3 tools/perf/contention_grid.py [--cli build/linseq] [--busy 0,1,2,4,8]
        [--rounds 3] [--cases kda,conv] [--write docs/performance.md] [--save-json FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from doc_block import replace_block

# (name, bench arguments): every op of the suite at a shape where one call takes
# 0.05-50 ms, plus the per-head-decay (Gated DeltaNet) forms.
CASES = [
    ("kda", "kda --B 1 --H 32 --T 512 --K 128 --V 128"),
    ("kda-recurrent", "kda --B 1 --H 32 --T 512 --K 128 --V 128 --mode recurrent"),
    ("gdn", "kda --B 1 --H 32 --T 512 --K 128 --V 128 --decay head"),
    ("kda-fwdbwd", "kda-fwdbwd --B 1 --H 16 --T 512 --K 128 --V 128"),
    ("kda-decode", "kda-decode --B 8 --H 32 --K 128 --V 128"),
    ("kda-decode-1", "kda-decode --B 1 --H 32 --K 128 --V 128"),
    ("gdn-decode", "kda-decode --B 8 --H 32 --K 128 --V 128 --decay head"),
    ("ssm1", "ssm1 --B 1 --D 4096 --T 512"),
    ("ssm1-fwdbwd", "ssm1-fwdbwd --B 1 --D 1536 --T 512"),
    ("ssm1-decode", "ssm1-decode --B 1 --D 4096"),
    ("conv", "conv --B 1 --D 4096 --T 512"),
]
LOADED_LIMIT = 1.25  # default threads / 1 thread, beside busy processes
QUIET_LIMIT = 1 / 1.8  # the same ratio on a quiet machine


def bench(cli, args, threads, busy):
    cmd = [cli, "bench", *args.split(), "--contend", str(busy), "--json", "--no-peak"]
    if threads:
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    row["load_avg_1min"] = os.getloadavg()[0]
    return row


def measure(cli, cases, busy_counts, rounds, save):
    rows = []
    for name, args in cases:
        for busy in busy_counts:
            one, many, load = [], [], []
            for _ in range(rounds):
                for threads, into in ((1, one), (None, many)):
                    r = bench(cli, args, threads, busy)
                    into.append(r["median_s"])
                    load.append(r["load_avg_1min"])
                    r["case"] = name
                    if save:
                        save.write(json.dumps(r) + "\n")
            rows.append({"case": name, "args": args, "busy": busy, "threads": r["threads"],
                         "one": statistics.median(one), "many": statistics.median(many),
                         "load": (min(load), max(load))})
            row = rows[-1]
            print(f"  {name} busy={busy}: {row['one'] * 1e3:.3f} ms on 1 thread, "
                  f"{row['many'] * 1e3:.3f} ms on {row['threads']}", file=sys.stderr, flush=True)
    return rows


def verdict(row):
    ratio = row["many"] / row["one"]
    limit = QUIET_LIMIT if row["busy"] == 0 else LOADED_LIMIT
    return ratio, ("met" if ratio <= limit else "**missed**")


def table(rows, rounds):
    threads = rows[0]["threads"] if rows else "all"
    out = [f"| op (`linseq bench ...`) | busy processes | 1 thread, ms | {threads} threads, ms | "
           f"{threads} / 1 | goal | load average |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio, ok = verdict(r)
        goal = f"<= {QUIET_LIMIT:.2f}" if r["busy"] == 0 else f"<= {LOADED_LIMIT}"
        out.append(f"| `{r['args']}` | {r['busy']} | {r['one'] * 1e3:.3f} | "
                   f"{r['many'] * 1e3:.3f} | {ratio:.2f} | {goal}: {ok} | "
                   f"{r['load'][0]:.1f}-{r['load'][1]:.1f} |")
    missed = sum(verdict(r)[1] != "met" for r in rows)
    out.append("")
    out.append(f"Medians of {rounds} alternating rounds; {len(rows) - missed} of {len(rows)} "
               f"rows meet their goal.")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default="build/linseq", help="the linseq binary")
    ap.add_argument("--busy", default="0,1,2,4,8", help="busy-process counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", help="comma-separated case names (default: all): "
                    + ", ".join(n for n, _ in CASES))
    ap.add_argument("--write", metavar="FILE",
                    help="replace the table between the contention-table markers of FILE")
    ap.add_argument("--save-json", help="also write every bench result to this file")
    args = ap.parse_args()
    if not os.access(args.cli, os.X_OK):
        sys.exit(f"contention_grid: no executable '{args.cli}' (run make first)")
    wanted = args.cases.split(",") if args.cases else [n for n, _ in CASES]
    unknown = sorted(set(wanted) - {n for n, _ in CASES})
    if unknown:
        sys.exit(f"contention_grid: unknown case(s) {', '.join(unknown)}")
    cases = [c for c in CASES if c[0] in wanted]
    busy = [int(b) for b in args.busy.split(",")]
    save = open(args.save_json, "w") if args.save_json else None
    try:
        rows = measure(args.cli, cases, busy, args.rounds, save)
    finally:
        if save:
            save.close()
    md = table(rows, args.rounds)
    if args.write:
        replace_block(args.write, "contention-table", md, "contention_grid")
    else:
        sys.stdout.write(md)


if __name__ == "__main__":
    main()
