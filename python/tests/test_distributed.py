"""Context parallelism (linseq.distributed) and data parallelism over torch.distributed: 2, 3
and 4 processes on this machine (gloo on 127.0.0.1) give the outputs, final states and every
gradient of the single-process call on the whole packed batch.

The ops: KDA / Gated DeltaNet, SSM1, SSD and the conv. The splits cover: a sequence crossing
one boundary, a boundary exactly between sequences, a sequence over 3 and 4 ranks, ranks
holding fewer tokens than the conv window, a rank with no tokens (between two sequences and
inside one), uneven splits, and initial / final states."""

import datetime
import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import require

torch = require("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import linseq.torch as lt  # noqa: E402
from linseq import distributed as ld  # noqa: E402
from linseq.compat import causal_conv1d as compat_conv  # noqa: E402
from linseq.compat import fla as compat_fla  # noqa: E402
from linseq.compat import mamba_ssd as compat_mamba_ssd  # noqa: E402
from linseq.compat import mamba_ssm as compat_mamba  # noqa: E402

TOL = dict(rtol=3e-4, atol=3e-4)

# world size -> [(global cu_seqlens, tokens per rank)]
SPLITS = {
    2: [([0, 13, 40], [20, 20]),            # sequence 1 crosses the boundary
        ([0, 13, 40], [13, 27])],           # the boundary is a sequence boundary
    3: [([0, 5, 37, 40], [10, 14, 16]),     # sequence 1 over 3 ranks, rank 1 inside it
        ([0, 8, 40], [8, 0, 32]),           # empty rank between two sequences
        ([0, 5, 40], [11, 0, 29])],         # empty rank inside a sequence
    4: [([0, 3, 30, 31, 40], [6, 2, 1, 31]),  # ranks 1, 2 hold fewer than W-1 = 3 tokens
        ([0, 40], [9, 11, 10, 10])],          # one sequence over every rank
}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, world, *args):
    """Runs fn(rank, world, *args) in `world` processes. A rank's failure closes its
    connections, so the others fail too: each rank writes its own error to a file and the
    first assertion among them is the one reported."""
    with tempfile.TemporaryDirectory() as errors:
        try:
            mp.spawn(_entry, args=(world, _free_port(), errors, fn, args), nprocs=world,
                     join=True)
        except mp.ProcessRaisedException as e:
            found = [open(os.path.join(errors, f)).read() for f in sorted(os.listdir(errors))]
            first = next((m for m in found if m.startswith("AssertionError")),
                         found[0] if found else str(e))
            raise AssertionError(first) from None


def _entry(rank, world, port, errors, fn, args):
    torch.set_num_threads(1)
    # a hang ends in 2 minutes instead of the default 30 (the tests' waits take seconds)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        fn(rank, world, *args)
        # no rank tears its connections down while a peer may still be sending on them
        # (gloo aborts the peer, SIGABRT, when it does); a worker that breaks the group on
        # purpose has none left to wait on
        if not getattr(fn, "breaks_group", False):
            dist.barrier()
    except BaseException as e:
        with open(os.path.join(errors, f"rank{rank}"), "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        dist.destroy_process_group()
        raise
    dist.destroy_process_group()
    # os._exit, not a return: with the rank's checks done, the interpreter's teardown can
    # still abort it now and then ("terminate called without an active exception", a C++
    # thread of torch's distributed stack destroyed while joinable), which mp.spawn reports
    # as the rank failing with SIGABRT (as examples/context_parallel.py does)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _randn(gen, *shape, scale=1.0):
    return scale * torch.randn(*shape, generator=gen)


def _check(name, got, want):
    torch.testing.assert_close(got, want, **TOL, msg=lambda m: f"{name}: {m}")


def _compare(cp, name, inputs, run_global, run_local, token_inputs, weights):
    """Runs the op on the whole batch and on this rank's slice, with loss = sum(out * w)
    over the outputs, and compares outputs, final states and every gradient (the gradients
    of inputs not split over tokens are summed over the ranks)."""
    ref_in = {n: t.clone().requires_grad_() for n, t in inputs.items() if t is not None}
    loc_in = {n: (cp.local(t) if n in token_inputs else t).clone().requires_grad_()
              for n, t in inputs.items() if t is not None}
    full = lambda d: {n: d.get(n) for n in inputs}  # noqa: E731
    out_ref, state_ref = run_global(full(ref_in))
    out, state = run_local(full(loc_in))
    w_out, w_state = weights
    (out_ref * w_out).sum().add((state_ref * w_state).sum()).backward()
    (out * cp.local(w_out)).sum().add((state * w_state).sum()).backward()
    _check(f"{name} output", out.detach(), cp.local(out_ref.detach()))
    mine = torch.zeros_like(state_ref)
    rows = list(cp.ends_here)
    mine[rows] = state.detach()[rows]
    dist.all_reduce(mine)
    _check(f"{name} final state", mine, state_ref.detach())
    assert torch.all(state.detach()[[n for n in range(cp.num_seqs) if n not in rows]] == 0)
    for n, t in loc_in.items():
        grad = t.grad if t.grad is not None else torch.zeros_like(t)
        if n in token_inputs:
            _check(f"{name} d{n}", grad, cp.local(ref_in[n].grad))
        else:
            grad = grad.clone()
            dist.all_reduce(grad)
            _check(f"{name} d{n}", grad, ref_in[n].grad)


def _kda_case(cp, gen, per_channel, gate_in_kernel, with_h0=True):
    T, N = cp.cu_seqlens[-1], cp.num_seqs
    H, HV, K, V = 2, 4, 6, 5
    inputs = dict(q=_randn(gen, 1, T, H, K), k=_randn(gen, 1, T, H, K),
                  v=_randn(gen, 1, T, HV, V), beta=torch.rand(1, T, HV, generator=gen),
                  g=(_randn(gen, 1, T, HV, K) if per_channel else _randn(gen, 1, T, HV))
                  if gate_in_kernel else
                  -0.3 * torch.rand(*((1, T, HV, K) if per_channel else (1, T, HV)),
                                    generator=gen),
                  h0=_randn(gen, N, HV, K, V, scale=0.5))
    if gate_in_kernel:
        inputs["A_log"] = _randn(gen, HV, scale=0.3)
        inputs["dt_bias"] = _randn(gen, HV * K if per_channel else HV, scale=0.3)
    options = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=gate_in_kernel)
    if not per_channel and gate_in_kernel:
        options["lower_bound"] = -2.0  # per head with the gate: fla's sigmoid form
        inputs.pop("A_log")
    if not with_h0:
        inputs.pop("h0")
    weights = (_randn(gen, 1, T, HV, V), _randn(gen, N, HV, K, V))

    def run_global(a):
        return lt.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"],
                           initial_state=a.get("h0"),
                           output_final_state=True, cu_seqlens=torch.tensor(cp.cu_seqlens),
                           A_log=a.get("A_log"), dt_bias=a.get("dt_bias"), **options)

    def run_local(a):
        return ld.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"],
                           initial_state=a.get("h0"),
                           output_final_state=True, A_log=a.get("A_log"),
                           dt_bias=a.get("dt_bias"), cp_context=cp, **options)

    name = f"kda(per_channel={per_channel}, gate_in_kernel={gate_in_kernel}, h0={with_h0})"
    _compare(cp, name, inputs, run_global, run_local, ("q", "k", "v", "g", "beta"), weights)


