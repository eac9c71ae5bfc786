"""linseq's CUDA kernels next to fla-core's Triton chunk_kda, and the machine's two ceilings.

Run by tools/gpu/run.sh on the GPU machine: liblinseq built with CUDA (LINSEQ_LIBRARY),
python/ and third_party/fla on PYTHONPATH. Every timing is the median of CUDA-event timed
repeats after a warm-up; inputs that fit in L2 are rotated among several sets. Writes
bench.json to --out and prints one table last.

  KDA: bf16 q, k, v, g (per-channel log decay), beta, qk L2 norm in the kernel, default
       scale, no initial or final state: fla's benchmark setting, on fla's shapes.
  SSM1: Mamba-1.4b's scan, D = 4096, N = 16, T = 2048, B = 8, with the gate, against the
       time to read its inputs and write its output once at the measured copy bandwidth.
"""

import argparse
import ctypes
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

from linseq import _lib

KDA_SHAPES = [(1, 8192, 96, 128), (2, 16384, 16, 128), (4, 2048, 16, 128),
              (4, 4096, 64, 128), (8, 1024, 8, 64), (8, 2048, 32, 256)]
L2_BYTES = 60 * 2**20


def median_ms(fn, sets=1, warmup=3, repeat=20):
    """Median over `repeat` event-timed calls of fn(i % sets)."""
    for i in range(warmup):
        fn(i % sets)
    torch.cuda.synchronize()
    times = []
    for i in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i % sets)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times), min(times), max(times)


