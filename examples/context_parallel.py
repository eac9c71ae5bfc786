"""Context parallelism: one packed batch of sequences split along time over the processes,
checked against the single-process call. Run with any number of processes:

    torchrun --nproc-per-node 2 examples/context_parallel.py

Every rank builds the same global inputs (same seed), runs a conv -> Gated DeltaNet/KDA ->
Mamba1 scan stack on its own slice of the tokens through linseq.distributed, backpropagates,
and compares its outputs, final states and gradients with one process running the whole
batch. The ranks exchange only states (H*K*V floats for KDA, D*N for the scan, D*(W-1) for
the conv) across each boundary that falls inside a sequence.
"""

import os
import sys

import torch
import torch.distributed as dist

import linseq.torch as lt
from linseq import distributed as ld


def layers(x, p, run):
    """conv -> KDA -> SSM1 over x [1,T,D]; run: 'global' (whole batch, cu_seqlens) or the
    context (this rank's slice)."""
    cp = None if run == "global" else run
    packed = dict(cu_seqlens=p["cu_seqlens"]) if cp is None else dict(cp_context=cp)
    conv = lt.causal_conv1d if cp is None else ld.causal_conv1d
    kda = lt.chunk_kda if cp is None else ld.chunk_kda
    scan = lt.state_space_v1 if cp is None else ld.state_space_v1
    T, H, K = x.shape[1], p["heads"], p["head_dim"]
    u, _ = conv(x, p["conv_w"], p["conv_b"], "silu", **packed)
    q, k, v = (u @ p["qkv"]).view(1, T, 3, H, K).unbind(2)
    o, kda_state = kda(q, k, v, (u @ p["gate"]).view(1, T, H, K), torch.sigmoid(u @ p["beta"]),
                       initial_state=p["h0"], output_final_state=True,
                       use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                       A_log=p["A_log"], dt_bias=p["dt_bias"], **packed)
    Bm, Cm = (x @ p["BC"]).chunk(2, -1)
    y = scan(o.reshape(1, T, H * K), p["A"], Bm, Cm, p["D"], x @ p["dt"], gate=x,
             dt_softplus=True, **packed)
    return y[0], kda_state, y[1]


def parameters(D=16, H=2, K=8, N=4, W=4, n_seqs=3):
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: (0.3 * torch.randn(*s, generator=gen)).requires_grad_()  # noqa: E731
    return dict(heads=H, head_dim=K, conv_w=r(D, W), conv_b=r(D), qkv=r(D, 3 * H * K),
                gate=r(D, H * K), beta=r(D, H), A_log=r(H), dt_bias=r(H * K),
                h0=r(n_seqs, H, K, K), BC=r(D, 2 * N), dt=r(D, H * K),
                A=(-torch.rand(H * K, N, generator=gen) - 0.2).requires_grad_(),
                D=r(H * K))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cu_seqlens = torch.tensor([0, 150, 900, 1000])   # 3 sequences, 1000 tokens
    x = torch.randn(1, 1000, 16, generator=torch.Generator().manual_seed(1))
    cp = ld.build_context(cu_seqlens)                # an even split over the ranks

    mine = parameters()
    y, kda_state, ssm_state = layers(cp.local(x), mine, cp)
    loss = y.square().sum() + kda_state.sum() + ssm_state.sum()
    loss.backward()

    whole = parameters()
    y_ref, kda_ref, ssm_ref = layers(x, dict(whole, cu_seqlens=cu_seqlens), "global")
    (y_ref.square().sum() + kda_ref.sum() + ssm_ref.sum()).backward()

    def close(a, b):
        return torch.allclose(a, b, rtol=1e-3, atol=1e-3)
    ok = close(y, cp.local(y_ref.detach()))
    ends = list(cp.ends_here)
    ok &= close(kda_state[ends], kda_ref[ends].detach())
    ok &= close(ssm_state[ends], ssm_ref[ends].detach())
    for name, p in mine.items():
        if isinstance(p, torch.Tensor):
            # each rank holds its tokens' share of a weight's gradient (none for the initial
            # states of sequences starting elsewhere)
            grad = torch.zeros_like(p) if p.grad is None else p.grad.clone()
            dist.all_reduce(grad)
            ok &= close(grad, whole[name].grad)
    verdict = torch.tensor([int(ok)])
    dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(f"{cp.world} ranks: outputs, final states and gradients "
              f"{'match' if verdict.item() else 'DO NOT match'} the single-process run")
    dist.barrier()  # no rank closes its connections while a peer may still be sending
    dist.destroy_process_group()
    sys.stdout.flush()
    # os._exit, not SystemExit: with every result checked, the interpreter's teardown can
    # still abort a rank now and then ("terminate called without an active exception", a
    # C++ thread of torch's distributed stack destroyed while joinable), which torchrun
    # reports as the run failing
    os._exit(0 if verdict.item() else 1)


if __name__ == "__main__":
    main()