def _ssm1_case(cp, gen, full=True):
    T, Ns = cp.cu_seqlens[-1], cp.num_seqs
    D, N = 6, 4
    inputs = dict(x=_randn(gen, 1, T, D), dt=_randn(gen, 1, T, D, scale=0.5),
                  A=-torch.rand(D, N, generator=gen) - 0.1, B=_randn(gen, 1, T, N),
                  C=_randn(gen, 1, T, N), D=_randn(gen, D), gate=_randn(gen, 1, T, D),
                  h0=_randn(gen, Ns, D, N, scale=0.5), dt_bias=_randn(gen, D, scale=0.3))
    if not full:   # no gate, no skip, no initial state; dt as given (no softplus, no bias)
        inputs.update(D=None, gate=None, h0=None, dt_bias=None, dt=inputs["dt"].abs())
    weights = (_randn(gen, 1, T, D), _randn(gen, Ns, D, N))

    def run_global(a):
        y, h, _ = lt.state_space_v1(a["x"], a["A"], a["B"], a["C"], a["D"], a["dt"],
                                    gate=a["gate"], initial_state=a["h0"], dt_softplus=full,
                                    dt_bias=a["dt_bias"],
                                    cu_seqlens=torch.tensor(cp.cu_seqlens))
        return y, h

    def run_local(a):
        return ld.state_space_v1(a["x"], a["A"], a["B"], a["C"], a["D"], a["dt"],
                                 gate=a["gate"], initial_state=a["h0"], dt_softplus=full,
                                 dt_bias=a["dt_bias"], cp_context=cp)

    _compare(cp, f"ssm1(full={full})", inputs, run_global, run_local,
             ("x", "dt", "B", "C", "gate"), weights)


def _ssd_case(cp, gen, full=True):
    """Mamba2's SSD: groups, per-channel D, the z gate, dt_bias with softplus, the dt clamp and
    initial states (full), or none of them with dt as given. The pieces run in chunks of
    their own (from each rank's first token), so the results agree within float32 rounding."""
    T, Ns = cp.cu_seqlens[-1], cp.num_seqs
    H, P, N, G = 4, 3, 5, 2
    inputs = dict(x=_randn(gen, 1, T, H, P), dt=_randn(gen, 1, T, H, scale=0.5),
                  A=-torch.rand(H, generator=gen) - 0.1, B=_randn(gen, 1, T, G, N),
                  C=_randn(gen, 1, T, G, N), D=_randn(gen, H, P), z=_randn(gen, 1, T, H, P),
                  h0=_randn(gen, Ns, H, P, N, scale=0.5), dt_bias=_randn(gen, H, scale=0.3))
    options = dict(dt_softplus=True, dt_limit=(0.05, 0.9))
    if not full:   # no skip, no gate, no initial state; dt as given (no softplus, no clamp)
        inputs.update(D=None, z=None, h0=None, dt_bias=None, dt=0.2 * inputs["dt"].abs())
        options = {}
    weights = (_randn(gen, 1, T, H, P), _randn(gen, Ns, H, P, N))
    lo, hi = options.get("dt_limit", ld._NO_LIMIT)
    table = dict(dt_softplus=full, D_per_channel=full)
    if full:
        table.update(dt_min=lo, dt_max=hi)

    def run_global(a):
        arrays = {n: a[n] for n in ("x", "dt", "A", "B", "C", "D", "z", "h0", "dt_bias")}
        return lt.run("ssd", arrays, torch.tensor(cp.cu_seqlens), **table)

    def run_local(a):
        return ld.ssd(a["x"], a["dt"], a["A"], a["B"], a["C"], a["D"], a["z"], a["h0"],
                      dt_bias=a["dt_bias"], cp_context=cp, **options)

    _compare(cp, f"ssd(full={full})", inputs, run_global, run_local, ("x", "dt", "B", "C", "z"),
             weights)


