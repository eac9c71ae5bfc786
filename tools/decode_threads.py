#!/usr/bin/env python3
"""Greedy decode of small transformers models through linseq against transformers' own
PyTorch path, per PyTorch thread count, on a quiet or a busy machine: prints the time of each
route and the linseq/torch ratio (a benchmark tool, not a test).

    python3 tools/decode_threads.py [--models kimi,qwen3next,mamba] [--hidden 64]
        [--head-dim 16] [--threads 1,2] [--linseq-threads 0] [--tokens 32] [--rounds 5]
        [--contend N] [--omp-wait-policy default,passive]

At the defaults it took 8 minutes on a 2-core machine with the load average near 10.

Both routes (linseq.integrations.transformers' routing("linseq") and routing("torch")) and all
thread counts (PyTorch's, and linseq's: --linseq-threads, 0 = linseq's default) alternate
round by round in one process, so a change of machine load hits them
alike; every figure is a median over the rounds. --contend N starts N spinning processes
beside the timing (as `linseq bench --contend N` does). --omp-wait-policy runs one child
process per value with OMP_WAIT_POLICY set that way ("default": unset), because the OpenMP
runtime inside PyTorch reads it once, when it starts; the policies' children alternate too.
The line after the table says how many threads the process started while decoding (PyTorch's
OpenMP team and linseq's pool; linseq starts none while its calls are too small for more than
the caller's thread).

Why this exists: on a busy 2-core machine, 2 PyTorch threads made both routes 2-30x slower than
1 thread. The time goes to PyTorch's OpenMP team: after each parallel region its threads spin
(libgomp's default), so each thread of the team competes with the caller and with the other
processes for the cores, and a region waits a scheduler slice for a preempted team member.
OMP_WAIT_POLICY=passive (or one PyTorch thread) removes it for both routes.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time


def model(name, hidden, head_dim):
    """A random-weight model of two layers (one linear-attention or Mamba layer first),
    hidden `hidden`, linear-attention heads head_dim wide (at hidden 64 and head_dim 16: the
    package's test models)."""
    import torch
    import transformers as tf

    heads = max(2, hidden // 64)
    tokens = dict(vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if name == "kimi":
        config = tf.KimiLinearConfig(
            hidden_size=hidden, intermediate_size=hidden * 3 // 2,
            moe_intermediate_size=hidden // 2, num_hidden_layers=2, num_attention_heads=heads,
            num_key_value_heads=heads, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
            qk_nope_head_dim=16, v_head_dim=16, num_local_experts=4, num_experts_per_tok=2,
            n_group=1, topk_group=1, linear_head_dim=head_dim, linear_num_heads=heads,
            layer_types=["linear_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse"], **tokens)
        cls = tf.KimiLinearForCausalLM
    elif name == "qwen3next":
        config = tf.Qwen3NextConfig(
            hidden_size=hidden, intermediate_size=hidden * 3 // 2,
            moe_intermediate_size=hidden // 2, shared_expert_intermediate_size=hidden // 2,
            num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=1, head_dim=16,
            linear_num_key_heads=heads, linear_num_value_heads=2 * heads,
            linear_key_head_dim=head_dim, linear_value_head_dim=head_dim, num_experts=4,
            num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"], **tokens)
        cls = tf.Qwen3NextForCausalLM
    elif name == "mamba":
        config = tf.MambaConfig(hidden_size=hidden, state_size=8, num_hidden_layers=2,
                                expand=2, conv_kernel=4, **tokens)
        cls = tf.MambaForCausalLM
    else:
        raise SystemExit(f"decode_threads: unknown model {name!r} (kimi, qwen3next, mamba)")
    torch.manual_seed(0)
    return cls(config).to(torch.float32).eval()


def thread_count():
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else -1


def measure(args):
    import torch
    import linseq
    import linseq.integrations.transformers as linseq_hf

    linseq_hf.enable()
    models = {name: model(name, args.hidden, args.head_dim) for name in args.models}
    prompt = torch.randint(3, 100, (1, 16), generator=torch.Generator().manual_seed(1))
    threads_before = thread_count()

    def decode(m, route):
        with linseq_hf.routing(route), torch.no_grad():
            start = time.perf_counter()
            m.generate(prompt, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                       do_sample=False)
            return time.perf_counter() - start

    for m in models.values():   # first calls load libraries and build caches
        for route in ("linseq", "torch"):
            decode(m, route)
    times = {}
    for _ in range(args.rounds):
        for name, m in models.items():
            for n in args.threads:
                torch.set_num_threads(n)
                for own in args.linseq_threads:
                    linseq.set_num_threads(own)
                    times.setdefault((name, n, own), []).append(decode(m, "linseq"))
                times.setdefault((name, n, "torch"), []).append(decode(m, "torch"))
    linseq.set_num_threads(0)
    # linseq's pool starts its workers at the first call that uses them, PyTorch's OpenMP
    # team at its first parallel region of a larger team
    return times, thread_count() - threads_before


def report(times, policy, pool_growth, args):
    for (name, n, own), samples in sorted(times.items(), key=str):
        if own == "torch":
            continue
        ours, theirs = statistics.median(samples), statistics.median(times[(name, n, "torch")])
        print(f"| {name} | {args.hidden} | {policy} | {n} | {own or 'default'} | {args.contend} "
              f"| {ours * 1e3:.0f} "
              f"| {theirs * 1e3:.0f} | {ours / theirs:.2f} |", flush=True)
    if pool_growth:
        print(f"(threads started after the models were built: {pool_growth}; PyTorch's "
              f"OpenMP team and linseq's pool)")


def busy(n):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    csv = lambda text: [x for x in text.split(",") if x]  # noqa: E731
    p.add_argument("--models", type=csv, default=["kimi", "qwen3next", "mamba"])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--threads", type=lambda t: [int(x) for x in csv(t)], default=[1, 2],
                   help="PyTorch thread counts")
    p.add_argument("--linseq-threads", type=lambda t: [int(x) for x in csv(t)], default=[0],
                   help="linseq thread counts (0: linseq's default)")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per generation")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--contend", type=int, default=0, help="busy processes beside the timing")
    p.add_argument("--omp-wait-policy", type=csv, default=None,
                   help="one child process per value (default = unset, passive, active)")
    p.add_argument("--child-policy", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def child_argv(args, policy):
    return [sys.executable, os.path.abspath(__file__), "--models", ",".join(args.models),
            "--hidden", str(args.hidden), "--head-dim", str(args.head_dim),
            "--threads", ",".join(map(str, args.threads)),
            "--linseq-threads", ",".join(map(str, args.linseq_threads)),
            "--tokens", str(args.tokens), "--rounds", "1", "--child-policy", policy]


def run_policies(args):
    """Children one round each, policies alternating, so that load changes hit all alike."""
    import json

    merged = {}
    for _ in range(args.rounds):
        for policy in args.omp_wait_policy:
            env = dict(os.environ)
            env.pop("OMP_WAIT_POLICY", None)
            if policy != "default":
                env["OMP_WAIT_POLICY"] = policy
            out = subprocess.run(child_argv(args, policy), env=env, check=True,
                                 stdout=subprocess.PIPE, text=True).stdout
            for key, t in json.loads(out.splitlines()[-1]):
                merged.setdefault((policy, *key), []).append(t)
    for policy in args.omp_wait_policy:
        report({k[1:]: v for k, v in merged.items() if k[0] == policy}, policy, 0, args)


def require(modules):
    """Imports what the run needs before any process starts or anything is timed: a missing
    package ends the tool at once, naming it."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            sys.exit(f"decode_threads: needs {name} ({e}); nothing was run")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    require(["torch", "transformers", "linseq", "linseq.integrations.transformers"])
    if args.child_policy is not None:   # one round for run_policies, as JSON on the last line
        import json

        times, _ = measure(args)
        print(json.dumps([[list(k), v[0]] for k, v in times.items()]))
        return
    procs = busy(args.contend)
    try:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} processors; "
              f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
        print("| model | hidden | OMP_WAIT_POLICY | torch threads | linseq threads "
              "| busy processes | linseq ms | torch ms | linseq / torch |")
        print("|---|---|---|---|---|---|---|---|---|")
        if args.omp_wait_policy:
            run_policies(args)
        else:
            times, growth = measure(args)
            report(times, os.environ.get("OMP_WAIT_POLICY", "default"), growth, args)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


if __name__ == "__main__":
    main()
