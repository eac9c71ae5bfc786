#!/usr/bin/env python3
"""The functions vLLM's Gated DeltaNet and Mamba2 layers call on the CPU, against the linseq
adapters its plugin routes them to, side by side in one run, per call.

Where vllm_side_by_side.py times the kernels alone, this times what the layer's call costs
either way: vLLM's Python wrappers and C++ kernels, and linseq's adapters with their tensor
preparation and library calls (linseq/integrations/vllm.py; the C++ steps where linseq's C++
kernels are loaded). Family gdn (a Qwen3-Next-like layer: 16 key heads and 32 value heads of
128, its conv of 8192 channels): the fused-gate decode step
(fused_sigmoid_gating_delta_rule_update_cpu) and the decode conv (causal_conv1d_update_cpu,
the weight packed as vLLM packs it on CPUs with AVX512-BF16). Family mamba2 (MambaMixer2):
the prefill scan mamba_chunk_scan_combined_varlen, the CPU backend of its SSU dispatcher for
the decode step, its CPU causal_conv1d_fn and causal_conv1d_update. The tensors are those
the layers pass: bfloat16 activations; for Mamba2, dt, dt_bias and A expanded over headdim
with stride 0 in the decode step, the SSM state pool in --pool's dtype; the conv states in
vLLM's default layout; the GDN state pool in --gdn-pool's dtype (bfloat16 by default; vLLM
serves GDN models on a float32 pool on CPUs with AVX512-BF16). Each round runs each side for
about --seconds per case (vLLM first in odd rounds, last in even ones; one warm-up call first);
the table gives the medians over the rounds and the range of the per-round ratios. The VM's
speed drifts, so only the ratios of one run mean much. Not run by make or CI; about a minute
a family at the defaults.

Run it in the environment scripts/vllm-venv.sh makes, with linseq from this tree:
    make -j2 lib
    PYTHONPATH=python LINSEQ_LIBRARY=build/liblinseq.so \\
        "$(sh scripts/vllm-venv.sh)/bin/python" tools/perf/vllm_calls.py \\
        [--families gdn,mamba2] [--threads 1] [--rounds 5] [--heads 24] [--pool bfloat16] \\
        [--gdn-pool bfloat16]

Threads: torch.set_num_threads(n) for vLLM, linseq.set_num_threads(n) for linseq.
"""
import argparse
import os
import shlex
import statistics
import sys
import time

import torch
import vllm._custom_ops as vllm_ops

import linseq
import linseq.integrations.vllm as linseq_vllm
from vllm.config.mamba import MambaConfig
from vllm.model_executor.layers.mamba.ops.causal_conv1d import (causal_conv1d_fn,
                                                                causal_conv1d_update)
from vllm.model_executor.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined_varlen
from vllm.model_executor.layers.mamba.ops.ssu_dispatch import CPUSSUBackend

from suite_table import cpu_model, fmt_time

HEAD_DIM, DSTATE, GROUPS, WIDTH, SLOTS = 64, 128, 1, 4, 40
BF16 = torch.bfloat16


class Layer:
    """One Mamba2 layer's parameters and random tensors of its shapes."""

    def __init__(self, heads, pool_dtype):
        self.g = torch.Generator().manual_seed(0)
        self.heads, self.pool_dtype = heads, pool_dtype
        self.dim = heads * HEAD_DIM + 2 * GROUPS * DSTATE   # the conv's channels: x, B, C
        self.A = -torch.rand(heads, generator=self.g) * 4 - 1
        self.D = torch.randn(heads, generator=self.g)
        self.dt_bias = torch.randn(heads, generator=self.g) * 0.5
        self.weight, self.bias = self.rand(self.dim, WIDTH, scale=0.5), self.rand(self.dim)

    def rand(self, *shape, scale=1.0, dtype=BF16):
        return (torch.randn(*shape, generator=self.g) * scale).to(dtype)

    def tokens(self, n):
        """x [n, H, P], dt [n, H], B, C [n, G, N]."""
        return (self.rand(n, self.heads, HEAD_DIM), self.rand(n, self.heads, scale=0.5),
                self.rand(n, GROUPS, DSTATE), self.rand(n, GROUPS, DSTATE))

    def conv_pool(self):
        """vLLM's default conv-state layout: [slots, width-1, dim] seen as [slots, dim, width-1]."""
        return self.rand(SLOTS, WIDTH - 1, self.dim).transpose(1, 2)