def _conv_case(cp, gen, full=True):
    T, N = cp.cu_seqlens[-1], cp.num_seqs
    D, W = 5, 4
    inputs = dict(x=_randn(gen, 1, T, D), weight=_randn(gen, D, W), bias=_randn(gen, D),
                  conv_state=_randn(gen, N, D, W - 1))
    activation = "silu" if full else None
    if not full:   # no bias, no initial conv state, no activation
        inputs.update(bias=None, conv_state=None)
    weights = (_randn(gen, 1, T, D), _randn(gen, N, D, W - 1))

    def run_global(a):
        return lt.causal_conv1d(a["x"], a["weight"], a["bias"], activation, a["conv_state"],
                                cu_seqlens=torch.tensor(cp.cu_seqlens))

    def run_local(a):
        return ld.causal_conv1d(a["x"], a["weight"], a["bias"], activation, a["conv_state"],
                                cp_context=cp)

    _compare(cp, f"conv1d(full={full})", inputs, run_global, run_local, ("x",), weights)


# ------------------------------------------------------------------------------------------
# the drop-in surfaces with cp_context: equal to the same surface's single-process call
# ------------------------------------------------------------------------------------------

def _compat_fla_case(cp, gen, kda):
    """fla's chunk_kda (per channel decay, in-kernel gate with fla's A_log [1,1,HV,1] and
    dt_bias [HV,K]) or chunk_gated_delta_rule (beta logits, allow_neg_eigval, state_v_first),
    against the single-process call with the global cu_seqlens."""
    T, N = cp.cu_seqlens[-1], cp.num_seqs
    H, HV, K, V = 2, 4, 6, 5
    inputs = dict(q=_randn(gen, 1, T, H, K), k=_randn(gen, 1, T, H, K),
                  v=_randn(gen, 1, T, HV, V), beta=_randn(gen, 1, T, HV),
                  g=_randn(gen, 1, T, HV, K) if kda else -0.3 * torch.rand(1, T, HV,
                                                                            generator=gen),
                  h0=_randn(gen, N, HV, K, V, scale=0.5))
    if kda:
        inputs.update(beta=torch.rand(1, T, HV, generator=gen),
                      A_log=_randn(gen, 1, 1, HV, 1, scale=0.3),
                      dt_bias=_randn(gen, HV, K, scale=0.3))
        fn = compat_fla.chunk_kda
        options = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True)
        state_shape = (N, HV, K, V)
    else:
        fn = compat_fla.chunk_gated_delta_rule
        options = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                       allow_neg_eigval=True, state_v_first=True)
        inputs["h0"] = inputs["h0"].transpose(-1, -2).contiguous()
        state_shape = (N, HV, V, K)
    weights = (_randn(gen, 1, T, HV, V), _randn(gen, *state_shape))
    gate = {n: None for n in ("A_log", "dt_bias")}

    def call(a, **where):
        extra = {n: a[n] for n in gate if a.get(n) is not None}
        return fn(a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=a["h0"],
                  output_final_state=True, **options, **extra, **where)

    _compare(cp, f"compat.fla.{fn.__name__}", inputs,
             lambda a: call(a, cu_seqlens=torch.tensor(cp.cu_seqlens)),
             lambda a: call(a, cp_context=cp), ("q", "k", "v", "g", "beta"), weights)


def _compat_mamba_case(cp, gen):
    """mamba-ssm's selective_scan_fn on [1, d, l] transposed views (one sequence: the
    single-process call has no cu_seqlens), B with groups, C without."""
    T = cp.cu_seqlens[-1]
    D, N = 6, 4
    inputs = dict(u=_randn(gen, 1, T, D), delta=_randn(gen, 1, T, D, scale=0.5),
                  A=-torch.rand(D, N, generator=gen) - 0.1, B=_randn(gen, 1, T, 1, N),
                  C=_randn(gen, 1, T, N), D=_randn(gen, D), z=_randn(gen, 1, T, D),
                  delta_bias=_randn(gen, D, scale=0.3))
    weights = (_randn(gen, 1, T, D), _randn(gen, 1, D, N))

    def call(a, **where):
        cl = lambda t: t.movedim(1, -1)  # noqa: E731   [1, l, ...] -> [1, ..., l], a view
        out, last = compat_mamba.selective_scan_fn(
            cl(a["u"]), cl(a["delta"]), a["A"], cl(a["B"]), cl(a["C"]), a["D"], cl(a["z"]),
            a["delta_bias"], delta_softplus=True, return_last_state=True, **where)
        return out.transpose(1, 2), last

    _compare(cp, "compat.mamba_ssm.selective_scan_fn", inputs, call,
             lambda a: call(a, cp_context=cp), ("u", "delta", "B", "C", "z"), weights)


