"""Per-call time of the decode entries: linseq (through the transformers adapters) vs
transformers' own PyTorch fallback for the same call, side by side in one process.

A decode step of Mamba makes one causal_conv1d_update and one selective state update per
layer, Kimi Linear and Qwen3-Next one causal_conv1d_update and one recurrent delta rule
(T = 1) per linear-attention layer; at batch 1 these calls are short enough that their
Python cost decides whether linseq's step is faster than the fallback's. Each row is the
median over --repeat timed calls (after warm-up) of the same call, in microseconds; "library"
is the same work as one call of the C entry point alone (its struct filled beforehand, called
through ctypes, about a microsecond of that), so that linseq - library is what the call costs
around the kernel (the overhead), read off one run. The recurrent delta rules return a new
final state; their library call writes one as well (allocated at each call, as the function
must), and "same out" gives the same call writing into one buffer every time, a cost no
caller of the function can have: the difference is the cache, not the call.

    python tools/decode_call_overhead.py [--batch 1] [--threads 2] [--repeat 300] [--ops]

--ops adds the decode custom ops themselves (kda_decode, conv_state_update,
mamba_state_update) at the models' sizes: "C++" the op called through torch's dispatch (its
C++ CPU kernel after torch.library's Python autograd and in-place kernels), "eager" the same
kernel called as the drop-ins call it on plain tensors (_torch_ops.eager_entry), "Python" the
op's Python body (linseq::<op>_fallback).

At the defaults it took 26 s on a 2-core machine (load average near 4).
"""

import argparse
import ctypes
import inspect
import statistics
import time

import torch

import linseq
from linseq import _lib, _torch_direct, ops
from linseq.integrations import transformers as linseq_hf


