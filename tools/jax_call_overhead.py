#!/usr/bin/env python3
"""The cost of one linseq call from JAX, on each of linseq.jax's two paths: the XLA FFI custom
calls and the jax.pure_callback fallback. Tiny problems, so that the time is the call's own
overhead rather than the kernels': a KDA decode step (one token for B requests against a
pool) and a KDA forward of a few tokens, each called eagerly (one Python call per step, as a
serving loop does) and inside one jitted step function.

    python3 tools/jax_call_overhead.py [--repeat 2000] [--threads 1]

At the defaults it took 3 minutes on a 2-core machine (load average near 6, the fallback
path only: no handler library).

Each figure is the median over --repeat calls of the wall time per call (results waited for),
in microseconds, after a warm-up that compiles everything. Both paths run in one process, in
alternating rounds, so that the machine's other load affects them alike. The FFI path needs
the handler library (see linseq._jax_ffi); without it only the fallback is timed.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import linseq
import linseq.jax as lj

try:
    from linseq import _jax_ffi
except ImportError:  # a linseq from before the FFI path: its pure_callback calls alone
    _jax_ffi = None
try:
    from linseq import _jax_backend as _paths  # where the path in use is set
except ImportError:  # a linseq from before the JAX backend had its own module
    _paths = lj


def _problems(B=4, T=4, H=2, K=16, V=16, R=8):
    rng = np.random.default_rng(0)
    f = np.float32

    def arrays(tokens):
        return [jnp.asarray(a) for a in (
            rng.standard_normal((B, tokens, H, K)).astype(f),
            rng.standard_normal((B, tokens, H, K)).astype(f),
            rng.standard_normal((B, tokens, H, V)).astype(f),
            -rng.random((B, tokens, H, K)).astype(f), rng.random((B, tokens, H)).astype(f))]

    pool = jnp.asarray(rng.standard_normal((R, H, K, V)).astype(f))
    rows = jnp.arange(B, dtype=jnp.int32)
    step = arrays(1)

    def decode():
        return lj.kda_decode(*step, pool, rows, use_qk_l2norm_in_kernel=True)

    prefix = arrays(T)

    def forward():
        return lj.chunk_kda(*prefix, use_qk_l2norm_in_kernel=True, output_final_state=True)

    jit_decode = jax.jit(lambda s, p, r: lj.kda_decode(*s, p, r, use_qk_l2norm_in_kernel=True))
    jit_forward = jax.jit(lambda a: lj.chunk_kda(*a, use_qk_l2norm_in_kernel=True,
                                                 output_final_state=True))
    return {f"decode step B={B} H={H} K={K} V={V}, eager": decode,
            "decode step, in jax.jit": lambda: jit_decode(step, pool, rows),
            f"forward T={T} B={B}, eager": forward,
            "forward, in jax.jit": lambda: jit_forward(prefix)}


def _time(fn, n):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1, help="linseq's threads (0: all)")
    args = parser.parse_args()
    linseq.set_num_threads(args.threads)
    paths = ["callback"] + (["ffi"] if _jax_ffi and _jax_ffi.AVAILABLE else [])
    cases = {}
    for path in paths:  # the jitted functions trace per path: one set of callables each
        _paths._CALLS = path
        cases[path] = _problems()
        for fn in cases[path].values():
            _time(fn, 20)
    times = {(p, c): [] for p in paths for c in cases[paths[0]]}
    rounds = 10
    for _ in range(rounds):
        for path in paths:
            _paths._CALLS = path  # (an unused attribute on a linseq without the FFI path)
            for case, fn in cases[path].items():
                times[path, case] += _time(fn, max(1, args.repeat // rounds))
    print(f"jax {jax.__version__}, linseq threads {args.threads}, median of {args.repeat} calls, "
          "microseconds per call")
    if _jax_ffi is None or not _jax_ffi.AVAILABLE:
        print(f"(no FFI handlers: {_jax_ffi.WHY_NOT if _jax_ffi else 'a linseq without them'})")
    header = f"{'call':40s} " + " ".join(f"{p:>10s}" for p in paths)
    print(header + ("   callback/ffi" if len(paths) == 2 else ""))
    for case in cases[paths[0]]:
        med = [statistics.median(times[p, case]) * 1e6 for p in paths]
        ratio = f"   {med[0] / med[1]:10.1f}x" if len(med) == 2 else ""
        print(f"{case:40s} " + " ".join(f"{m:10.1f}" for m in med) + ratio)


if __name__ == "__main__":
    main()