def _compat_mamba_ssd_case(cp, gen):
    """mamba-ssm's mamba_chunk_scan_combined (Mamba2), one sequence: dt_bias with softplus,
    dt_limit, D per head, z, initial and final states, against the plain call."""
    T = cp.cu_seqlens[-1]
    H, P, N, G = 4, 3, 5, 2
    inputs = dict(x=_randn(gen, 1, T, H, P), dt=_randn(gen, 1, T, H, scale=0.5),
                  A=-torch.rand(H, generator=gen) - 0.1, B=_randn(gen, 1, T, G, N),
                  C=_randn(gen, 1, T, G, N), D=_randn(gen, H), z=_randn(gen, 1, T, H, P),
                  dt_bias=_randn(gen, H, scale=0.3), h0=_randn(gen, 1, H, P, N, scale=0.5))
    weights = (_randn(gen, 1, T, H, P), _randn(gen, 1, H, P, N))

    def call(a, **where):
        return compat_mamba_ssd.mamba_chunk_scan_combined(
            a["x"], a["dt"], a["A"], a["B"], a["C"], 64, D=a["D"], z=a["z"],
            dt_bias=a["dt_bias"], initial_states=a["h0"], dt_softplus=True,
            dt_limit=(0.05, 0.9), return_final_states=True, **where)

    _compare(cp, "compat.mamba_ssd.mamba_chunk_scan_combined", inputs, call,
             lambda a: call(a, cp_context=cp), ("x", "dt", "B", "C", "z"), weights)


def _compat_conv_case(cp, gen):
    """causal-conv1d's causal_conv1d_fn, x channel-first [1, d, l] (one sequence)."""
    T = cp.cu_seqlens[-1]
    D, W = 5, 4
    inputs = dict(x=_randn(gen, 1, T, D), weight=_randn(gen, D, W), bias=_randn(gen, D),
                  h0=_randn(gen, 1, D, W - 1))
    weights = (_randn(gen, 1, T, D), _randn(gen, 1, D, W - 1))

    def call(a, **where):
        out, states = compat_conv.causal_conv1d_fn(
            a["x"].transpose(1, 2).contiguous(), a["weight"], a["bias"],
            initial_states=a["h0"], return_final_states=True, activation="swish", **where)
        return out.transpose(1, 2), states

    _compare(cp, "compat.causal_conv1d.causal_conv1d_fn", inputs, call,
             lambda a: call(a, cp_context=cp), ("x",), weights)


def _compat_cases(cp, lengths, gen):
    _compat_fla_case(cp, gen, kda=True)
    _compat_fla_case(cp, gen, kda=False)
    one = ld.build_context(torch.tensor([0, cp.cu_seqlens[-1]]), lengths=lengths)
    _compat_mamba_case(one, gen)
    _compat_mamba_ssd_case(one, gen)
    _compat_conv_case(one, gen)


def _context_parallel_worker(rank, world):
    for i, (cu, lengths) in enumerate(SPLITS[world]):
        cp = ld.build_context(torch.tensor(cu), lengths=lengths)
        gen = torch.Generator().manual_seed(100 * world + i)  # the same inputs on every rank
        try:
            _kda_case(cp, gen, per_channel=True, gate_in_kernel=False)
            _kda_case(cp, gen, per_channel=False, gate_in_kernel=False)   # Gated DeltaNet
            _kda_case(cp, gen, per_channel=True, gate_in_kernel=True, with_h0=False)
            _kda_case(cp, gen, per_channel=False, gate_in_kernel=True)
            _ssm1_case(cp, gen)
            _ssm1_case(cp, gen, full=False)
            _ssd_case(cp, gen)
            _ssd_case(cp, gen, full=False)
            _conv_case(cp, gen)
            _conv_case(cp, gen, full=False)
            if world == 2:
                _compat_cases(cp, lengths, gen)
        except AssertionError as e:
            raise AssertionError(f"rank {rank}/{world}, cu_seqlens {cu}, split {lengths}: "
                                 f"{e}") from None


@pytest.mark.parametrize("world", [2, 3, 4])
def test_context_parallel_matches_one_process(world):
    _spawn(_context_parallel_worker, world)


def test_build_context_describes_the_split():
    cu = [0, 3, 30, 31, 40]
    ctxs = [ld.build_context(cu, lengths=[6, 2, 1, 31], rank=r, world=4) for r in range(4)]
    assert [c.piece_seqs for c in ctxs] == [(0, 1), (1,), (1,), (1, 2, 3)]
    assert [(c.receives, c.sends, c.through) for c in ctxs] == [
        (False, True, False), (True, True, True), (True, True, True), (True, False, False)]
    assert ctxs[3].local_offsets == (0, 21, 22, 31)
    assert ctxs[0].ends_here == (0,) and ctxs[3].ends_here == (1, 2, 3)
    even = [ld.build_context(cu, rank=r, world=3) for r in range(3)]
    assert [c.end - c.start for c in even] == [14, 13, 13]
    empty = ld.build_context([0, 5, 40], lengths=[11, 0, 29], rank=1, world=3)
    assert empty.through and empty.piece_seqs == () and empty.ends_here == ()
    with pytest.raises(ValueError, match="lengths"):
        ld.build_context(cu, lengths=[20, 19], rank=0, world=2)
    with pytest.raises(ValueError, match="cu_seqlens"):
        ld.build_context([0, 5, 5, 9], rank=0, world=2)


