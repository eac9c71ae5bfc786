"""linseq's CUDA kernels next to fla-core's Triton chunk_kda, and the machine's two ceilings.

Run by tools/gpu/run.sh on the GPU machine: liblinseq built with CUDA (LINSEQ_LIBRARY),
python/ and third_party/fla on PYTHONPATH. Every timing is the median of CUDA-event timed
repeats after a warm-up; inputs that fit in L2 are rotated among several sets. linseq's rows
come first, fla-core's after (its first calls, Triton's autotuning and compiling, timed
apart); each row runs on its own (a failure is that row's "error") and is printed and
written to --out/bench.json as it ends; no row starts past --budget-s. One table last.

  KDA: bf16 q, k, v, g (per-channel log decay), beta, qk L2 norm in the kernel, default
       scale, no initial or final state: fla's benchmark setting, on fla's shapes.
  SSM1: Mamba-1.4b's scan, D = 4096, N = 16, T = 2048, B = 8, with the gate, against the
       time to read its inputs and write its output once at the measured copy bandwidth.
"""

import argparse
import ctypes
import functools
import json
import math
import os
import statistics
import sys
import time

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


def linseq_kda_row(B, T, H, D):
    """linseq alone at one shape: bf16 forward against its own fp32, forward and fwd+bwd times."""
    row = {"shape": [B, T, H, D]}
    data, sets = kda_data(B, T, H, D)
    o = torch.empty(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    ex = cuda_exec(True)
    # correctness on the device first: bf16 against fp32, both linseq
    linseq_kda_forward(data[0], o, ex)
    ref32 = torch.empty(B, T, H, D, device="cuda")
    linseq_kda_forward([t.float() for t in data[0]], ref32, cuda_exec(False))
    row["rel_err_bf16_vs_fp32"] = rel_err(o, ref32)
    row["linseq_fwd_ms"] = median_ms(lambda i: linseq_kda_forward(data[i], o, ex), sets)[0]
    d_o = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    grads = [torch.empty_like(t) for t in data[0]]

    def step(i):
        linseq_kda_forward(data[i], o, ex)
        linseq_kda_backward(data[i], d_o, grads, ex)
    row["linseq_fwdbwd_ms"] = median_ms(step, sets, repeat=10)[0]
    return row


def fla_kda_row(B, T, H, D, fla_chunk_kda):
    """fla-core at one shape: its first calls (Triton autotuning and compiling) timed apart
    from the median of the later ones, and its output against linseq's."""
    row = {"shape": [B, T, H, D]}
    data, sets = kda_data(B, T, H, D)

    def fwd(i):
        q, k, v, g, beta = data[i]
        return fla_chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]
    start = time.perf_counter()
    o_fla = fwd(0)
    torch.cuda.synchronize()
    row["fla_first_fwd_s"] = time.perf_counter() - start
    try:
        o = torch.empty(B, T, H, D, device="cuda", dtype=torch.bfloat16)
        linseq_kda_forward(data[0], o, cuda_exec(True))
        row["rel_err_vs_fla"] = rel_err(o, o_fla)
    except Exception as exc:  # noqa: BLE001 - fla's times still count
        row["rel_err_vs_fla_error"] = repr(exc)
    row["fla_fwd_ms"] = median_ms(fwd, sets)[0]
    d_o = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    leaves = [[t.clone().requires_grad_(True) for t in s] for s in data]

    def step(i):
        q, k, v, g, beta = leaves[i]
        out, _ = fla_chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        out.backward(d_o)
    start = time.perf_counter()
    step(0)
    torch.cuda.synchronize()
    row["fla_first_fwdbwd_s"] = time.perf_counter() - start
    row["fla_fwdbwd_ms"] = median_ms(step, sets, repeat=10)[0]
    return row


def kda_data(B, T, H, D):
    """Input sets for one shape, as many as keep the rotated sets out of L2."""
    per_set = 5 * B * T * H * D * 2
    sets = max(1, min(4, math.ceil(3 * L2_BYTES / per_set)))
    return [kda_inputs(B, T, H, D, torch.bfloat16, s) for s in range(sets)], sets


def ssm1_row(dtype, copy_gbs):
    B, T, D, N = 8, 2048, 4096, 16
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
    row = {"dtype": str(dtype).split(".")[-1], "ms": ms}
    if copy_gbs:
        row["floor_ms"] = moved / (copy_gbs * 1e9) * 1e3
        row["ratio"] = ms / row["floor_ms"]
    return row


