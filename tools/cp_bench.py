"""Context parallelism, measured: time and bytes sent per rank for one packed sequence of T
tokens split evenly over the ranks of a torch.distributed group (gloo), for KDA, the Mamba1
scan, Mamba2's SSD and the causal conv of linseq.distributed. Run with any number of processes:

    torchrun --nproc-per-node 4 tools/cp_bench.py [--tokens 65536] [--repeat 3]

One rank at the defaults took 30 s on a 2-core machine; R ranks on fewer cores than R take
about R/cores times as long.

Per op, rank 0 prints the slowest rank's best time of --repeat runs (the machine's other
load only ever adds time): the plain single-process call on the rank's own tokens (no
context, what the rank would cost alone), the context parallel forward, the plain and the
context parallel forward + backward (alternating, run by run); then the bytes each rank sent
in the forward and in the backward (the most over the ranks), counted at linseq.distributed's
point-to-point sends; with two ranks or more, the time of one message and of the ranks'
agreement check that starts every call's forward and backward. Every rank runs one thread
(--threads: linseq's and torch's), so ranks beyond the machine's cores share them.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

import linseq
import linseq.torch as lt
from linseq import distributed as ld

SENT = {"bytes": 0}


def _counting(send):
    def counted(cp, tensor, to_rank, tag):
        SENT["bytes"] += tensor.numel() * tensor.element_size()
        return send(cp, tensor, to_rank, tag)
    return counted


def _timed(fn, repeat):
    times = []
    for _ in range(repeat):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _measure(cp, name, make, plain, parallel, repeat):
    """(plain s, forward s, plain forward+backward s, forward+backward s, bytes sent
    forward, bytes sent backward). The plain and the context parallel training steps
    alternate, repeat by repeat, so that the machine's other load reaches both alike."""
    inputs = make()
    local = {n: cp.local(t) if t.dim() > 1 and t.shape[1] == cp.cu_seqlens[-1] else t
             for n, t in inputs.items()}
    with torch.no_grad():
        plain(local)
        t_plain = _timed(lambda: plain(local), repeat)
        t_fwd = _timed(lambda: parallel(local), repeat)
    leaves = {n: t.clone().requires_grad_() for n, t in local.items()}

    def step(fn):
        out = fn(leaves)
        out.sum().backward()

    step(plain)
    step(parallel)
    steps = [(_timed(lambda: step(plain), 1), _timed(lambda: step(parallel), 1))
             for _ in range(repeat)]
    t_plain_step, t_step = (min(column) for column in zip(*steps))
    SENT["bytes"] = 0
    with torch.no_grad():
        parallel(local)
    fwd_bytes = SENT["bytes"]
    out = parallel(leaves)
    SENT["bytes"] = 0
    out.sum().backward()
    return t_plain, t_fwd, t_plain_step, t_step, fwd_bytes, SENT["bytes"]


def _ping(repeat, floats=8192):
    """The best time of one send + receive of `floats` float32 between ranks 0 and 1 (the
    latency a link of the chain pays before its bytes), or None with one rank."""
    if dist.get_world_size() < 2:
        return None
    buffer = torch.zeros(floats)
    rank = dist.get_rank()

    def once():
        if rank == 0:
            dist.send(buffer, 1)
            dist.recv(buffer, 1)
        elif rank == 1:
            dist.recv(buffer, 0)
            dist.send(buffer, 0)

    once()
    return _timed(once, repeat) / 2


def _check(cp, repeat):
    """The best time of the ranks' agreement check that starts every call's forward and
    backward (one exchange of a few int64 between every pair of ranks), or None with one
    rank."""
    if cp.world < 2:
        return None
    fields = dict(step="cp_bench", cu_seqlens="", lengths="", arguments="", options="",
                  backward="")
    ld._agree(cp, fields)
    return _timed(lambda: ld._agree(cp, fields), repeat)