def test_example_runs_under_torchrun():
    """examples/context_parallel.py, as its docstring says to run it, checks itself against
    the single-process run and exits 0 only when everything matches."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # the ranks import the linseq this test imported (installed, or the source folder with
    # LINSEQ_LIBRARY), not the source folder beside the example, which holds no library
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(lt.__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([package_dir, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                          "2", "--master-port", str(_free_port()),
                          os.path.join(root, "examples", "context_parallel.py")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "2 ranks: outputs, final states and gradients match" \
        in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]


def test_bad_inputs_are_refused_before_any_exchange():
    """No process group is needed: the checks run before anything is sent."""
    cp = ld.build_context([0, 10, 40], lengths=[25, 15], rank=1, world=2)
    x = torch.zeros(1, 15, 2, 4)
    beta = torch.zeros(1, 15, 2)
    with pytest.raises(ValueError, match=r"q: expected this rank's 15 tokens"):
        ld.chunk_kda(torch.zeros(1, 16, 2, 4), x, x, x, beta, cp_context=cp)
    with pytest.raises(ValueError, match=r"initial_state: expected \[2, HV, K, V\]"):
        ld.chunk_kda(x, x, x, x, beta, initial_state=torch.zeros(1, 2, 4, 4), cp_context=cp)
    with pytest.raises(TypeError, match="k: expected a float32 torch tensor"):
        ld.chunk_kda(x, x.double(), x, x, beta, cp_context=cp)
    with pytest.raises(TypeError, match="cp_context"):
        ld.causal_conv1d(torch.zeros(1, 15, 3), torch.zeros(3, 4), cp_context=None)
    with pytest.raises(ValueError, match="conv_state"):
        ld.causal_conv1d(torch.zeros(1, 15, 3), torch.zeros(3, 4),
                         conv_state=torch.zeros(3, 3, 3), cp_context=cp)
    with pytest.raises(ValueError, match="hidden_states"):
        ld.state_space_v1(torch.zeros(1, 14, 3), torch.zeros(3, 2), beta, beta, None,
                          torch.zeros(1, 15, 3), cp_context=cp)
    xs, dts, bc = torch.zeros(1, 15, 2, 3), torch.zeros(1, 15, 2), torch.zeros(1, 15, 1, 4)
    with pytest.raises(ValueError, match=r"x: expected this rank's 15 tokens"):
        ld.ssd(torch.zeros(1, 14, 2, 3), dts, -torch.ones(2), bc, bc, cp_context=cp)
    with pytest.raises(ValueError, match=r"initial_state: expected \[2, 2, 3, 4\]"):
        ld.ssd(xs, dts, -torch.ones(2), bc, bc, initial_state=torch.zeros(2, 2, 4, 3),
               cp_context=cp)
    with pytest.raises(ValueError, match="dt_bias: given without dt_softplus"):
        ld.ssd(xs, dts, -torch.ones(2), bc, bc, dt_bias=torch.zeros(2), cp_context=cp)
    with pytest.raises(ValueError, match=r"A: expected an \[H\] tensor"):
        ld.ssd(xs, dts, -torch.ones(2, 1), bc, bc, cp_context=cp)


def test_compat_one_rank_context_is_the_plain_call():
    """A one-rank context exchanges nothing (no process group needed): fla's GDN without a
    decay (g=None) and in bfloat16 gives the plain call's output, dtype included."""
    gen = torch.Generator().manual_seed(5)
    cu = [0, 7, 20]
    cp = ld.build_context(cu, rank=0, world=1)
    q, k = _randn(gen, 1, 20, 2, 4), _randn(gen, 1, 20, 2, 4)
    v, beta = _randn(gen, 1, 20, 2, 3), torch.rand(1, 20, 2, generator=gen)
    h0 = _randn(gen, 2, 2, 4, 3)
    for dtype in (torch.float32, torch.bfloat16):
        args = [t.to(dtype) for t in (q, k, v)]
        want, want_ht = compat_fla.chunk_gated_delta_rule(
            *args, None, beta, initial_state=h0, output_final_state=True,
            use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor(cu))
        got, got_ht = compat_fla.chunk_gated_delta_rule(
            *args, None, beta, initial_state=h0, output_final_state=True,
            use_qk_l2norm_in_kernel=True, cp_context=cp)
        assert got.dtype == want.dtype == dtype
        _check(f"gdn g=None {dtype} output", got.float(), want.float())
        _check(f"gdn g=None {dtype} final state", got_ht, want_ht)


