#!/usr/bin/env python3
"""linseq against ggml's CPU backend, side by side, in one run.

For each case the script alternates, round after round, ggml's `test-backend-ops perf -b CPU`
for that op at that shape and `linseq bench ... --json --no-peak --threads N` for the matching
linseq op, and prints a markdown table: case | ggml time | linseq time | ggml / linseq (the
medians over the rounds, and the range of the per-round ratios), with the load average, the
thread count and the command line. The VM's speed drifts from day to day, so only the ratios of
one run mean anything. Needs python3 only; not run by make or CI; about 90 s per round (3
minutes at the default --rounds 2), and 3.5 minutes more per round for the eight SSD cases.

ggml: the standalone repository, https://github.com/ggml-org/ggml (its tests/ hold
test-backend-ops.cpp). The table in docs/performance.md was taken at ggml commit d99724f2
(2026-08-21; the table's first line names the commit of each run, read from the checkout):

    git clone https://github.com/ggml-org/ggml GGML_DIR && git -C GGML_DIR checkout d99724f2

The lines inserted below are found by pattern; another commit may move them, and the script
then stops with a message naming what it did not find.

ggml's perf list has none of these shapes but the SSD ones at B=1, so a ggml checkout needs a
few lines of ours first. `--prepare-ggml DIR` inserts them into DIR/tests/test-backend-ops.cpp
and builds the program (CPU backend only, Release, ggml's default -march=native: its best case
on this machine):

  * at the top of make_test_cases_perf(), a block that, when the environment has
    SIDE_BY_SIDE_CASES set, adds only the cases below and returns (print them with
    --print-ggml-cases); without it ggml's own list is unchanged;
  * where the program sets the CPU backend's threads (hardware_concurrency() otherwise, with
    no option to change it), the count from SIDE_BY_SIDE_THREADS, echoed on stderr so the
    script can check that ggml ran with the threads linseq did.

  Build by hand instead (the same as --prepare-ggml does after inserting the lines):
    cmake -S DIR -B DIR/build -DCMAKE_BUILD_TYPE=Release -DGGML_BUILD_TESTS=ON \\
          -DGGML_BUILD_EXAMPLES=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF \\
          -DGGML_BLAS=OFF
    cmake --build DIR/build --target test-backend-ops -j2

Then:
    make BUILD=build/ggmlcmp -j2 build/ggmlcmp/linseq
    python3 tools/perf/ggml_side_by_side.py --ggml DIR/build/bin/test-backend-ops \\
        --cli build/ggmlcmp/linseq --threads 2 --rounds 2 [--cases kda,ssm1,ssd] [--json-out F]

ggml's CPU backend runs its graphs with OpenMP (GGML_OPENMP is on by default), so its runs get
OMP_WAIT_POLICY=active (--no-omp-active drops it); linseq runs its own thread pool.

What each side does (like with like where ggml allows it; the table's notes say where not):
  GDN / KDA forward: ggml's GATED_DELTA_NET (scalar gate: kda=0; per-channel: kda=1) runs the
  recurrence token by token; linseq runs the chunked form (chunk 64) with the q/k l2norm
  inside. ggml's perf case l2-normalises q and k in separate nodes that run once per graph
  while the op node repeats, so ggml's time holds almost none of it (linseq's holds all).
  Decode: one token for B sequences, the same state reused call after call on both sides
  (cache-warm at B=1 and 8; at B=32 its 64 MiB come from memory either way).
  SSM1: ggml's SSM_SCAN in the Mamba1 form (head_dim 1, A [D, N], one group) applies softplus
  to dt and returns y = C h; linseq's bench adds the D skip and the silu(z) gate (no softplus).
  SSD (Mamba2): ggml's SSM_SCAN with head_dim > 1 (a scalar decay per head) runs token by
  token on the CPU at any length (its chunked SSD path is CUDA's); linseq's bench
  times the chunked form, as for SSM1 with the D skip and the gate and without the softplus.
  Decode reuses one set of states on both sides: 1.5 MiB a sequence at H=48, 5 MiB at H=128.
  conv: ggml's SSM_CONV is the bare depthwise convolution over a channel-major [D, W-1+T]
  window; linseq's bench op adds the bias and the silu. ggml's SSM_CONV_BIAS_SILU perf case
  cannot stand in: perf mode repeats only the graph's last node (the silu), and the CPU
  backend fuses none of the three.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

from doc_block import publish
from suite_table import cpu_model

KDA_SHAPE = "--H 32 --K 128 --V 128"

# key, label, ggml op, ggml perf case (C++ constructor call), ggml vars to match, linseq bench
# arguments, note. The constructor arguments: test_gated_delta_net(type, heads, head size,
# tokens per sequence, sequences, v_repeat, permuted, kda); test_ssm_scan(type, d_state,
# head_dim (1 = Mamba1, > 1 = Mamba2), heads (= D channels in Mamba1), groups, tokens,
# sequences);
# test_ssm_conv(type, {W-1+T, D, sequences, 1}, {W, D, 1, 1}).
CASES = [
    ("gdn", "Gated DeltaNet fwd (per-head decay) H=32 K=V=128 T=512", "GATED_DELTA_NET",
     "test_gated_delta_net(GGML_TYPE_F32, 32, 128, 512, 1, 1, false, false)",
     {"head_count": "32", "head_size": "128", "n_seq_tokens": "512", "n_seqs": "1", "kda": "0"},
     f"kda --B 1 --T 512 {KDA_SHAPE} --decay head", "rec"),
    ("kda", "KDA fwd (per-channel decay) H=32 K=V=128 T=512", "GATED_DELTA_NET",
     "test_gated_delta_net(GGML_TYPE_F32, 32, 128, 512, 1, 1, false, true)",
     {"head_count": "32", "head_size": "128", "n_seq_tokens": "512", "n_seqs": "1", "kda": "1"},
     f"kda --B 1 --T 512 {KDA_SHAPE} --decay channel", "rec"),
] + [
    (f"{name}-decode-b{b}", f"{label} decode H=32 K=V=128, B={b}", "GATED_DELTA_NET",
     f"test_gated_delta_net(GGML_TYPE_F32, 32, 128, 1, {b}, 1, false, {kda})",
     {"head_count": "32", "head_size": "128", "n_seq_tokens": "1", "n_seqs": str(b),
      "kda": "1" if kda == "true" else "0"},
     f"kda-decode --B {b} {KDA_SHAPE} --decay {decay}", "dec")
    for name, label, kda, decay in (("gdn", "Gated DeltaNet", "false", "head"),
                                     ("kda", "KDA", "true", "channel"))
    for b in (1, 8, 32)
] + [
    ("ssm1-d4096", "SSM1 fwd D=4096 N=16 T=512", "SSM_SCAN",
     "test_ssm_scan(GGML_TYPE_F32, 16, 1, 4096, 1, 512, 1)",
     {"d_state": "16", "head_dim": "1", "n_head": "4096", "n_seq_tokens": "512", "n_seqs": "1"},
     "ssm1 --B 1 --T 512 --D 4096 --N 16", "ssm"),
    ("ssm1-d1536", "SSM1 fwd D=1536 N=16 T=512", "SSM_SCAN",
     "test_ssm_scan(GGML_TYPE_F32, 16, 1, 1536, 1, 512, 1)",
     {"d_state": "16", "head_dim": "1", "n_head": "1536", "n_seq_tokens": "512", "n_seqs": "1"},
     "ssm1 --B 1 --T 512 --D 1536 --N 16", "ssm"),
    ("ssm1-decode", "SSM1 decode D=4096 N=16, B=1", "SSM_SCAN",
     "test_ssm_scan(GGML_TYPE_F32, 16, 1, 4096, 1, 1, 1)",
     {"d_state": "16", "head_dim": "1", "n_head": "4096", "n_seq_tokens": "1", "n_seqs": "1"},
     "ssm1-decode --B 1 --D 4096 --N 16", "ssm"),
] + [
    (f"ssd-h{h}-p{p}{'-decode' if t == 1 else ''}-b{b}",
     f"SSD {'decode' if t == 1 else 'fwd'} H={h} P={p} N=128{' T=512' if t > 1 else ''}, B={b}",
     "SSM_SCAN", f"test_ssm_scan(GGML_TYPE_F32, 128, {p}, {h}, 1, {t}, {b})",
     {"d_state": "128", "head_dim": str(p), "n_head": str(h), "n_group": "1",
      "n_seq_tokens": str(t), "n_seqs": str(b)},
     f"ssd-decode --B {b} --H {h} --P {p} --N 128" if t == 1 else
     f"ssd --B {b} --T {t} --H {h} --P {p} --N 128", "ssd-dec" if t == 1 else "ssd")
    # the two Mamba2 shapes of ggml's own perf list (there at B=1 only)
    for h, p in ((48, 64), (128, 80))
    for t in (512, 1)
    for b in (1, 8)
] + [
    ("conv", "conv D=4096 W=4 T=512", "SSM_CONV",
     "test_ssm_conv(GGML_TYPE_F32, {515, 4096, 1, 1}, {4, 4096, 1, 1})",
     {"ne_a": "[515,4096,1,1]", "ne_b": "[4,4096,1,1]"},
     "conv --B 1 --T 512 --D 4096 --W 4", "conv"),
]

NOTES = {
    "rec": "ggml: recurrent, token by token, q/k l2norm outside the timed op; "
           "linseq: chunked (64), l2norm inside",
    "dec": "one recurrent step each; ggml: q/k l2norm outside the timed op, new state to a "
           "new tensor; linseq: l2norm inside, state in place",
    "ssm": "ggml: softplus(dt), y = C h; linseq: no softplus, + D skip and silu(z) gate",
    "ssd": "ggml: recurrent, token by token, softplus(dt), y = C h; linseq: chunked (64), "
           "no softplus, + D skip and silu(z) gate",
    "ssd-dec": "one recurrent step each; ggml: softplus(dt), y = C h, new state to a new "
               "tensor; linseq: no softplus, + D skip and silu(z) gate, state in place",
    "conv": "ggml: bare conv on a channel-major [D, W-1+T] window (no bias, no silu); "
            "linseq: conv + bias + silu on [T, D]",
}

BLOCK_BEGIN = "    // side-by-side cases: begin"
BLOCK_END = "    // side-by-side cases: end"
THREADS_LINE = "ggml_backend_set_n_threads_fn(backend.get(), N_THREADS);"
THREADS_ECHO = "side-by-side: CPU backend threads = "


def ggml_case_block():
    lines = [BLOCK_BEGIN, '    if (getenv("SIDE_BY_SIDE_CASES")) {']
    lines += [f"        test_cases.emplace_back(new {c[3]});" for c in CASES]
    lines += ["        return test_cases;", "    }", BLOCK_END]
    return "\n".join(lines) + "\n"


def ggml_threads_lines(indent):
    return (f'const char * side_by_side_threads = getenv("SIDE_BY_SIDE_THREADS");\n'
            f"{indent}const int n_threads_used = side_by_side_threads ? "
            f"atoi(side_by_side_threads) : (int) N_THREADS;\n"
            f'{indent}fprintf(stderr, "{THREADS_ECHO}%d\\n", n_threads_used);\n'
            f"{indent}ggml_backend_set_n_threads_fn(backend.get(), n_threads_used);")


def insert_case_block(src):
    if BLOCK_BEGIN in src:  # an earlier run's block: replace it
        start = src.index(BLOCK_BEGIN)
        end = src.index(BLOCK_END, start) + len(BLOCK_END) + 1
        return src[:start] + ggml_case_block() + src[end:]
    m = re.search(r"make_test_cases_perf\(\)\s*\{\s*\n(\s*std::vector<[^\n]*test_cases;\n)", src)
    if not m:
        sys.exit("ggml_side_by_side: make_test_cases_perf() not found in test-backend-ops.cpp")
    return src[:m.end()] + ggml_case_block() + src[m.end():]


def insert_threads(src):
    if THREADS_ECHO in src:
        return src
    m = re.search(r"\n([ \t]*)" + re.escape(THREADS_LINE), src)
    if not m:
        sys.exit("ggml_side_by_side: the CPU thread setting not found in test-backend-ops.cpp")
    return src[:m.start(1)] + m.group(1) + ggml_threads_lines(m.group(1)) + \
        src[m.end():]


def prepare_ggml(root, jobs):
    path = os.path.join(root, "tests", "test-backend-ops.cpp")
    if not os.path.isfile(path):
        sys.exit(f"ggml_side_by_side: --prepare-ggml {root}: no {path}; expected a checkout "
                 f"of https://github.com/ggml-org/ggml (git clone it there first)")
    for tool in ("cmake",):
        if shutil.which(tool) is None:
            sys.exit(f"ggml_side_by_side: --prepare-ggml needs {tool} on PATH")
    with open(path) as f:
        src = f.read()
    with open(path, "w") as f:
        f.write(insert_threads(insert_case_block(src)))
    build = os.path.join(root, "build")
    configure = ["cmake", "-S", root, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                 "-DGGML_BUILD_TESTS=ON", "-DGGML_BUILD_EXAMPLES=OFF", "-DGGML_CUDA=OFF",
                 "-DGGML_VULKAN=OFF", "-DGGML_METAL=OFF", "-DGGML_BLAS=OFF"]
    compile_ = ["cmake", "--build", build, "--target", "test-backend-ops", "-j", str(jobs)]
    for cmd in (configure, compile_):
        print("+", shlex.join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)
    print(os.path.join(build, "bin", "test-backend-ops"))


def run_timed(cmd, env):
    """Runs cmd to the end; returns its stdout, stderr and wall seconds."""
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"ggml_side_by_side: {shlex.join(cmd)} failed ({proc.returncode}):\n"
                 f"{proc.stderr}")
    return proc.stdout, proc.stderr, wall


def parse_vars(text):
    # "type=f32,ne_a=[515,4096,1,1],kda=0": split on commas outside brackets.
    fields, depth, cur = {}, 0, ""
    for ch in text + ",":
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            key, _, value = cur.partition("=")
            fields[key] = value
            cur = ""
        else:
            cur += ch
    return fields


def vars_regex(want):
    """A regex (ECMAScript, as test-backend-ops -p takes it) for a vars string that has every
    key=value of want as a whole field."""
    return "^" + "".join(f"(?=(.*,)?{re.escape(f'{k}={v}')}(,|$))" for k, v in want.items())


GGML_LINE = re.compile(r"^\s*([A-Z_0-9]+)\((.*)\):\s+(\d+) runs - \s*([0-9.]+) us/run")


def ggml_time(ggml, case, threads, omp_active):
    key, _, op, _, want, _, _ = case
    env = dict(os.environ, SIDE_BY_SIDE_CASES="1", SIDE_BY_SIDE_THREADS=str(threads))
    if omp_active:
        env["OMP_WAIT_POLICY"] = "active"
    cmd = [ggml, "perf", "-b", "CPU", "-o", op, "-p", vars_regex(want)]
    before = os.times()
    out, err, wall = run_timed(cmd, env)
    after = os.times()
    cpu = (after.children_user - before.children_user) + \
        (after.children_system - before.children_system)
    used = re.findall(re.escape(THREADS_ECHO) + r"(\d+)", err + out)
    if not used:
        sys.exit("ggml_side_by_side: this test-backend-ops lacks the side-by-side lines; "
                 "build it with --prepare-ggml DIR")
    if int(used[0]) != threads:
        sys.exit(f"ggml_side_by_side: ggml ran {used[0]} threads, not {threads}")
    for line in out.splitlines():
        m = GGML_LINE.match(line)
        if m and m.group(1) == op:
            have = parse_vars(m.group(2))
            if all(have.get(k) == v for k, v in want.items()):
                return {"us": float(m.group(4)), "runs": int(m.group(3)),
                        "threads": int(used[0]), "cpu_per_wall": cpu / wall,
                        "vars": m.group(2)}
    sys.exit(f"ggml_side_by_side: no ggml perf line for case {key}:\n{out}\n{err}")


def linseq_time(cli, case, threads):
    args = case[5].split() + ["--json", "--no-peak", "--threads", str(threads)]
    cmd = [cli, "bench", *args]
    out, err, _ = run_timed(cmd, dict(os.environ))
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if not rows:
        sys.exit(f"ggml_side_by_side: no JSON from {shlex.join(cmd)}:\n{out}\n{err}")
    r = rows[-1]
    return {"us": r["median_s"] * 1e6, "min_us": r["min_s"] * 1e6, "max_us": r["max_s"] * 1e6,
            "threads": r["threads"], "cpus_busy": r.get("cpus_busy"),
            "contended": r.get("contended"), "args": " ".join(args)}


def fmt_us(us):
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} us"


def fmt_range(values, fmt):
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"


def ratio_text(x):
    return f"{x:.1f}x" if x >= 10 else f"{x:.2f}x"


def table(results, rounds):
    out = ["| case | ggml time | linseq time | ggml / linseq | what differs |",
           "|---|---|---|---|---|"]
    for case, rows in results:
        g = [r["ggml"]["us"] for r in rows]
        s = [r["linseq"]["us"] for r in rows]
        ratios = [a / b for a, b in zip(g, s)]
        g_text = fmt_us(statistics.median(g))
        s_text = fmt_us(statistics.median(s))
        r_text = fmt_range(ratios, ratio_text) if rounds > 1 else ratio_text(ratios[0])
        out.append(f"| {case[1]} | {g_text} | {s_text} | {r_text} | {NOTES[case[6]]} |")
    return "\n".join(out)


def ggml_commit(ggml):
    root = os.path.dirname(os.path.abspath(ggml))
    try:
        return subprocess.run(["git", "-C", root, "log", "-1", "--format=%h %cs"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"


def loadavg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(args, cases):
    results = [(case, []) for case in cases]
    for rnd in range(args.rounds):
        for case, rows in results:
            g = ggml_time(args.ggml, case, args.threads, not args.no_omp_active)
            s = linseq_time(args.cli, case, args.threads)
            rows.append({"round": rnd + 1, "ggml": g, "linseq": s})
            print(f"  round {rnd + 1} {case[0]}: ggml {fmt_us(g['us'])} "
                  f"({g['cpu_per_wall']:.2f} CPUs busy), linseq {fmt_us(s['us'])} "
                  f"({s['cpus_busy']} CPUs busy), {g['us'] / s['us']:.2f}x",
                  file=sys.stderr, flush=True)
    return results


def shown_argv(ggml):
    """The command line with the ggml checkout written GGML_DIR and without --json-out: where
    those lie is this machine's business, not the table's."""
    suffix = os.path.join("build", "bin", "test-backend-ops")
    root = os.path.abspath(ggml)[:-len(suffix)] if ggml.endswith(suffix) else None
    shown, skip = [], False
    for a in sys.argv[1:]:
        if skip or a.startswith("--json-out"):
            skip = a == "--json-out"
            continue
        shown.append(a.replace(root, "GGML_DIR/") if root and a.startswith(root) else a)
    return shown


def report(args, results, load_before, load_after):
    """The markdown of the run: what was compared, the table, the command line."""
    cmd = "python3 tools/perf/ggml_side_by_side.py " + shlex.join(shown_argv(args.ggml))
    out = [f"ggml {ggml_commit(args.ggml)} (test-backend-ops perf -b CPU) against linseq bench, "
           f"{args.threads} threads each, {args.rounds} alternating round(s), "
           f"{datetime.date.today().isoformat()}, {cpu_model()}; load average "
           f"{load_before} before, {load_after} after; ggml with "
           f"{'OMP_WAIT_POLICY=active' if not args.no_omp_active else 'the default OpenMP wait'}."
           f" Times: medians over the rounds; ratio: the range of the per-round ratios.\n",
           table(results, args.rounds)]
    busy = [f"{c[0]} round {r['round']}" for c, rows in results for r in rows
            if r["linseq"]["contended"]]
    if busy:
        out.append(f"\nlinseq bench saw other work on the processors (cpus_busy under 85% of "
                   f"the threads) in: {', '.join(busy)}.")
    out.append(f"\n`{cmd}`")
    return "\n".join(out) + "\n"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cli", default="build/linseq", help="the linseq program")
    p.add_argument("--ggml", help="ggml's test-backend-ops built with --prepare-ggml")
    p.add_argument("--threads", type=int, default=2, help="threads on both sides")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    p.add_argument("--cases", help="comma-separated substrings of case keys to run "
                   "(keys: " + ", ".join(c[0] for c in CASES) + ")")
    p.add_argument("--json-out", help="write every measurement to this JSON file")
    p.add_argument("--write", metavar="FILE",
                   help="put the result between the ggml-table markers of FILE")
    p.add_argument("--no-omp-active", action="store_true",
                   help="do not set OMP_WAIT_POLICY=active for ggml")
    p.add_argument("--prepare-ggml", metavar="DIR",
                   help="insert the perf cases into the ggml checkout DIR and build it")
    p.add_argument("--jobs", type=int, default=2, help="build jobs for --prepare-ggml")
    p.add_argument("--print-ggml-cases", action="store_true",
                   help="print the lines --prepare-ggml inserts and exit")
    return p.parse_args()


def main():
    args = parse_args()
    if args.print_ggml_cases:
        print(ggml_case_block() + "\n" + ggml_threads_lines(""))
        return
    if args.prepare_ggml:
        prepare_ggml(args.prepare_ggml, args.jobs)
        return
    if not args.ggml:
        sys.exit("ggml_side_by_side: --ggml PATH (test-backend-ops) is needed")
    if not os.access(args.ggml, os.X_OK) or os.path.isdir(args.ggml):
        sys.exit(f"ggml_side_by_side: --ggml {args.ggml}: no such program; build ggml's "
                 f"test-backend-ops with --prepare-ggml GGML_DIR first (it prints the path)")
    if not os.access(args.cli, os.X_OK) or os.path.isdir(args.cli):
        sys.exit(f"ggml_side_by_side: --cli {args.cli}: no such program (run make first)")
    if args.threads < 1 or args.rounds < 1:
        sys.exit("ggml_side_by_side: --threads and --rounds must be >= 1")
    wanted = args.cases.split(",") if args.cases else None
    cases = [c for c in CASES if not wanted or any(w in c[0] for w in wanted)]
    if not cases:
        sys.exit(f"ggml_side_by_side: no case matches --cases {args.cases}")
    load_before = loadavg()
    results = measure(args, cases)
    load_after = loadavg()
    md = report(args, results, load_before, load_after)
    publish(md, args.write, "ggml-table", "ggml_side_by_side")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"command": sys.argv, "threads": args.threads, "rounds": args.rounds,
                       "ggml_commit": ggml_commit(args.ggml), "load_before": load_before,
                       "load_after": load_after,
                       "cases": [{"key": c[0], "label": c[1], "ggml_case": c[3],
                                  "linseq_args": c[5], "note": NOTES[c[6]], "rounds": rows}
                                 for c, rows in results]}, f, indent=1)


if __name__ == "__main__":
    main()