def packed(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def scan_case(layer, lengths, from_states):
    cu = packed(lengths)
    x, dt, B, C = layer.tokens(sum(lengths))
    initial = (layer.rand(len(lengths), layer.heads, HEAD_DIM, DSTATE, scale=0.3,
                          dtype=layer.pool_dtype) if from_states else None)
    out = torch.empty(x.shape, dtype=BF16)

    def call(fn):
        return lambda: fn(x, dt, layer.A, B, C, 256, cu, None, None, torch.zeros(1), out,
                          D=layer.D, dt_bias=layer.dt_bias, initial_states=initial,
                          dt_softplus=True, state_dtype=layer.pool_dtype)
    name = f"prefill scan, prompts {'+'.join(map(str, lengths))}" + \
        (" from states" if from_states else "")
    return name, call(mamba_chunk_scan_combined_varlen), call(linseq_vllm._ssd_chunk_scan)


def decode_case(layer, batch):
    pool = layer.rand(SLOTS, layer.heads, HEAD_DIM, DSTATE, scale=0.3, dtype=layer.pool_dtype)
    slots = torch.arange(1, batch + 1, dtype=torch.int32)[:, None]
    x, dt, B, C = layer.tokens(batch)
    args = dict(x=x, dt=dt[:, :, None].expand(-1, -1, HEAD_DIM),
                A=layer.A[:, None, None].expand(-1, HEAD_DIM, DSTATE), B=B, C=C,
                D=layer.D[:, None].expand(-1, HEAD_DIM),
                dt_bias=layer.dt_bias[:, None].expand(-1, HEAD_DIM), dt_softplus=True,
                state_batch_indices=slots, dst_state_batch_indices=slots,
                out=torch.empty(x.shape, dtype=BF16))
    vllms = CPUSSUBackend(MambaConfig())
    return (f"decode step, batch {batch}", lambda: vllms(pool, **args),
            lambda: linseq_vllm._ssd_state_update(pool, **args))


def conv_prefill_case(layer, lengths):
    cu, pool = packed(lengths), layer.conv_pool()
    x = layer.rand(sum(lengths), layer.dim).transpose(0, 1)
    slots = torch.arange(1, len(lengths) + 1, dtype=torch.int32)
    has = torch.ones(len(lengths), dtype=torch.bool)

    def call(fn):
        return lambda: fn(x, layer.weight, layer.bias, activation="silu", conv_states=pool,
                          has_initial_state=has, cache_indices=slots, query_start_loc=cu)
    return (f"prefill conv, prompts {'+'.join(map(str, lengths))}", call(causal_conv1d_fn),
            call(linseq_vllm._mixer2_conv_forward))


def conv_decode_case(layer, batch):
    pool, x = layer.conv_pool(), layer.rand(batch, layer.dim)
    slots = torch.arange(1, batch + 1, dtype=torch.int32)[:, None]

    def call(fn):
        return lambda: fn(x, pool, layer.weight, layer.bias, "silu", conv_state_indices=slots)
    return (f"decode conv, batch {batch}", call(causal_conv1d_update),
            call(linseq_vllm._mixer2_conv_update))


GDN_HEADS, GDN_VALUE_HEADS, GDN_DIM = 16, 32, 128   # Qwen3-Next's linear attention


class GdnLayer:
    """One Qwen3-Next-like GDN layer's parameters, vLLM's packing of its conv weight, its
    bfloat16 conv-state pool and its state pool in pool_dtype."""

    def __init__(self, pool_dtype):
        self.g = torch.Generator().manual_seed(1)
        self.dim = 2 * GDN_HEADS * GDN_DIM + GDN_VALUE_HEADS * GDN_DIM
        self.A_log = torch.rand(GDN_VALUE_HEADS, generator=self.g) * 2
        self.dt_bias = self.rand(GDN_VALUE_HEADS, scale=0.5)
        weight = self.rand(self.dim, WIDTH, scale=0.5)
        self.packed = vllm_ops.causal_conv1d_weight_pack(weight.contiguous().clone())
        self.bias = self.rand(self.dim)
        self.pool = self.rand(SLOTS, GDN_VALUE_HEADS, GDN_DIM, GDN_DIM,
                              scale=0.1).to(pool_dtype)

    def rand(self, *shape, scale=1.0):
        return (torch.randn(*shape, generator=self.g) * scale).to(BF16)


def gdn_decode_case(layer, batch):
    r = layer.rand
    args = dict(A_log=layer.A_log, dt_bias=layer.dt_bias,
                q=r(1, batch, GDN_HEADS, GDN_DIM), k=r(1, batch, GDN_HEADS, GDN_DIM),
                v=r(1, batch, GDN_VALUE_HEADS, GDN_DIM), a=r(batch, GDN_VALUE_HEADS),
                b=r(batch, GDN_VALUE_HEADS), initial_state_source=layer.pool,
                initial_state_indices=torch.arange(1, batch + 1, dtype=torch.int32),
                cu_seqlens=torch.arange(batch + 1, dtype=torch.int32),
                use_qk_l2norm_in_kernel=True)
    return (f"GDN decode step, batch {batch}",
            lambda: vllm_ops.fused_sigmoid_gating_delta_rule_update_cpu(**args),
            lambda: linseq_vllm._gated_delta_update(**args))


def gdn_conv_decode_case(layer, batch):
    pool = layer.rand(SLOTS, WIDTH - 1, layer.dim).transpose(1, 2)
    args = dict(x=layer.rand(batch, layer.dim), conv_states=pool, weight=layer.packed,
                bias=layer.bias, silu_activation=True,
                conv_state_indices=torch.arange(1, batch + 1, dtype=torch.int32),
                is_weight_packed=True)
    return (f"GDN decode conv, batch {batch}",
            lambda: vllm_ops.causal_conv1d_update_cpu(**args),
            lambda: linseq_vllm._conv_update(**args))


def gdn_cases(args):
    layer = GdnLayer(getattr(torch, args.gdn_pool))
    return [case(layer, b) for case in (gdn_decode_case, gdn_conv_decode_case)
            for b in (1, 8, 32)]


def mamba2_cases(args):
    layer = Layer(args.heads, getattr(torch, args.pool))
    return [scan_case(layer, [512], False), scan_case(layer, [128] * 4, True),
            scan_case(layer, [16] * 8, True),
            decode_case(layer, 1), decode_case(layer, 8), decode_case(layer, 32),
            conv_prefill_case(layer, [512]), conv_prefill_case(layer, [16] * 8),
            conv_decode_case(layer, 1), conv_decode_case(layer, 8), conv_decode_case(layer, 32)]


def per_call(fn, seconds):
    """Seconds per call over calls lasting about `seconds` (at least 3), after one."""
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and calls >= 3:
            return elapsed / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="gdn,mamba2",
                        help="comma-separated: gdn, mamba2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.15, help="per case, side and round")
    parser.add_argument("--heads", type=int, default=24, help="heads of 64 channels")
    parser.add_argument("--pool", default="bfloat16", choices=("bfloat16", "float32"),
                        help="the SSM state's dtype (vLLM: the model's, or "
                             "--mamba-ssm-cache-dtype)")
    parser.add_argument("--gdn-pool", default="bfloat16", choices=("bfloat16", "float32"),
                        help="the GDN state's dtype (vLLM serves a GDN model on a float32 pool "
                             "where the CPU has AVX512-BF16, its accelerated GDN backend)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    linseq.set_num_threads(args.threads)
    families = {"gdn": gdn_cases, "mamba2": mamba2_cases}
    chosen = args.families.split(",")
    if not set(chosen) <= set(families):
        parser.error(f"--families: expected a comma-separated subset of {sorted(families)}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = ["| routed call | vLLM | linseq | vLLM / linseq |", "|---|---|---|---|"]
    for name, vllms, ours in [c for f in chosen for c in families[f](args)]:
        times = {"vllm": [], "linseq": []}
        for r in range(args.rounds):
            for side, fn in ((("vllm", vllms), ("linseq", ours))[::1 if r % 2 == 0 else -1]):
                times[side].append(per_call(fn, args.seconds))
        ratios = [v / o for v, o in zip(times["vllm"], times["linseq"])]
        v, o = statistics.median(times["vllm"]), statistics.median(times["linseq"])
        rows.append(f"| {name} | {fmt_time(v)} | {fmt_time(o)} | {v / o:.2f}x "
                    f"({min(ratios):.2f}x-{max(ratios):.2f}x) |")
        print(rows[-1], file=sys.stderr)
    command = "PYTHONPATH=python LINSEQ_LIBRARY=build/liblinseq.so $VENV/bin/python " + \
        shlex.join(["tools/perf/vllm_calls.py", *sys.argv[1:]])
    print(f"{cpu_model()}, {args.threads} thread(s), load average {load} before; GDN: "
          f"{GDN_HEADS} and {GDN_VALUE_HEADS} heads of {GDN_DIM}, {args.gdn_pool} pool; Mamba2: "
          f"{args.heads} heads of {HEAD_DIM}, dstate {DSTATE}, {GROUPS} group, "
          f"{args.pool} SSM state pool; bfloat16 activations. Medians "
          f"over {args.rounds} alternating rounds; the ratio's range over the rounds (above "
          f"1: linseq faster).\n\n" + "\n".join(rows) + f"\n\n`{command}`")


if __name__ == "__main__":
    main()