def test_compat_surfaces_refuse_what_context_parallelism_lacks():
    """The drop-ins with cp_context name the argument they cannot take there, before any
    exchange (no process group needed)."""
    cp = ld.build_context([0, 10, 40], lengths=[25, 15], rank=1, world=2)
    q, v, beta = torch.zeros(1, 15, 2, 4), torch.zeros(1, 15, 2, 3), torch.zeros(1, 15, 2)
    kda = lambda **kw: compat_fla.chunk_kda(q, q, v, q, beta, **kw)  # noqa: E731
    with pytest.raises(NotImplementedError, match="cp_context: expected linseq"):
        kda(cp_context=object())   # fla's own FLACPContext drives fla's kernels only
    with pytest.raises(ValueError, match="return_intermediate_states"):
        kda(cp_context=cp, return_intermediate_states=True)
    with pytest.raises(ValueError, match=r"beta: per value channel"):
        compat_fla.chunk_kda(q, q, v, q, torch.zeros(1, 15, 2, 3), cp_context=cp)
    with pytest.raises(ValueError, match="cu_seqlens: with cp_context"):
        kda(cp_context=cp, cu_seqlens=torch.tensor([0, 7, 15]))
    with pytest.raises(TypeError, match="q: expected a torch.Tensor"):
        compat_fla.chunk_kda(q.numpy(), q, v, q, beta, cp_context=cp)
    with pytest.raises(NotImplementedError, match="cp_context"):
        compat_fla.fused_recurrent_kda(q, q, v, q, beta, cp_context=cp)
    x = torch.zeros(1, 3, 15)
    with pytest.raises(ValueError, match="seq_idx: must be None with cp_context"):
        compat_conv.causal_conv1d_fn(x, torch.zeros(3, 4), seq_idx=torch.zeros(1, 15,
                                     dtype=torch.int64), cp_context=cp)
    with pytest.raises(TypeError, match="cp_context"):
        compat_conv.causal_conv1d_fn(x, torch.zeros(3, 4), cp_context="ranks")
    with pytest.raises(ValueError, match="B: expected .*a constant"):
        compat_mamba.selective_scan_fn(x, x, torch.zeros(3, 2), torch.zeros(3, 2),
                                       torch.zeros(1, 2, 15), cp_context=cp)
    with pytest.raises(ValueError, match="seq_idx, cu_seqlens: must be None with cp_context"):
        compat_mamba_ssd.mamba_chunk_scan_combined(
            torch.zeros(1, 15, 2, 3), torch.zeros(1, 15, 2), -torch.ones(2),
            torch.zeros(1, 15, 1, 4), torch.zeros(1, 15, 1, 4), 64,
            seq_idx=torch.zeros(1, 15, dtype=torch.int64), cp_context=cp)
    with pytest.raises(TypeError, match="cp_context"):
        compat_mamba_ssd.mamba_chunk_scan_combined(
            torch.zeros(1, 15, 2, 3), torch.zeros(1, 15, 2), -torch.ones(2),
            torch.zeros(1, 15, 1, 4), torch.zeros(1, 15, 1, 4), 64, cp_context="ranks")
    with pytest.raises(ValueError, match="u: expected this rank's tokens"):
        compat_mamba.selective_scan_fn(torch.zeros(2, 3, 15), x, torch.zeros(3, 2),
                                       torch.zeros(1, 2, 15), torch.zeros(1, 2, 15),
                                       cp_context=cp)


# ------------------------------------------------------------------------------------------
# ranks that disagree: every rank raises DistributedError naming the difference
# ------------------------------------------------------------------------------------------

def _refused(pattern, fn):
    with pytest.raises(ld.DistributedError, match=pattern):
        fn()


def _disagreeing_ranks_worker(rank, world):
    """Before, each of these hung until the group's timeout, or returned wrong outputs with
    no error (a different K on one rank filled its received state partly from torch.empty:
    three identical calls, three different outputs)."""
    gen = torch.Generator().manual_seed(21)
    T, D, W = 40, 5, 4
    x, w = _randn(gen, 1, T, D), _randn(gen, D, W)
    same = ld.build_context([0, 13, 40], lengths=[20, 20], timeout=100)

    def conv(cp, activation="silu", xs=x):
        return ld.causal_conv1d(cp.local(xs), w, None, activation, cp_context=cp)

    def ssm1(cp):
        return ld.state_space_v1(cp.local(x), -torch.ones(D, 3), cp.local(x[..., :3]),
                                 cp.local(x[..., :3]), None, cp.local(x).abs(), cp_context=cp)

    def kda(cp, K):
        q = torch.ones(1, T, 2, K)
        return ld.chunk_kda(cp.local(q), cp.local(q), cp.local(torch.ones(1, T, 2, 3)),
                           cp.local(-0.1 * q), cp.local(torch.full((1, T, 2), 0.5)),
                           cp_context=cp)

    def ssd(cp, softplus=True, P=3):
        bc = torch.ones(1, T, 1, 4)
        return ld.ssd(cp.local(torch.ones(1, T, 2, P)), cp.local(torch.full((1, T, 2), 0.1)),
                      -torch.ones(2), cp.local(bc), cp.local(bc), dt_softplus=softplus,
                      cp_context=cp)

    cu = [0, 13, 40] if rank == 0 else [0, 14, 40]
    _refused(r"cu_seqlens: rank 0 \[0, 13, 40\]; rank 1 \[0, 14, 40\]",
             lambda: conv(ld.build_context(cu, lengths=[20, 20], timeout=100)))
    lengths = [20, 20] if rank == 0 else [21, 19]
    _refused(r"lengths: rank 0 \[20, 20\]; rank 1 \[21, 19\]",
             lambda: conv(ld.build_context([0, 13, 40], lengths=lengths, timeout=100)))
    for _ in range(3):   # a different K, as often as it is tried
        _refused(r"arguments: rank 0 q=\[1, T_r, 2, 6\].*; rank 1 q=\[1, T_r, 2, 5\]",
                 lambda: kda(same, 6 if rank == 0 else 5))
    _refused(r"step: rank 0 the forward of call 0 \(causal_conv1d\); rank 1 the forward of "
             r"call 0 \(state_space_v1\)", lambda: conv(same) if rank == 0 else ssm1(same))
    _refused(r"options: rank 0 activation='silu'; rank 1 activation=None",
             lambda: conv(same, "silu" if rank == 0 else None))
    _refused(r"step: rank 0 the forward of call 0 \(ssd\); rank 1 the forward of call 0 "
             r"\(state_space_v1\)", lambda: ssd(same) if rank == 0 else ssm1(same))
    _refused(r"options: rank 0 D_per_channel=False, dt_softplus=True; rank 1 "
             r"D_per_channel=False, dt_softplus=False", lambda: ssd(same, rank == 0))
    _refused(r"arguments: rank 0 x=\[1, T_r, 2, 3\].*; rank 1 x=\[1, T_r, 2, 2\]",
             lambda: ssd(same, P=3 if rank == 0 else 2))
    _refused(r"arguments: rank 0 x=\[1, T_r, 5\] float32, weight=\[5, 4\] float32.*; "
             r"rank 1 .*weight=\[5, 4\] float64",
             lambda: ld.causal_conv1d(same.local(x), w if rank == 0 else w.double(), None,
                                      "silu", cp_context=same))
    # rank 0 goes on without the backward of a call: its next call meets rank 1's backward
    xs = x.clone().requires_grad_()
    y, _ = conv(same, xs=xs)
    if rank == 0:
        _refused(r"step: rank 0 the forward of call 1 \(causal_conv1d\); rank 1 the backward "
                 r"of call 0 \(causal_conv1d\)", lambda: conv(same))
    else:
        _refused(r"step: rank 0 the forward of call 1 .*; rank 1 the backward of call 0",
                 lambda: y.sum().backward())
    # nothing refused took a step: the ranks are still in step, and agree
    y, _ = conv(same)
    want, _ = lt.causal_conv1d(x, w, None, "silu", cu_seqlens=torch.tensor([0, 13, 40]))
    _check("conv after the refusals", y, same.local(want))
    y, _ = ssd(same)
    bc = torch.ones(1, T, 1, 4)
    want, _ = lt.run("ssd", dict(x=torch.ones(1, T, 2, 3), dt=torch.full((1, T, 2), 0.1),
                                 A=-torch.ones(2), B=bc, C=bc),
                     torch.tensor([0, 13, 40]), dt_softplus=True)
    _check("ssd after the refusals", y, same.local(want))