def table(results):
    c = results.get("ceilings", {})
    lines = [f"ceilings: copy {c.get('copy_GBps', float('nan')):.0f} GB/s, bf16 matmul "
             f"{c.get('bf16_matmul_TFLOPs', float('nan')):.0f} TFLOP/s",
             "KDA chunked, bf16 (ms, median)          fwd: linseq   fla   speedup | "
             "fwd+bwd: linseq   fla   speedup | err vs fla | fla 1st call s"]
    fla = {tuple(r["shape"]): r for r in results["kda_fla"]}
    nan = float("nan")
    for lr in results["kda"]:
        fr = fla.get(tuple(lr["shape"]), {})
        r = {k: v for k, v in fr.items() if k not in ("error", "skipped")}
        r.update(lr)

        def sp(a, b):
            return f"{r[b] / r[a]:6.2f}x" if a in r and b in r else "   n/a "
        if "error" in r or "skipped" in r:
            lines.append(f"  (B,T,H,D) = {str(tuple(r['shape'])):22s}  "
                         f"{r.get('error', r.get('skipped'))}")
            continue
        lines.append(
            f"  (B,T,H,D) = {str(tuple(r['shape'])):22s}  {r['linseq_fwd_ms']:8.3f} "
            f"{r.get('fla_fwd_ms', nan):7.3f} {sp('linseq_fwd_ms', 'fla_fwd_ms')} | "
            f"{r['linseq_fwdbwd_ms']:8.3f} {r.get('fla_fwdbwd_ms', nan):7.3f} "
            f"{sp('linseq_fwdbwd_ms', 'fla_fwdbwd_ms')} | {r.get('rel_err_vs_fla', nan):.2e} | "
            f"{r.get('fla_first_fwd_s', nan):.1f} {r.get('fla_first_fwdbwd_s', nan):.1f}"
            f"{'  fla: ' + str(fr.get('error', fr.get('skipped'))) if fr.keys() & {'error', 'skipped'} else ''}")
    for r in results["ssm1"]:
        if "ms" not in r:
            lines.append(f"SSM1 {r.get('dtype')}: {r.get('error', r.get('skipped'))}")
            continue
        lines.append(f"SSM1 fwd D=4096 N=16 T=2048 B=8 {r['dtype']}: {r['ms']:.3f} ms, "
                     f"memory floor {r.get('floor_ms', nan):.3f} ms, "
                     f"{r.get('ratio', nan):.2f}x the floor")
    return "\n".join(lines)


class Rows:
    """The results, printed and written to bench.json as each row ends, so that a run cut
    short still leaves every finished row; no new row starts past the deadline."""

    def __init__(self, out, budget_s):
        self.path = os.path.join(out, "bench.json")
        self.deadline = time.monotonic() + budget_s
        self.results = {"device": torch.cuda.get_device_name(), "ceilings": {}, "kda": [],
                        "ssm1": [], "kda_fla": []}
        self.save()

    def save(self):
        with open(self.path, "w") as f:
            json.dump(self.results, f, indent=1)

    def run(self, section, key, fn):
        """Appends fn()'s row to section; an exception or the deadline makes the row say so."""
        if time.monotonic() > self.deadline:
            row = dict(key, skipped="budget spent")
        else:
            try:
                row = dict(key, **fn())
            except Exception as exc:  # noqa: BLE001 - keep the other rows
                row = dict(key, error=repr(exc))
            torch.cuda.empty_cache()
        self.results[section].append(row)
        print(json.dumps({section: row}), flush=True)
        self.save()
        return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--budget-s", type=float, default=200,
                    help="start no new row after this many seconds")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = Rows(args.out, args.budget_s)
    try:
        rows.results["ceilings"] = ceilings()
    except Exception as exc:  # noqa: BLE001 - the rows without their ceilings
        rows.results["ceilings"] = {"error": repr(exc)}
    print(json.dumps(rows.results["ceilings"]), flush=True)
    rows.save()
    # linseq's rows first: they are the point of the session; fla's after
    for shape in KDA_SHAPES:
        rows.run("kda", {"shape": list(shape)}, functools.partial(linseq_kda_row, *shape))
    copy_gbs = rows.results["ceilings"].get("copy_GBps")
    for dtype in (torch.float32, torch.bfloat16):
        rows.run("ssm1", {"dtype": str(dtype).split(".")[-1]},
                 functools.partial(ssm1_row, dtype, copy_gbs))
    try:
        from fla.ops.kda import chunk_kda as fla_chunk_kda
    except Exception as exc:  # noqa: BLE001 - report and keep linseq's rows
        print(f"fla-core not importable ({exc!r}); linseq's rows only", flush=True)
        rows.results["fla_error"] = repr(exc)
        fla_chunk_kda = None
    if fla_chunk_kda is not None:
        for shape in KDA_SHAPES:
            rows.run("kda_fla", {"shape": list(shape)},
                     functools.partial(fla_kda_row, *shape, fla_chunk_kda))
    rows.save()
    print(table(rows.results))
    failed = [r for part in ("kda", "ssm1", "kda_fla") for r in rows.results[part]
              if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