def _median_us(fn, repeat):
    for _ in range(max(10, repeat // 10)):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def _fallback(module_name, function_name):
    """transformers' PyTorch function itself, whatever is routed now."""
    module = __import__(module_name, fromlist=[function_name])
    fn = linseq_hf._resolved.get((module_name, function_name), getattr(module, function_name))
    return inspect.unwrap(fn)


def _mamba_calls(b, dim=2048, dstate=16, width=4):
    """Mamba at hidden 1024 (intermediate 2048, state 16, conv width 4), as the layer calls."""
    module = "transformers.models.mamba.modeling_mamba"
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    state = r(b, dim, dstate) * 0.1
    x, dt, z = r(b, dim), r(b, dim) * 0.1, r(b, dim)
    A = -torch.rand(dim, dstate, generator=g)
    Bp, Cp, D, dt_bias = r(b, dstate), r(b, dstate), r(dim), r(dim) * 0.1
    conv_state, xc = r(b, dim, width), r(b, dim, 1)
    weight, bias = r(dim, width), r(dim)

    def ssm(fn):
        return lambda: fn(state, x, dt, A, Bp, Cp, D, dt_bias=dt_bias, dt_softplus=True, z=z)

    def conv(fn):
        return lambda: fn(xc, conv_state, weight, bias, activation="silu")

    return [("mamba selective_state_update", ssm(linseq_hf._mamba_state_update),
             ssm(_fallback(module, "mamba_selective_state_update")),
             _ssm_library(state, x, dt, A, Bp, Cp, D, z, dt_bias), None),
            ("mamba causal_conv1d_update", conv(linseq_hf._conv_update),
             conv(_fallback(module, "causal_conv1d_update")),
             _conv_library(xc, conv_state, weight, bias), None)]


def _ssm_library(state, x, dt, A, Bp, Cp, D, z, dt_bias):
    """linseq_ssm1_decode alone on a copy of the state (one row per request)."""
    b, dim, dstate = state.shape
    pool, y = state.clone(), torch.empty(b, dim)
    problem = _torch_direct.ssm1_problem(b, dim, dstate, 1, x, dt, A, Bp[:, None], Cp[:, None],
                                         D, z, dt_bias, True)
    return lambda: _lib.lib.linseq_ssm1_decode(ctypes.byref(problem),
                                               ctypes.byref(_torch_direct._EXEC),
                                               pool.data_ptr(), b, None, y.data_ptr())


def _conv_library(xc, conv_state, weight, bias):
    """linseq_conv1d_decode alone on a copy of the rows [b, dim, width]."""
    b, dim, state_len = conv_state.shape
    pool, y = conv_state.clone(), torch.empty(b, dim, 1)
    problem = _torch_direct.conv1d_problem(b, dim, 1, weight.shape[1], xc, weight, bias, "silu",
                                           True)
    return lambda: _lib.lib.linseq_conv1d_decode(ctypes.byref(problem),
                                                 ctypes.byref(_torch_direct._EXEC),
                                                 pool.data_ptr(), b, state_len, None, None,
                                                 y.data_ptr())


_RECURRENT = ops.make_exec("recurrent", 64)


def _kda_library(q, k, v, decay, beta, state, per_channel):
    """linseq_kda_forward alone: one token from the initial state into a new final state,
    as fla's recurrent call leaves its initial state as it was. Two callables: the outputs
    new at each call (torch.empty), as the function returns them, which is the library
    column; and the same outputs at every call, the "same out" column. Their difference is
    where the new state lands, not the call: a state written over the buffer of the call
    before stays in the cache, a new one is written to lines that are not (8 us at
    Qwen3-Next's 1 MiB state, 2-core Xeon)."""
    B, _, H, K = q.shape
    HV, V = v.shape[2:]
    problem = _lib.KdaProblem(
        B=B, T=1, H=H, HV=HV, K=K, V=V, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(),
        beta=beta.data_ptr(), g=decay.data_ptr(), h0=state.data_ptr(), qk_l2norm=True,
        decay=_lib.DECAY_PER_CHANNEL if per_channel else _lib.DECAY_PER_HEAD)

    def into(o, ht):
        _lib.lib.linseq_kda_forward(ctypes.byref(problem), ctypes.byref(_RECURRENT),
                                    o.data_ptr(), ht.data_ptr())
        return o, ht

    o, ht = torch.empty(B, 1, HV, V), torch.empty_like(state)
    return (lambda: into(torch.empty(B, 1, HV, V), torch.empty_like(state)),
            lambda: into(o, ht))


def _delta_calls(b, name, module, function, adapter, heads, value_heads, dk, dv, per_channel):
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q, k = r(b, 1, heads, dk), r(b, 1, heads, dk)
    v = r(b, 1, value_heads, dv)
    decay = -torch.rand(b, 1, value_heads, *((dk,) if per_channel else ()), generator=g)
    beta = torch.rand(b, 1, value_heads, generator=g)
    state = r(b, value_heads, dk, dv) * 0.1

    def call(fn):
        return lambda: fn(q, k, v, g=decay, beta=beta, initial_state=state,
                          output_final_state=True, use_qk_l2norm_in_kernel=True)

    conv_dim = 2 * heads * dk + value_heads * dv
    conv_state, xc = r(b, conv_dim, 4), r(b, conv_dim, 1)
    weight = r(conv_dim, 4)

    def conv(fn):
        return lambda: fn(xc, conv_state, weight, None, activation="silu")

    return [(f"{name} {function}", call(adapter), call(_fallback(module, function)),
             *_kda_library(q, k, v, decay, beta, state, per_channel)),
            (f"{name} causal_conv1d_update", conv(linseq_hf._conv_update),
             conv(_fallback(module, "causal_conv1d_update")),
             _conv_library(xc, conv_state, weight, None), None)]


def calls(b):
    return (_mamba_calls(b)
            + _delta_calls(b, "kimi", "transformers.models.kimi_linear.modeling_kimi_linear",
                           "recurrent_kimi_delta_attention", linseq_hf._kda_recurrent,
                           16, 16, 64, 64, per_channel=True)
            + _delta_calls(b, "qwen3-next", "transformers.models.qwen3_next.modeling_qwen3_next",
                           "torch_recurrent_gated_delta_rule", linseq_hf._gdn_recurrent,
                           8, 16, 128, 128, per_channel=False))


def _op_calls(b):
    """The decode custom ops themselves at the models' sizes (torch.ops.linseq.*: their C++
    CPU kernels where built, linseq._torch_native), beside the same call of the op's Python
    body (linseq::<op>_fallback), each pool updated in place."""
    from linseq import _torch_native
    if not _torch_native.AVAILABLE:
        print(f"(no C++ kernels: {_torch_native.WHY_NOT}; op rows skipped)")
        return []
    g = torch.Generator().manual_seed(2)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    rows = torch.arange(b)
    calls = []
    for dim in (2048, 3072, 4096):  # Mamba's, Kimi's and Qwen3-Next's conv channels
        args = (r(b, dim, 1), r(b, dim, 3), r(dim, 4), None, "silu", None, rows)
        calls.append((f"conv_state_update dim {dim}", "conv_state_update", args))
    dim, n = 2048, 16
    args = (r(b, 1, dim, n) * 0.1, rows, r(b, dim), r(b, dim) * 0.1, -torch.rand(dim, n),
            r(b, 1, n), r(b, 1, n), r(dim), r(b, dim), r(dim) * 0.1, True)
    calls.append((f"mamba_state_update dim {dim} N {n}", "mamba_state_update", args))
    for heads, value_heads, k in ((16, 16, 64), (8, 16, 128)):  # Kimi's, Qwen3-Next's
        args = (r(b, 1, heads, k), r(b, 1, heads, k), r(b, 1, value_heads, k),
                torch.rand(b, 1, value_heads), -torch.rand(b, 1, value_heads, k), None, None,
                None, r(b, value_heads, k, k) * 0.1, rows, None, True, False, False, False,
                None, "recurrent", 64, False)
        calls.append((f"kda_decode HV {value_heads} K=V {k}", "kda_decode", args))
    from linseq import _torch_ops
    return [(label, [lambda op=getattr(torch.ops.linseq, name), a=args: op(*a),
                     lambda op=_torch_ops.eager_entry(name), a=args: op(*a),
                     lambda op=getattr(torch.ops.linseq, name + "_fallback"), a=args: op(*a)])
            for label, name, args in calls]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--ops", action="store_true",
                        help="also time the decode custom ops themselves (C++ kernel vs "
                             "the op's Python body)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    linseq_hf.enable()  # imports the drop-ins the adapters call; the fallbacks are unwrapped
    linseq.set_num_threads(args.threads)
    print(f"batch {args.batch}, {args.threads} threads, median of {args.repeat} calls, "
          f"microseconds per call")
    print(f"{'call':46s} {'linseq':>9s} {'library':>9s} {'overhead':>9s} {'fallback':>9s} "
          f"{'speedup':>8s} {'same out':>9s}")
    with torch.no_grad():
        for label, ours, theirs, library, same_out in calls(args.batch):
            t_ours, t_lib = _median_us(ours, args.repeat), _median_us(library, args.repeat)
            t_theirs = _median_us(theirs, args.repeat)
            t_same = f"{_median_us(same_out, args.repeat):9.1f}" if same_out else ""
            print(f"{label:46s} {t_ours:9.1f} {t_lib:9.1f} {t_ours - t_lib:9.1f} "
                  f"{t_theirs:9.1f} {t_theirs / t_ours:7.2f}x {t_same}")
        if args.ops:
            print(f"\n{'op (torch.ops.linseq.*)':46s} {'C++':>9s} {'eager':>9s} "
                  f"{'Python':>9s}")
            for label, fns in _op_calls(args.batch):
                times = [_median_us(fn, args.repeat) for fn in fns]
                print(f"{label:46s} " + " ".join(f"{t:9.1f}" for t in times))


if __name__ == "__main__":
    main()