def test_disagreeing_ranks_raise_naming_the_difference():
    _spawn(_disagreeing_ranks_worker, 2)


def _skipped_backward_worker(rank, world):
    """Rank 0 skips the backward and waits elsewhere: rank 1 raises within the context's
    timeout (3 s here; the group's is 2 minutes) naming rank 0, instead of waiting for the
    group's; gloo closes the connection, so rank 0's next call raises too."""
    gen = torch.Generator().manual_seed(22)
    x, w = _randn(gen, 1, 40, 5).requires_grad_(), _randn(gen, 5, 4)
    cp = ld.build_context([0, 40], lengths=[20, 20], timeout=3)
    y, _ = ld.causal_conv1d(cp.local(x), w, None, "silu", cp_context=cp)
    if rank == 1:
        _refused(r"rank 1 reached the backward of call 0 \(causal_conv1d\), rank\(s\) 0 "
                 r"did not within the context's timeout of 3 s", lambda: y.sum().backward())
        _refused(r"an earlier exchange of this process group failed",
                 lambda: ld.causal_conv1d(cp.local(x), w, cp_context=cp))
    else:
        time.sleep(8)
        _refused(r"rank\(s\) 1 could not be reached",
                 lambda: ld.causal_conv1d(cp.local(x), w, cp_context=cp))


_skipped_backward_worker.breaks_group = True


def test_a_rank_skipping_the_backward_is_named_within_the_timeout():
    _spawn(_skipped_backward_worker, 2)


# ------------------------------------------------------------------------------------------
# the backward does no work for gradients nobody asked for
# ------------------------------------------------------------------------------------------

def _new_elements(fn):
    """The number of tensor elements fn's aten and linseq ops allocate (outputs that share
    no storage with an argument: views and in-place results are not counted)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Count(TorchDispatchMode):
        elements = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                    if isinstance(t, torch.Tensor)}
            Count.elements += sum(t.numel() for t in tree_leaves(out)
                                  if isinstance(t, torch.Tensor)
                                  and t.untyped_storage().data_ptr() not in seen)
            return out

    with Count():
        fn()
    return Count.elements


def _backward_elements(run, inputs):
    """Elements allocated by the backward of sum(outputs[0] * w) (the forward not counted)."""
    leaves = {n: t.clone().requires_grad_() for n, t in inputs.items()}
    out = run(leaves)[0]
    upstream = torch.ones_like(out)
    return _new_elements(lambda: out.backward(upstream))


def _conv_inputs(T, D, W):
    gen = torch.Generator().manual_seed(11)
    return dict(x=_randn(gen, 1, T, D), weight=_randn(gen, D, W),
                conv_state=_randn(gen, 1, D, W - 1))


def _ssm1_inputs(T, D, N):
    gen = torch.Generator().manual_seed(12)
    return dict(x=_randn(gen, 1, T, D), A=-torch.rand(D, N, generator=gen) - 0.1,
                B=_randn(gen, 1, T, N), C=_randn(gen, 1, T, N),
                dt=_randn(gen, 1, T, D, scale=0.5), h0=_randn(gen, 1, D, N))


def _conv_run(cp):
    def run(a):
        state = a["conv_state"]
        if cp is None:
            return lt.causal_conv1d(a["x"], a["weight"], None, "silu", state)
        return ld.causal_conv1d(a["x"], a["weight"], None, "silu", state, cp_context=cp)
    return run


def _ssm1_run(cp):
    def run(a):
        if cp is None:
            return lt.state_space_v1(a["x"], a["A"], a["B"], a["C"], None, a["dt"],
                                     initial_state=a["h0"], dt_softplus=True)
        return ld.state_space_v1(a["x"], a["A"], a["B"], a["C"], None, a["dt"],
                                 initial_state=a["h0"], dt_softplus=True, cp_context=cp)
    return run


def test_one_rank_backward_allocates_what_the_plain_call_does():
    """One rank: the conv's gradients are all found before the (empty) chain; the backward
    used to add a zeros_like of every input to them (at T = 65536, D = 256, 226 ms against
    136 ms for the plain call). Now it allocates the plain backward's tensors and a few of
    the state's size, whatever T is."""
    T, D, W = 4096, 64, 4
    cp = ld.build_context([0, T], rank=0, world=1)
    inputs = _conv_inputs(T, D, W)
    plain = _backward_elements(_conv_run(None), inputs)
    parallel = _backward_elements(_conv_run(cp), inputs)
    assert plain >= T * D and parallel - plain <= 8 * D * W, (plain, parallel)


