"""A JAX soak outside the test suite: N calls of linseq.jax.chunk_kda, each with a new
`scale`, printing the resident memory as it goes. With the float options as callback
operands it stays flat; when they keyed a cache it grew by about 1 MB a call.

    python tests/soak_jax_scale.py [N]     (default 20000)
"""

import sys
import time

import numpy as np


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(n_calls):
    import jax.numpy as jnp
    import linseq.jax as lj
    rng = np.random.default_rng(0)
    B, T, H, K, V = 1, 16, 2, 16, 16
    a = [jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in
         ((B, T, H, K), (B, T, H, K), (B, T, H, V))]
    g = jnp.asarray(-rng.random((B, T, H, K)).astype(np.float32))
    beta = jnp.asarray(rng.random((B, T, H)).astype(np.float32))
    step = max(1, n_calls // 10)
    start = time.time()
    for i in range(n_calls):
        o, _ = lj.chunk_kda(*a, g, beta, scale=0.05 + i * 1e-6)
        o.block_until_ready()
        if i == 99:
            print(f"after 100 calls: RSS {rss_mb():.0f} MB", flush=True)
        if (i + 1) % step == 0:
            per_call_ms = (time.time() - start) / (i + 1) * 1e3
            print(f"{i + 1} calls: RSS {rss_mb():.0f} MB, {per_call_ms:.1f} ms a call",
                  flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20000)