def _ops(args):
    T, H, K, V, D, N, W = (args.tokens, args.heads, args.head_dim, args.head_dim, args.dim,
                           args.state, args.width)
    gen = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731

    def kda_inputs():
        return dict(q=rnd(1, T, H, K), k=rnd(1, T, H, K), v=rnd(1, T, H, V),
                    g=-0.1 * torch.rand(1, T, H, K, generator=gen),
                    beta=torch.rand(1, T, H, generator=gen))

    def kda(module, cp):
        extra = {} if cp is None else dict(cp_context=cp)
        return lambda a: module.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"],
                                          use_qk_l2norm_in_kernel=True, **extra)[0]

    def ssm_inputs():
        return dict(x=rnd(1, T, D), A=-torch.rand(D, N, generator=gen), B=rnd(1, T, N),
                    C=rnd(1, T, N), dt=0.5 * rnd(1, T, D))

    def ssm(module, cp):
        extra = {} if cp is None else dict(cp_context=cp)
        return lambda a: module.state_space_v1(a["x"], a["A"], a["B"], a["C"], None, a["dt"],
                                               dt_softplus=True, **extra)[0]

    def ssd_inputs():
        return dict(x=rnd(1, T, H, K), dt=0.5 * rnd(1, T, H),
                    A=-torch.rand(H, generator=gen) - 0.1, B=rnd(1, T, 1, N), C=rnd(1, T, 1, N))

    def ssd(module, cp):
        if cp is None:   # the plain call: the table's op by name
            return lambda a: module.run("ssd", a, dt_softplus=True)[0]
        return lambda a: module.ssd(a["x"], a["dt"], a["A"], a["B"], a["C"], dt_softplus=True,
                                    cp_context=cp)[0]

    def conv_inputs():
        return dict(x=rnd(1, T, D), weight=rnd(D, W))

    def conv(module, cp):
        extra = {} if cp is None else dict(cp_context=cp)
        return lambda a: module.causal_conv1d(a["x"], a["weight"], None, "silu", None,
                                              **extra)[0]

    return [(f"KDA H={H} K=V={K}", kda_inputs, kda),
            (f"SSM1 D={D} N={N}", ssm_inputs, ssm),
            (f"SSD H={H} P={K} N={N}", ssd_inputs, ssd),
            (f"conv D={D} W={W}", conv_inputs, conv)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--state", type=int, default=16)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    linseq.set_num_threads(args.threads)   # the library's own threads (default: every core)
    dist.init_process_group("gloo")
    ld._send = _counting(ld._send)
    cp = ld.build_context(torch.tensor([0, args.tokens]))
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for name, make, op in _ops(args):
        found = _measure(cp, name, make, op(lt, None), op(ld, cp), args.repeat)
        every = [None] * world
        dist.all_gather_object(every, found)
        rows.append((name, [max(column) for column in zip(*every)]))
    ping = _ping(args.repeat)
    check = _check(cp, args.repeat)
    if rank == 0:
        print(f"T = {args.tokens} over {world} rank(s), {args.tokens // world} tokens each, "
              f"{args.threads} thread(s) per rank, {os.cpu_count()} cores; slowest rank, "
              f"best of {args.repeat}")
        print(f"{'op':<18} {'plain fwd ms':>12} {'CP fwd ms':>10} {'plain fwd+bwd ms':>17} "
              f"{'CP fwd+bwd ms':>14} {'sent fwd B':>11} {'sent bwd B':>11}")
        for name, (plain, fwd, plain_step, step, fwd_bytes, bwd_bytes) in rows:
            print(f"{name:<18} {1e3 * plain:>12.1f} {1e3 * fwd:>10.1f} "
                  f"{1e3 * plain_step:>17.1f} {1e3 * step:>14.1f} {fwd_bytes:>11} "
                  f"{bwd_bytes:>11}")
        if ping is not None:
            print(f"one 32 KB message between two ranks (half a ping-pong): "
                  f"{1e3 * ping:.2f} ms")
        if check is not None:
            print(f"the ranks' agreement check (every call's forward and backward): "
                  f"{1e3 * check:.2f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