def _receiving_rank_worker(rank, world):
    """Rank 1 receives the state but sends none: SSM1 and the conv find every gradient in
    one pass before the chain; nothing is added afterwards. Rank 0 sends the state: the
    gradient it gets back reaches the last W-1 tokens of x (the conv) or the whole scan
    (SSM1, one pass with the outputs'), never a full-size zeros tensor and a full-size add."""
    T = 4096
    cp = ld.build_context([0, T], lengths=[T // 2, T // 2])
    for name, inputs, run, state in (("conv", _conv_inputs(T, 16, 4), _conv_run, 16 * 4),
                                     ("ssm1", _ssm1_inputs(T, 16, 4), _ssm1_run, 16 * 4)):
        local = {n: cp.local(t) if t.shape[1] == T else t for n, t in inputs.items()}
        parallel = _backward_elements(run(cp), local)
        plain = _backward_elements(run(None), local)
        assert plain >= T // 2 * 16 and parallel - plain <= 8 * state, \
            f"{name}: rank {rank}'s backward allocated {parallel} elements, the plain " \
            f"call's {plain}"


def test_receiving_rank_backward_allocates_what_the_plain_call_does():
    _spawn(_receiving_rank_worker, 2)


# ------------------------------------------------------------------------------------------
# data parallelism: DistributedDataParallel over the autograd functions
# ------------------------------------------------------------------------------------------

class _Block(torch.nn.Module):
    """A KDA mixer then a Mamba1 scan, with the parameters a training step updates."""

    def __init__(self, D=8, H=2, K=4, N=4):
        super().__init__()
        gen = torch.Generator().manual_seed(7)
        self.H, self.K = H, K
        self.qkv = torch.nn.Parameter(0.3 * torch.randn(D, 3 * H * K, generator=gen))
        self.gate = torch.nn.Parameter(0.3 * torch.randn(D, H * K, generator=gen))
        self.A_log = torch.nn.Parameter(0.3 * torch.randn(H, generator=gen))
        self.dt_bias = torch.nn.Parameter(0.3 * torch.randn(H * K, generator=gen))
        self.beta = torch.nn.Parameter(0.3 * torch.randn(D, H, generator=gen))
        self.A = torch.nn.Parameter(-torch.rand(H * K, N, generator=gen) - 0.2)
        self.BC = torch.nn.Parameter(0.3 * torch.randn(D, 2 * N, generator=gen))
        self.dt = torch.nn.Parameter(0.3 * torch.randn(D, H * K, generator=gen))
        self.Dskip = torch.nn.Parameter(torch.randn(H * K, generator=gen))

    def forward(self, x):
        Bsz, T, _ = x.shape
        q, k, v = (x @ self.qkv).view(Bsz, T, 3, self.H, self.K).unbind(2)
        g = (x @ self.gate).view(Bsz, T, self.H, self.K)
        o, _ = lt.chunk_kda(q, k, v, g, torch.sigmoid(x @ self.beta),
                           use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                           A_log=self.A_log, dt_bias=self.dt_bias)
        u = o.reshape(Bsz, T, self.H * self.K)
        Bm, Cm = (x @ self.BC).chunk(2, -1)
        y, _, _ = lt.state_space_v1(u, self.A, Bm, Cm, self.Dskip, x @ self.dt,
                                    dt_softplus=True)
        return y


def _ddp_worker(rank, world, batch, target):
    model = _Block()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    per = batch.shape[0] // world
    x, t = batch[rank * per:(rank + 1) * per], target[rank * per:(rank + 1) * per]
    # the mean over this rank's samples; DDP averages the gradients over the ranks
    ((ddp(x) - t) ** 2).mean().backward()
    reference = _Block()
    ((reference(batch) - target) ** 2).mean().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        _check(f"rank {rank} DDP d{name}", p.grad, q.grad)


def test_ddp_training_step_matches_one_process():
    gen = torch.Generator().manual_seed(3)
    batch = torch.randn(4, 19, 8, generator=gen)
    target = torch.randn(4, 19, 8, generator=gen)
    _spawn(_ddp_worker, 2, batch, target)