def ceilings():
    n = 2**30  # 1 GiB each way
    src = torch.randn(n // 4, device="cuda")
    dst = torch.empty_like(src)
    copy_ms, _, _ = median_ms(lambda i: dst.copy_(src))
    copy_gbs = 2 * n / (copy_ms * 1e-3) / 1e9
    del src, dst
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    mm_ms, _, _ = median_ms(lambda i: a @ b, repeat=10)
    mm_tflops = 2 * m**3 / (mm_ms * 1e-3) / 1e12
    return {"copy_GBps": copy_gbs, "bf16_matmul_TFLOPs": mm_tflops}


def stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def cuda_exec(bf16, mode=_lib.MODE_CHUNKED, chunk=64):
    return _lib.Exec(mode=mode, chunk_size=chunk, threads=0, device=1, device_index=0,
                     stream=stream(), dtype=1 if bf16 else 0)


def ptr(t):
    return None if t is None else t.data_ptr()


def kda_problem(q, k, v, g, beta):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    return _lib.KdaProblem(B=B, T=T, H=H, HV=HV, K=K, V=V, q=ptr(q), k=ptr(k), v=ptr(v),
                           beta=ptr(beta), g=ptr(g), decay=_lib.DECAY_PER_CHANNEL,
                           qk_l2norm=True)


def linseq_kda_forward(inputs, o, ex):
    prob = kda_problem(*inputs)
    _lib.check(_lib.lib.linseq_kda_forward(ctypes.byref(prob), ctypes.byref(ex), ptr(o), None))


def linseq_kda_backward(inputs, d_o, grads, ex):
    prob = kda_problem(*inputs)
    gr = _lib.KdaGrads(dq=ptr(grads[0]), dk=ptr(grads[1]), dv=ptr(grads[2]),
                       dg=ptr(grads[3]), dbeta=ptr(grads[4]))
    _lib.check(_lib.lib.linseq_kda_backward(ctypes.byref(prob), ctypes.byref(ex), ptr(d_o),
                                            None, ctypes.byref(gr)))


def kda_inputs(B, T, H, D, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)
    q = rnd(B, T, H, D).to(dtype)
    k = rnd(B, T, H, D).to(dtype)
    v = rnd(B, T, H, D).to(dtype)
    g = F.logsigmoid(rnd(B, T, H, D)).to(dtype)
    beta = torch.sigmoid(rnd(B, T, H)).to(dtype)
    return [q, k, v, g, beta]


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def bench_kda(results, fla_chunk_kda):
    for (B, T, H, D) in KDA_SHAPES:
        row = {"shape": [B, T, H, D]}
        per_set = 5 * B * T * H * D * 2
        sets = max(1, min(4, math.ceil(3 * L2_BYTES / per_set)))
        data = [kda_inputs(B, T, H, D, torch.bfloat16, s) for s in range(sets)]
        o = torch.empty(B, T, H, D, device="cuda", dtype=torch.bfloat16)
        ex = cuda_exec(True)
        # correctness on the device first: bf16 linseq against fla and against linseq fp32
        linseq_kda_forward(data[0], o, ex)
        ref32 = torch.empty(B, T, H, D, device="cuda")
        linseq_kda_forward([t.float() for t in data[0]], ref32, cuda_exec(False))
        row["rel_err_bf16_vs_fp32"] = rel_err(o, ref32)
        if fla_chunk_kda is not None:
            o_fla, _ = fla_chunk_kda(*data[0][:3], data[0][3], data[0][4],
                                     use_qk_l2norm_in_kernel=True)
            row["rel_err_vs_fla"] = rel_err(o, o_fla)
            row["fla_fwd_ms"] = median_ms(
                lambda i: fla_chunk_kda(data[i][0], data[i][1], data[i][2], data[i][3],
                                        data[i][4], use_qk_l2norm_in_kernel=True), sets)[0]
        row["linseq_fwd_ms"] = median_ms(lambda i: linseq_kda_forward(data[i], o, ex), sets)[0]

        d_o = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
        grads = [torch.empty_like(t) for t in data[0]]

        def linseq_step(i):
            linseq_kda_forward(data[i], o, ex)
            linseq_kda_backward(data[i], d_o, grads, ex)
        row["linseq_fwdbwd_ms"] = median_ms(linseq_step, sets, repeat=10)[0]
        if fla_chunk_kda is not None:
            leaves = [[t.clone().requires_grad_(True) for t in s] for s in data]

            def fla_step(i):
                q, k, v, g, beta = leaves[i]
                out, _ = fla_chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
                out.backward(d_o)
            row["fla_fwdbwd_ms"] = median_ms(fla_step, sets, repeat=10)[0]
            del leaves
        results["kda"].append(row)
        print(json.dumps(row), flush=True)
        del data, o, ref32, grads, d_o
        torch.cuda.empty_cache()


def bench_ssm1(results, copy_gbs):
    B, T, D, N = 8, 2048, 4096, 16
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator(device="cuda").manual_seed(7)
        x = torch.randn(B, T, D, device="cuda", generator=gen).to(dtype)
        z = torch.randn(B, T, D, device="cuda", generator=gen).to(dtype)
        dt = F.softplus(torch.randn(B, T, D, device="cuda", generator=gen) - 4).to(dtype)
        Bp = torch.randn(B, T, N, device="cuda", generator=gen).to(dtype)
        Cp = torch.randn(B, T, N, device="cuda", generator=gen).to(dtype)
        A = -torch.exp(torch.randn(D, N, device="cuda", generator=gen))
        Dk = torch.randn(D, device="cuda", generator=gen)
        y = torch.empty(B, T, D, device="cuda", dtype=dtype)
        hT = torch.empty(B, D, N, device="cuda")
        prob = _lib.Ssm1Problem(B=B, T=T, D=D, N=N, G=1, x=ptr(x), dt=ptr(dt), A=ptr(A),
                                B_proj=ptr(Bp), C_proj=ptr(Cp), D_skip=ptr(Dk), gate=ptr(z))
        ex = cuda_exec(dtype == torch.bfloat16)

        def run(i):
            _lib.check(_lib.lib.linseq_ssm1_forward(ctypes.byref(prob), ctypes.byref(ex),
                                                    ptr(y), ptr(hT)))
        ms = median_ms(run)[0]
        el = x.element_size()
        moved = el * (4 * B * T * D + 2 * B * T * N) + 4 * (D * N + D + B * D * N)
        floor_ms = moved / (copy_gbs * 1e9) * 1e3
        row = {"dtype": str(dtype).split(".")[-1], "ms": ms, "floor_ms": floor_ms,
               "ratio": ms / floor_ms}
        results["ssm1"].append(row)
        print(json.dumps(row), flush=True)


def table(results):
    c = results["ceilings"]
    lines = [f"ceilings: copy {c['copy_GBps']:.0f} GB/s, bf16 matmul "
             f"{c['bf16_matmul_TFLOPs']:.0f} TFLOP/s",
             "KDA chunked, bf16 (ms, median)          fwd: linseq   fla   speedup | "
             "fwd+bwd: linseq   fla   speedup | err vs fla"]
    for r in results["kda"]:
        def sp(a, b):
            return f"{r[b] / r[a]:6.2f}x" if a in r and b in r else "   n/a "
        lines.append(
            f"  (B,T,H,D) = {str(tuple(r['shape'])):22s}  {r['linseq_fwd_ms']:8.3f} "
            f"{r.get('fla_fwd_ms', float('nan')):7.3f} {sp('linseq_fwd_ms', 'fla_fwd_ms')} | "
            f"{r['linseq_fwdbwd_ms']:8.3f} {r.get('fla_fwdbwd_ms', float('nan')):7.3f} "
            f"{sp('linseq_fwdbwd_ms', 'fla_fwdbwd_ms')} | {r.get('rel_err_vs_fla', float('nan')):.2e}")
    for r in results["ssm1"]:
        lines.append(f"SSM1 fwd D=4096 N=16 T=2048 B=8 {r['dtype']}: {r['ms']:.3f} ms, "
                     f"memory floor {r['floor_ms']:.3f} ms, {r['ratio']:.2f}x the floor")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        from fla.ops.kda import chunk_kda as fla_chunk_kda
    except Exception as exc:  # noqa: BLE001 - report and time linseq alone
        print(f"fla-core not importable ({exc}); timing linseq alone", file=sys.stderr)
        fla_chunk_kda = None
    results = {"device": torch.cuda.get_device_name(), "kda": [], "ssm1": []}
    results["ceilings"] = ceilings()
    print(json.dumps(results["ceilings"]), flush=True)
    for part in (bench_kda, bench_ssm1):
        try:
            if part is bench_ssm1:
                part(results, results["ceilings"]["copy_GBps"])
            else:
                part(results, fla_chunk_kda)
        except Exception as exc:  # noqa: BLE001 - keep the other part's numbers
            print(f"{part.__name__} failed: {exc!r}", file=sys.stderr)
            results[f"{part.__name__}_error"] = repr(exc)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(table(results))


if __name__ == "__main__":
    main()
