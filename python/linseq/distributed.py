"""Context parallelism: one packed batch of sequences split along time across processes.

Each rank of a torch.distributed process group holds a contiguous range of the packed tokens
(B == 1, sequences given by the global `cu_seqlens`); build_context describes the split, and
chunk_kda / chunk_gated_delta_rule, state_space_v1, ssd and causal_conv1d here take the rank's
tokens and the context (ssd here is Mamba2's, linseq's "ssd" op). A rank's piece of a
sequence maps the state it starts from affinely to the state it ends with, so ranks
exchange states, never tokens:

- KDA / Gated DeltaNet: S_end = P S_start + R per head, P [K,K], R [K,V]. The piece that
  continues from the previous rank runs once with the values widened to V + K, v' = [v | 0]
  and S'_0 = [0 | I]: the first V state columns evolve from 0 (R, and the outputs o_R), the
  last K from the identity with no input (P, and o_P [T,K]), as every state column evolves
  on its own. With the true start state, o = o_R + o_P S_start and S_end = P S_start + R: no
  rerun, and no rank waits on another's kernel.
- SSM1: h_end = P * h_start + R per (d, n), P = exp(A * sum of dt) over the piece; a rank
  inside one sequence runs its piece from h0 = 0 for R, and reruns it from its true start.
- SSD (Mamba2): S_end = P S_start + R per head, P = exp(A * sum of dt) a scalar; a rank
  inside one sequence takes (P, R) from the C summary (ssd_segment, differentiable) and
  reruns its piece from its true start.
- causal conv1d: the state is the W-1 inputs before the piece, oldest first (from several
  ranks when one holds fewer than W-1 tokens).

The exchange is a chain along the ranks: rank r receives the state its first piece starts
from and sends the state its last piece ends with (P S_start + R, or a final state computed
without waiting), one state per boundary inside a sequence: HV*K*V floats for KDA, D*N for
SSM1, H*P*N for SSD, D*(W-1) for the conv, whatever T is. The backward sends d(start state)
back the same way: d_start = P^T d_end + (the local outputs' share), then every rank
differentiates its own graph with the d_end it received. Each link of the chain costs a
[K,K]x[K,V] product per head; the heavy work runs on all ranks at once before and after it.
(A tree would instead send the maps, combining (P2, R2) o (P1, R1) = (P2 P1, P2 R1 + R2)
in log2(ranks) rounds at O(K^3) per head each, worth it only for many ranks.)

Every rank must call the same functions in the same order and backpropagate through what
they return (they communicate, as collectives do). The ranks check that they do: each call's
forward and backward starts with an exchange of a few int64 (a fingerprint of the step, the
global cu_seqlens, the split, the shapes and dtypes, the options and whether a backward will
follow) between every pair of ranks, and a difference raises DistributedError naming it on
every rank. Every wait, that one and the states', is bounded by the context's timeout
(build_context(timeout=), 300 s by default, shorter than the process group's 30 min): a
rank that skips a call or a backward makes the others raise DistributedError naming it
(gloo then closes their connections to it, so it fails at its next exchange too).

The drop-ins take the same context as cp_context=: linseq.compat.fla's chunk_kda and
chunk_gated_delta_rule (fla's arguments, any float dtype), mamba_ssm.selective_scan_fn and
causal_conv1d.causal_conv1d_fn (their [1, dim, seqlen] layout), and
mamba_ssd.mamba_chunk_scan_combined (its [1, seqlen, nheads, headdim] layout). Float32 tensors on the CPU
here; a KDA state [V, K] (state_v_first) is transposed to [K, V] on the way in and back on
the way out.
"""

import dataclasses
import datetime
import hashlib
import itertools
import math
import time
from typing import Optional, Tuple

import torch
import torch.distributed as dist

# the kernels through the PyTorch backend directly (not linseq.torch's public functions, which
# reach linseq.compat.fla's, which reach this module for cp_context)
from ._delta_rule import delta_rule, kda_gate
from ._opspec import CONV1D, SSM1, by_name
from ._options import ConvOptions, Ssm1Options, kernel_activation
from ._torch_backend import TorchBackend

SSD, SSD_SEGMENT = by_name("ssd"), by_name("ssd_segment")


# ------------------------------------------------------------------------------------------
# the context: which tokens a rank holds
# ------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ContextParallel:
    """Where this rank stands in the global split (built by build_context)."""
    group: Optional[object]
    rank: int
    world: int
    cu_seqlens: Tuple[int, ...]     # global offsets of the N sequences
    bounds: Tuple[int, ...]         # world + 1 token offsets: rank r holds [bounds[r], bounds[r+1])
    piece_seqs: Tuple[int, ...]     # the global sequence of each local piece, in order
    local_offsets: Tuple[int, ...]  # local cu_seqlens of the pieces
    receives: bool                  # the first piece continues a sequence from the previous rank
    sends: bool                     # the last piece continues on the next rank
    through: bool                   # the whole range lies inside one sequence (both of the above)
    timeout: float = 300.0          # seconds any wait for another rank may take

    @property
    def start(self):
        return self.bounds[self.rank]

    @property
    def end(self):
        return self.bounds[self.rank + 1]

    @property
    def num_seqs(self):
        return len(self.cu_seqlens) - 1

    @property
    def local_cu_seqlens(self):
        return torch.tensor(self.local_offsets, dtype=torch.int64)

    @property
    def ends_here(self):
        """The global sequences whose last token this rank holds (their final state is
        returned here)."""
        last = len(self.piece_seqs) - (1 if self.sends else 0)
        return self.piece_seqs[:max(last, 0)]

    @property
    def starts_here(self):
        return self.piece_seqs[1:] if self.receives else self.piece_seqs

    def local(self, tensor, dim=1):
        """This rank's slice of a tensor over all packed tokens (dimension `dim`)."""
        return tensor.narrow(dim, self.start, self.end - self.start)

    def _peer(self, rank):
        return rank if self.group is None else dist.get_global_rank(self.group, rank)


def _inside(cu, pos):
    """Whether token offset pos lies strictly inside a sequence (not at a boundary)."""
    return 0 < pos < cu[-1] and pos not in cu


def _check_offsets(name, values):
    if values[0] != 0 or any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"{name}: expected non-decreasing offsets from 0, got {list(values)}")


def build_context(cu_seqlens, group=None, lengths=None, *, rank=None, world=None,
                  timeout=300.0):
    """The context of this rank for the global packed sequences `cu_seqlens` (N+1 offsets,
    int, each sequence at least one token) split over the ranks of `group` (default: the
    world). lengths: the number of tokens each rank holds (any non-negative integers summing
    to T, zeros allowed); default an even split, the first T % world ranks one token more.
    rank and world default to the group's (given explicitly, no process group is needed:
    the split alone is then described). timeout: the seconds a call may wait for another
    rank (to arrive at the call or its backward, or for a state) before it raises
    DistributedError; it must cover how much later than this rank the slowest one may
    arrive. Every rank must pass the same cu_seqlens and lengths: the calls check it."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
    cu = tuple(int(c) for c in torch.as_tensor(cu_seqlens).reshape(-1).tolist())
    if len(cu) < 2:
        raise ValueError(f"cu_seqlens: expected N+1 >= 2 offsets, got {list(cu)}")
    _check_offsets("cu_seqlens", cu)
    if any(b == a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens: every sequence needs at least one token, got {list(cu)}")
    world = dist.get_world_size(group) if world is None else int(world)
    rank = dist.get_rank(group) if rank is None else int(rank)
    if not 0 <= rank < world:
        raise ValueError(f"rank: expected 0 <= rank < {world}, got {rank}")
    total = cu[-1]
    if lengths is None:
        lengths = [total // world + (1 if r < total % world else 0) for r in range(world)]
    lengths = [int(n) for n in lengths]
    if len(lengths) != world or any(n < 0 for n in lengths) or sum(lengths) != total:
        raise ValueError(f"lengths: expected {world} non-negative token counts summing to "
                         f"T = {total}, got {lengths}")
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    lo, hi = bounds[rank], bounds[rank + 1]
    seqs = [n for n in range(len(cu) - 1) if cu[n] < hi and cu[n + 1] > lo and lo < hi]
    offsets = [0] + [min(cu[n + 1], hi) - lo for n in seqs]
    receives, sends = _inside(cu, lo), _inside(cu, hi)
    through = receives and sends and len(seqs) <= 1
    return ContextParallel(group, rank, world, cu, tuple(bounds), tuple(seqs), tuple(offsets),
                           receives, sends, through, float(timeout))


# ------------------------------------------------------------------------------------------
# the chain and the autograd function shared by the ops
# ------------------------------------------------------------------------------------------

class DistributedError(RuntimeError):
    """The ranks of a linseq.distributed call disagree (different cu_seqlens, split, shapes,
    dtypes, options or order of calls), or one of them did not arrive within the context's
    timeout. Raised on every rank that notices, before anything of the call is exchanged."""


# Message tags: every call's states get their own (the same on every rank, as the ranks make
# the same calls in the same order), so that the states of two calls between the same two
# ranks never mix, whatever order autograd runs their backwards in; the checks take theirs
# from a sequence of their own above those, so that a rank one step ahead or behind meets
# the others' check (and its fingerprint says where it is) instead of waiting for a tag that
# never comes. Gloo matches point-to-point messages by sender and tag only, apart from the
# group's collectives.
_SPAN = 1 << 28
_STATE_TAGS, _CHECK_TAGS, _DETAIL_TAGS = 0, 2 * _SPAN, 3 * _SPAN
_LINKS = {}         # process group -> _Link
_ABANDONED = []     # works whose wait timed out: gloo may still write into their buffers


class _Link:
    """Per process group: the sequence of checks and whether a timeout broke it."""

    def __init__(self):
        self.calls = 0                    # the calls that passed their check (states' tags)
        self.checks = itertools.count()   # the checks, forward and backward (theirs)
        self.broken = None


def _link(cp):
    group = cp.group if cp.group is not None else dist.group.WORLD
    if cp.world > 1 and (group is None or not dist.is_initialized()):
        raise DistributedError(f"linseq.distributed: a context over {cp.world} ranks needs an "
                               f"initialized torch.distributed process group")
    return _LINKS.setdefault(group, _Link())


def _wait(cp, work, deadline, what):
    """Waits for a send or receive until the deadline; raises DistributedError (and leaves
    the work to gloo, which closes the connection) when it does not complete."""
    left = deadline - time.monotonic()
    try:
        if left > 0.001:
            work.wait(datetime.timedelta(seconds=left))
            return
        if work.is_completed():
            return
    except RuntimeError as e:
        _ABANDONED.append(work)
        if "Timed out" not in str(e):
            raise DistributedError(f"linseq.distributed: rank {cp.rank}: {what} failed: "
                                   f"{e}") from None
    _ABANDONED.append(work)
    raise DistributedError(f"linseq.distributed: rank {cp.rank}: {what} did not complete "
                           f"within the context's timeout of {cp.timeout:g} s")


def _post(cp, fn, tensor, peer, tag, what):
    """dist.isend or dist.irecv; an error (a connection gloo closed) as DistributedError."""
    try:
        return fn(tensor, cp._peer(peer), group=cp.group, tag=tag)
    except RuntimeError as e:
        raise DistributedError(f"linseq.distributed: rank {cp.rank}: {what} failed: "
                               f"{e}") from None


def _send(cp, tensor, to_rank, tag):
    what = f"sending the state to rank {to_rank}"
    work = _post(cp, dist.isend, tensor.detach().contiguous(), to_rank,
                 _STATE_TAGS + tag % (2 * _SPAN), what)
    _wait(cp, work, time.monotonic() + cp.timeout, what)


def _recv(cp, like, from_rank, tag):
    # zeros: a buffer is never read uninitialised (the checks make the sizes agree)
    buffer = torch.zeros_like(like, memory_format=torch.contiguous_format)
    what = f"receiving the state from rank {from_rank}"
    work = _post(cp, dist.irecv, buffer, from_rank, _STATE_TAGS + tag % (2 * _SPAN), what)
    _wait(cp, work, time.monotonic() + cp.timeout, what)
    return buffer


def _exchange(cp, tensor, tag, what):
    """Every rank's `tensor` (the same shape on every rank), [world, *shape], from one
    message to and from every other rank. Raises DistributedError naming the ranks that did
    not answer within the timeout."""
    deadline = time.monotonic() + cp.timeout
    found = tensor.new_zeros((cp.world,) + tuple(tensor.shape))
    found[cp.rank] = tensor
    others = [r for r in range(cp.world) if r != cp.rank]
    missing, failures, recvs, sends = [], [], {}, []

    def failed(r, e):
        missing.append(r)
        failures.append(str(e).split("failed: ", 1)[-1] if "failed: " in str(e) else "")

    for r in others:   # everything posted first: one message latency in all
        try:
            recvs[r] = _post(cp, dist.irecv, found[r], r, tag, "")
            sends.append(_post(cp, dist.isend, tensor, r, tag, ""))
        except DistributedError as e:
            failed(r, e)
    for r, work in recvs.items():
        try:
            _wait(cp, work, deadline, "")
        except DistributedError as e:
            if r not in missing:
                failed(r, e)
    if missing:
        _ABANDONED.extend(sends)
        detail = "; ".join(f for f in failures if f)
        ranks = ", ".join(map(str, missing))
        where = (f"rank(s) {ranks} could not be reached ({detail})" if detail else
                 f"rank(s) {ranks} did not within the context's timeout of {cp.timeout:g} s")
        raise DistributedError(
            f"linseq.distributed: rank {cp.rank} reached {what}, {where}. Every rank must "
            f"make the same linseq.distributed calls in the same order and run the "
            f"backward of each call that built a graph (or of none).")
    for work in sends:
        _wait(cp, work, deadline, f"{what}: sending")
    return found


def _digest(text):
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little",
                          signed=True)


_DETAIL_BYTES = 2048


def _agree(cp, fields):
    """Checks that every rank of the context arrived at the same step with the same fields
    (name -> text, the same names on every rank): one exchange of len(fields) int64. On a
    difference every rank exchanges the texts of the fields that differ and raises
    DistributedError naming them with every rank's value."""
    if cp.world == 1:
        return
    link = _link(cp)
    if link.broken is not None:
        raise DistributedError(f"linseq.distributed: an earlier exchange of this process "
                               f"group failed ({link.broken}); its connections are closed")
    seq = next(link.checks) % _SPAN
    names = list(fields)
    mine = torch.tensor([_digest(fields[n]) for n in names], dtype=torch.int64)
    try:
        table = _exchange(cp, mine, _CHECK_TAGS + seq, fields["step"])
    except DistributedError as e:
        link.broken = str(e)
        raise
    differ = [i for i in range(len(names)) if not bool((table[:, i] == table[0, i]).all())]
    if not differ:
        return
    text = "\n".join(f"{names[i]}: {fields[names[i]]}" for i in differ).encode()[:_DETAIL_BYTES]
    mine = torch.zeros(_DETAIL_BYTES, dtype=torch.uint8)
    mine[:len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    try:
        every = _exchange(cp, mine, _DETAIL_TAGS + seq, fields["step"])
    except DistributedError as e:
        link.broken = str(e)
        raise
    said = [bytes(row.tolist()).rstrip(b"\0").decode(errors="replace").split("\n")
            for row in every]
    lines = []
    for k, i in enumerate(differ):
        values = [row[k].split(": ", 1)[-1] if k < len(row) else "?" for row in said]
        lines.append(f"{names[i]}: " + "; ".join(f"rank {r} {v}" for r, v in enumerate(values)))
    raise DistributedError(f"linseq.distributed: the ranks disagree (rank {cp.rank} noticed "
                           f"it at {fields['step']}):\n  " + "\n  ".join(lines) + "\nEvery "
                           f"rank must make the same calls in the same order, with the same "
                           f"cu_seqlens, lengths, shapes (but the tokens), dtypes and options.")


def _fields(runner, inputs, build, call):
    """What every rank's call must agree on, as texts."""
    cp = runner.cp
    args = []
    for name, t in zip(runner.names, inputs):
        if not isinstance(t, torch.Tensor):
            args.append(f"{name}={t!r}")
            continue
        shape = ["T_r" if (d == 1 and name in runner.per_token) else str(n)
                 for d, n in enumerate(t.shape)]
        args.append(f"{name}=[{', '.join(shape)}] {str(t.dtype).replace('torch.', '')}")
    return {"step": f"call {call} ({runner.op})",
            "cu_seqlens": str(list(cp.cu_seqlens)),
            "lengths": str([b - a for a, b in zip(cp.bounds, cp.bounds[1:])]),
            "arguments": ", ".join(args),
            "options": runner.settings,
            "backward": "a graph for the backward" if build else "no backward"}


def _leaf(t):
    if not isinstance(t, torch.Tensor):
        return t
    return t.detach().requires_grad_(t.requires_grad and t.is_floating_point())


class _Segment(torch.autograd.Function):
    """forward(runner, *inputs) -> runner's outputs. The runner (one per op) computes, with
    autograd on copies of the inputs: summarize() before the exchange (what the next rank's
    start state is made of), advance(summary, s_in) the state sent on, finish() the outputs
    from the true start state. The backward differentiates those graphs, with the chain in
    between: d(start state) goes back to the previous rank, d(sent state) comes from the next."""

    @staticmethod
    def forward(ctx, runner, *inputs):
        cp = runner.cp
        build = runner.grad_enabled and any(isinstance(t, torch.Tensor) and t.requires_grad
                                            for t in inputs)
        link = _link(cp) if cp.world > 1 else None
        runner.call = link.calls if link is not None else 0
        runner.tag = 2 * runner.call   # forward: tag, backward: tag + 1
        runner.fields = _fields(runner, inputs, build, runner.call)
        _agree(cp, dict(runner.fields, step=f"the forward of {runner.fields['step']}"))
        if link is not None:   # a refused call takes no number: the ranks stay in step
            link.calls += 1
        leaves = [_leaf(t) for t in inputs]
        with torch.set_grad_enabled(build):
            summary = runner.summarize(leaves)
            s_in = runner.zero_state()
            if cp.receives:
                s_in = _recv(cp, s_in, cp.rank - 1, runner.tag)
            if cp.sends:
                with torch.no_grad():
                    _send(cp, runner.advance(summary, s_in), cp.rank + 1, runner.tag)
            s_in = s_in.requires_grad_(build and cp.receives)
            outputs = runner.finish(leaves, summary, s_in)
        ctx.saved = (runner, leaves, summary, s_in, outputs) if build else None
        return tuple(o.detach() for o in outputs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *upstream):
        runner, leaves, summary, s_in, outputs = ctx.saved
        ctx.saved = None
        cp, tag = runner.cp, runner.tag + 1
        _agree(cp, dict(runner.fields, step=f"the backward of {runner.fields['step']}"))
        local = [(o, g) for o, g in zip(outputs, upstream) if g is not None and o.requires_grad]
        wanted = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        # the local outputs' gradients in full before the chain when the runner says that is
        # cheaper than differentiating their graph twice; else only d(start state) first
        early = wanted if runner.early_leaf_grads else []
        starts = [s_in] if cp.receives else []
        found = _grads(local, starts + early, retain=True)
        d_in = None
        if cp.receives:   # sent even where the local outputs do not reach it
            d_in = torch.zeros_like(s_in) if found[0] is None else found[0]
        late = [] if early else local
        if cp.sends:
            with torch.enable_grad():
                s_start = s_in.detach().requires_grad_()
                s_out = runner.advance(summary, s_start)
            if cp.receives and not runner.advance_uses_start:
                _send(cp, d_in, cp.rank - 1, tag)   # nothing to wait for: unblock rank - 1
            d_out = _recv(cp, s_out, cp.rank + 1, tag)
            if s_out.requires_grad:
                late = late + [(s_out, d_out)]
                if cp.receives and runner.advance_uses_start:
                    d_start = _grads([(s_out, d_out)], [s_start], retain=True)[0]
                    d_in = d_in if d_start is None else d_in + d_start
            if cp.receives and runner.advance_uses_start:
                _send(cp, d_in, cp.rank - 1, tag)
        elif cp.receives:
            _send(cp, d_in, cp.rank - 1, tag)
        # None where an input reaches no output: autograd reads it as zero, so nothing is
        # allocated or added for it (with every leaf gradient found early, late is empty)
        total = dict(zip(map(id, early), found[len(starts):]))
        # a leaf the sent state reads through a stand-in (the conv's tail of x) gets the
        # stand-in's small gradient added where it lies, not a full-size one
        stand_ins = [(t, proxy, lo) for t, proxy, lo in getattr(runner, "stand_ins", ())
                     if late and id(t) in total]
        late_grads = _grads(late, wanted + [proxy for _, proxy, _ in stand_ins], retain=False)
        for t, g in zip(wanted, late_grads):
            if g is not None:
                total[id(t)] = g if total.get(id(t)) is None else total[id(t)] + g
        for (t, _, lo), g in zip(stand_ins, late_grads[len(wanted):]):
            if g is not None:   # in place: the early pass's own tensor
                if total[id(t)] is None:
                    total[id(t)] = torch.zeros_like(t)
                total[id(t)][0, lo:].add_(g)
        return (None,) + tuple(total.get(id(t)) if isinstance(t, torch.Tensor) else None
                               for t in leaves)


def _grads(pairs, inputs, retain):
    """The gradients of sum(<output, upstream>) over pairs w.r.t. inputs: None where an
    input does not reach the outputs, and for every input when there are no pairs (no
    work at all)."""
    if not inputs or not pairs:
        return [None] * len(inputs)
    outs, ups = zip(*pairs)
    return list(torch.autograd.grad(outs, inputs, ups, retain_graph=retain, allow_unused=True))


def _final_states(cp, rows, shape, like):
    """[N, *shape] with the rows of the sequences ending on this rank, zeros elsewhere."""
    full = like.new_zeros((cp.num_seqs,) + tuple(shape))
    if not rows:
        return full
    index = torch.tensor([n for n, _ in rows], dtype=torch.int64)
    return full.index_copy(0, index, torch.stack([r for _, r in rows]))


def _joined(pieces, empty):
    """The pieces' outputs along time (no copy for one piece)."""
    return empty if not pieces else pieces[0] if len(pieces) == 1 else torch.cat(pieces, 1)


def _rebased(offsets):
    """cu_seqlens from 0 for local pieces; None for one piece (the plain B = 1 call)."""
    if offsets is None or len(offsets) <= 2:
        return None
    return torch.tensor([o - offsets[0] for o in offsets], dtype=torch.int64)


def _shape(value):
    return f"shape {list(value.shape)}" if hasattr(value, "shape") else f"{type(value)}"


def _check_local(cp, name, tensor, dim=1):
    if not isinstance(cp, ContextParallel):
        raise TypeError(f"cp_context: expected the result of build_context, got {type(cp)}")
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32:
        raise TypeError(f"{name}: expected a float32 torch tensor (context parallelism runs "
                        f"in float32), got {getattr(tensor, 'dtype', type(tensor))}")
    if tensor.dim() < 2 or tensor.shape[0] != 1 or tensor.shape[dim] != cp.end - cp.start:
        raise ValueError(f"{name}: expected this rank's {cp.end - cp.start} tokens as "
                         f"[1, {cp.end - cp.start}, ...], got {_shape(tensor)}")


def _cut(runner, a, lo, hi):
    """The runner's inputs over local tokens [lo, hi): the per-token ones sliced."""
    return {n: (a[n][:, lo:hi] if n in runner.per_token and a[n] is not None else a[n])
            for n in runner.names}


def _pieces_from_here(runner, a, run):
    """The pieces that start on this rank (all but a first one continuing from the previous
    rank) in one call, run(a, lo, hi, h0, offsets), from their sequences' rows of h0: its
    (outputs, final states), or None when no piece starts here."""
    cp = runner.cp
    first = 1 if cp.receives else 0
    offsets = cp.local_offsets[first:]
    if len(offsets) <= 1:
        return None
    h0 = a["h0"]
    if h0 is not None:
        h0 = h0.index_select(0, torch.tensor(cp.piece_seqs[first:], dtype=torch.int64))
    return run(a, offsets[0], offsets[-1], h0, offsets)


def _rerun_finish(runner, a, run, s_in, shape, empty):
    """The outputs of a runner that reruns its first piece from the true start state s_in
    (SSM1, SSD): (outputs along time, final states [N, *shape] of the sequences ending here).
    A rank inside one sequence runs its whole range from s_in; any other joins that first
    piece's run to the pieces summarize ran (runner.rest). empty: the outputs of no token."""
    cp = runner.cp
    if cp.through:
        T = cp.end - cp.start
        y = run(a, 0, T, s_in[None])[0] if T else empty
        return y, _final_states(cp, [], shape, s_in)
    pieces, rows = [], []
    if cp.receives:
        y_head, h_head = run(a, 0, cp.local_offsets[1], s_in[None])
        pieces.append(y_head)
        rows.append((cp.piece_seqs[0], h_head[0]))
    if runner.rest is not None:
        pieces.append(runner.rest[0])
        first = 1 if cp.receives else 0
        rows += list(zip(cp.piece_seqs[first:], runner.rest[1]))
    rows = [(n, r) for n, r in rows if n in cp.ends_here]
    return _joined(pieces, empty), _final_states(cp, rows, shape, s_in)


# ------------------------------------------------------------------------------------------
# KDA / Gated DeltaNet
# ------------------------------------------------------------------------------------------

class _KdaRunner:
    """State [HV, K, V]. A piece continuing from the previous rank runs before the exchange
    with the widened values (its P, R, o_R, o_P): the exchange then waits on no rank's kernel,
    and the outputs are o_R + o_P S_start. The other pieces start here and run plainly."""
    names = ("q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias")
    per_token = ("q", "k", "v", "g", "beta")
    op = "chunk_kda"
    early_leaf_grads = False   # d(start state) alone is cheap: o_P^T do, P^T d(final state)

    def __init__(self, cp, shapes, options, lower_bound):
        self.cp, self.options, self.lower_bound = cp, options, lower_bound
        self.settings = f"{sorted(options.items())}, lower_bound={lower_bound!r}"
        self.grad_enabled = torch.is_grad_enabled()
        _, _, self.HV, self.V = shapes["v"]
        self.K = shapes["q"][-1]
        self.advance_uses_start = cp.through

    def zero_state(self):
        return torch.zeros(self.HV, self.K, self.V)

    def _kda(self, a, lo, hi, h0, offsets=None):
        cut = _cut(self, a, lo, hi)
        gate = kda_gate(self.options["gate_in_kernel"], cut["A_log"], cut["dt_bias"],
                        self.lower_bound)
        return delta_rule("chunked", self.options["chunk_size"], "torch", cut["q"], cut["k"],
                          cut["v"], cut["beta"], g=cut["g"], gate=gate, initial_state=h0,
                          output_final_state=True, cu_seqlens=_rebased(offsets),
                          scale=self.options["scale"], qk_l2norm=self.options["qk_l2norm"],
                          beta_logit=self.options["beta_logit"], neg_eigval=False,
                          state_v_first=False, out_like=cut["q"])

    def _affine_head(self, a, T):
        """(P, R) of the first T tokens from one run with v' = [v | 0], S'_0 = [0 | I]."""
        if T == 0:
            self.o_R = self.o_P = None
            return torch.eye(self.K).expand(self.HV, -1, -1), self.zero_state()
        v = a["v"][:, :T]
        wide = dict(a, v=torch.cat([v, v.new_zeros(v.shape[:-1] + (self.K,))], -1))
        h0 = torch.cat([torch.zeros(1, self.HV, self.K, self.V),
                        torch.eye(self.K).expand(1, self.HV, -1, -1)], -1)
        o, ht = self._kda(wide, 0, T, h0)
        self.o_R, self.o_P = o[..., :self.V], o[..., self.V:]
        return ht[0, :, :, self.V:], ht[0, :, :, :self.V]

    def summarize(self, leaves):
        a = dict(zip(self.names, leaves))
        cp = self.cp
        self.head = None
        if cp.receives:
            self.head = self._affine_head(a, cp.local_offsets[1] if cp.piece_seqs else 0)
        self.rest = _pieces_from_here(self, a, self._kda)
        if not cp.sends:
            return ()
        return self.head if cp.through else (self.rest[1][-1],)

    def advance(self, summary, s_in):
        if self.cp.through:
            P, R = summary
            return torch.matmul(P, s_in) + R
        return summary[0]

    def finish(self, leaves, summary, s_in):
        a = dict(zip(self.names, leaves))
        cp = self.cp
        pieces, rows = [], []
        if self.head is not None and self.o_P is not None:
            pieces.append(_plus_state_term(self.o_R, self.o_P, s_in))
            P, R = self.head
            rows.append((cp.piece_seqs[0], torch.matmul(P, s_in) + R))
        if self.rest is not None:
            o_rest, ht_rest = self.rest
            pieces.append(o_rest)
            rows += list(zip(cp.piece_seqs[1 if cp.receives else 0:], ht_rest))
        rows = [(n, r) for n, r in rows if n in cp.ends_here]
        o = _joined(pieces, a["v"].new_zeros((1, 0, self.HV, self.V)))
        return o, _final_states(cp, rows, (self.HV, self.K, self.V), s_in)


def _plus_state_term(o_R, o_P, s_in):
    """o_R + o_P S_start per head: [1,T,HV,V] + [1,T,HV,K] @ [HV,K,V] (one batched matmul
    over heads; the result is a [1,T,HV,V] view of a head-major buffer)."""
    by_head = torch.baddbmm(o_R[0].transpose(0, 1), o_P[0].transpose(0, 1), s_in)  # [HV,T,V]
    return by_head.transpose(0, 1).unsqueeze(0)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None,
              dt_bias=None, lower_bound=None, use_beta_sigmoid_in_kernel=False, *,
              cp_context, chunk_size=64, state_v_first=False):
    """KDA (per-channel decay g [1,T,HV,K]) or Gated DeltaNet (per-head g [1,T,HV]) over this
    rank's tokens of the global packed batch: q, k [1,T_r,H,K], v [1,T_r,HV,V], beta
    [1,T_r,HV], the other arguments as linseq.torch.chunk_kda. initial_state [N,HV,K,V] is
    the global one (each row is read by the rank holding that sequence's first token; every
    rank may pass the same tensor). Returns (o [1,T_r,HV,V], final_state [N,HV,K,V] or None):
    the final state has the rows of the sequences ending on this rank, zeros elsewhere.
    state_v_first: both states are [N,HV,V,K] instead."""
    cp = cp_context
    for name, t in (("q", q), ("k", k), ("v", v), ("beta", beta), ("g", g)):
        _check_local(cp, name, t)
    if initial_state is not None and (not isinstance(initial_state, torch.Tensor)
                                      or initial_state.dim() != 4
                                      or initial_state.shape[0] != cp.num_seqs):
        layout = "HV, V, K" if state_v_first else "HV, K, V"
        raise ValueError(f"initial_state: expected [{cp.num_seqs}, {layout}] (one row per "
                         f"global sequence), got {_shape(initial_state)}")
    kda_gate(use_gate_in_kernel, A_log, dt_bias, lower_bound)  # its checks, before any message
    options = dict(scale=scale, qk_l2norm=use_qk_l2norm_in_kernel,
                   gate_in_kernel=use_gate_in_kernel, beta_logit=use_beta_sigmoid_in_kernel,
                   chunk_size=chunk_size)
    if initial_state is not None and state_v_first:
        initial_state = initial_state.transpose(-1, -2)
    runner = _KdaRunner(cp, {"q": tuple(q.shape), "v": tuple(v.shape)}, options, lower_bound)
    o, ht = _Segment.apply(runner, q, k, v, g, beta, initial_state, A_log, dt_bias)
    if not output_final_state:
        return o, None
    return o, (ht.transpose(-1, -2) if state_v_first else ht)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False, *,
                           cp_context, state_v_first=False):
    """Gated DeltaNet: chunk_kda with one log decay per head, g [1,T_r,HV]."""
    return chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state,
                     use_qk_l2norm_in_kernel, cp_context=cp_context,
                     state_v_first=state_v_first)


# ------------------------------------------------------------------------------------------
# SSM1 (Mamba1 selective scan)
# ------------------------------------------------------------------------------------------

class _Ssm1Runner:
    """State [D, N], diagonal map. A rank inside one sequence sends P * h_start + R, R from a
    run from h0 = 0, P the product of its decays, then reruns its piece from the true start;
    otherwise it sends the final state of its last piece and reruns only its first piece."""
    names = ("x", "A", "B", "C", "D", "dt", "gate", "h0", "dt_bias")
    per_token = ("x", "B", "C", "dt", "gate")
    op = "state_space_v1"

    @property
    def early_leaf_grads(self):
        # the rerun piece's backward once, unless the pieces sent from would run twice instead
        return self.cp.receives and (self.cp.through or not self.cp.sends)

    def __init__(self, cp, D, N, options):
        self.cp, self.D, self.N, self.options = cp, D, N, options
        self.settings = repr(options)
        self.grad_enabled = torch.is_grad_enabled()
        self.advance_uses_start = cp.through

    def zero_state(self):
        return torch.zeros(self.D, self.N)

    def _scan(self, a, lo, hi, h0, offsets=None):
        c = _cut(self, a, lo, hi)
        arrays = dict(x=c["x"], dt=c["dt"], A=c["A"], B=c["B"], C=c["C"], D=c["D"],
                      gate=c["gate"], h0=h0, dt_bias=c["dt_bias"])
        y, h = TorchBackend.run(SSM1, arrays, _rebased(offsets), self.options)
        return y, h

    def _decay(self, a):
        """P = exp(A * sum_t dt_t): the product of the per-token decays exp(dt_t A), formed
        directly (O(T*D) next to the scan's O(T*D*N)) instead of by a run from h0 = 1."""
        dt = a["dt"][0]
        if self.options.dt_softplus:
            bias = 0.0 if a["dt_bias"] is None else a["dt_bias"]
            dt = torch.nn.functional.softplus(dt + bias)
        return torch.exp(a["A"] * dt.sum(0)[:, None])

    def summarize(self, leaves):
        a = dict(zip(self.names, leaves))
        cp = self.cp
        T = cp.end - cp.start
        if cp.through and T == 0:
            return (torch.ones(self.D, self.N), self.zero_state())
        if cp.through:
            return (self._decay(a), self._scan(a, 0, T, None)[1][0])
        self.rest = _pieces_from_here(self, a, self._scan)
        return (self.rest[1][-1],) if cp.sends else ()

    def advance(self, summary, s_in):
        if self.cp.through:
            P, R = summary
            return P * s_in + R
        return summary[0]

    def finish(self, leaves, summary, s_in):
        a = dict(zip(self.names, leaves))
        empty = a["x"].new_zeros((1, 0, self.D))
        return _rerun_finish(self, a, self._scan, s_in, (self.D, self.N), empty)


def state_space_v1(hidden_states, A, B, C, D, dt, gate=None, initial_state=None, act_fn=None,
                   *, dt_softplus=False, dt_bias=None, cp_context):
    """The Mamba1 selective scan over this rank's tokens: hidden_states, dt, gate [1,T_r,D];
    B, C [1,T_r,N] (or [1,T_r,G,N]); A [D,N]; D [D] or None; initial_state [N_seq,D,N] the
    global one; act_fn None (silu) or an in-kernel activation name. Returns (y [1,T_r,D],
    final state [N_seq,D,N] with the rows of the sequences ending on this rank)."""
    cp = cp_context
    for name, t in (("hidden_states", hidden_states), ("dt", dt), ("B", B), ("C", C)):
        _check_local(cp, name, t)
    if gate is not None:
        _check_local(cp, "gate", gate)
    if act_fn is not None and not isinstance(act_fn, str):
        raise TypeError(f"act_fn: expected None or an activation name, got {act_fn!r}")
    if initial_state is not None and (not isinstance(initial_state, torch.Tensor)
                                      or initial_state.dim() != 3
                                      or initial_state.shape[0] != cp.num_seqs):
        raise ValueError(f"initial_state: expected [{cp.num_seqs}, D, N] (one row per global "
                         f"sequence), got {_shape(initial_state)}")
    if not isinstance(A, torch.Tensor) or A.dim() != 2:
        raise ValueError(f"A: expected a [D, N] tensor, got {_shape(A)}")
    Dm, N = A.shape
    # act_fn as linseq.torch.state_space_v1 reads it: the gate's activation (None: silu)
    activation = kernel_activation(act_fn) if gate is not None else None
    runner = _Ssm1Runner(cp, Dm, N, Ssm1Options(activation=activation,
                                                dt_softplus=bool(dt_softplus)))
    return _Segment.apply(runner, hidden_states, A, B, C, D, dt, gate, initial_state,
                          dt_bias)


# ------------------------------------------------------------------------------------------
# SSD (Mamba2)
# ------------------------------------------------------------------------------------------

_NO_LIMIT = (0.0, math.inf)


class _SsdRunner:
    """State [H, P, N], one scalar decay per head: S_end = P S_start + R with P [H]. A rank
    inside one sequence sends P S_start + R, (P, R) from the C summary (ssd_segment: P =
    exp(A sum dt) from the kernel's own dt, R the end state from zeros, both differentiable),
    then reruns its piece from the true start; otherwise it sends the final state of its last
    piece and reruns only its first piece, as SSM1."""
    names = ("x", "dt", "A", "B", "C", "D", "z", "h0", "dt_bias")
    per_token = ("x", "dt", "B", "C", "z")
    op = "ssd"

    @property
    def early_leaf_grads(self):
        return self.cp.receives and (self.cp.through or not self.cp.sends)

    def __init__(self, cp, H, P, N, options):
        self.cp, self.H, self.P, self.N = cp, H, P, N
        self.options = SSD.options(**options)
        self.summary_options = SSD_SEGMENT.options(**options)
        self.settings = ", ".join(f"{k}={v!r}" for k, v in sorted(options.items()))
        self.grad_enabled = torch.is_grad_enabled()
        self.advance_uses_start = cp.through

    def zero_state(self):
        return torch.zeros(self.H, self.P, self.N)

    def _ssd(self, a, lo, hi, h0, offsets=None):
        arrays = dict(_cut(self, a, lo, hi), h0=h0)
        return TorchBackend.run(SSD, arrays, _rebased(offsets), self.options)

    def _summary(self, a):
        """(P [H], R [H,P,N]) of the whole local range (one piece); D and z do not enter."""
        arrays = dict(a, D=None, z=None, h0=None)
        P, R = TorchBackend.run(SSD_SEGMENT, arrays, None, self.summary_options)
        return P[0], R[0]

    def summarize(self, leaves):
        a = dict(zip(self.names, leaves))
        cp = self.cp
        T = cp.end - cp.start
        if cp.through and T == 0:
            return (torch.ones(self.H), self.zero_state())
        if cp.through:
            return self._summary(a)
        self.rest = _pieces_from_here(self, a, self._ssd)
        return (self.rest[1][-1],) if cp.sends else ()

    def advance(self, summary, s_in):
        if self.cp.through:
            P, R = summary
            return P[:, None, None] * s_in + R
        return summary[0]

    def finish(self, leaves, summary, s_in):
        a = dict(zip(self.names, leaves))
        empty = a["x"].new_zeros((1, 0, self.H, self.P))
        return _rerun_finish(self, a, self._ssd, s_in, (self.H, self.P, self.N), empty)


def ssd(x, dt, A, B, C, D=None, z=None, initial_state=None, *, dt_softplus=False,
        dt_bias=None, dt_limit=_NO_LIMIT, cp_context):
    """Mamba2's SSD (linseq's "ssd" op, docs/semantics.md 5b) over this rank's tokens: x, z
    [1,T_r,H,P]; dt [1,T_r,H]; B, C [1,T_r,G,N]; A [H] (each <= 0); D [H] or [H,P] or None;
    dt_bias [H] (with dt_softplus); dt_limit (lo, hi) clamps dt as mamba's does ((0, inf):
    no clamp); initial_state [N_seq,H,P,N] the global one. Returns (y [1,T_r,H,P], final
    state [N_seq,H,P,N] with the rows of the sequences ending on this rank, zeros
    elsewhere)."""
    cp = cp_context
    for name, t in (("x", x), ("dt", dt), ("B", B), ("C", C)):
        _check_local(cp, name, t)
    if z is not None:
        _check_local(cp, "z", z)
    if x.dim() != 4:
        raise ValueError(f"x: expected [1, T_r, H, P], got {_shape(x)}")
    if not isinstance(A, torch.Tensor) or A.dim() != 1:
        raise ValueError(f"A: expected an [H] tensor, got {_shape(A)}")
    if B.dim() != 4 or C.dim() != 4:
        raise ValueError(f"B, C: expected [1, T_r, G, N], got {_shape(B)} and {_shape(C)}")
    _, _, H, P = x.shape
    N = B.shape[-1]
    if initial_state is not None and (not isinstance(initial_state, torch.Tensor)
                                      or tuple(initial_state.shape) != (cp.num_seqs, H, P, N)):
        raise ValueError(f"initial_state: expected [{cp.num_seqs}, {H}, {P}, {N}] (one row "
                         f"per global sequence), got {_shape(initial_state)}")
    if dt_bias is not None and not dt_softplus:
        raise ValueError("dt_bias: given without dt_softplus; expected None (the kernel adds "
                         "the bias only before its softplus)")
    lo, hi = (float(v) for v in dt_limit)
    options = dict(dt_softplus=bool(dt_softplus),
                   D_per_channel=isinstance(D, torch.Tensor) and D.dim() == 2)
    if (lo, hi) != _NO_LIMIT:
        options.update(dt_min=lo, dt_max=hi)
    runner = _SsdRunner(cp, H, P, N, options)
    return _Segment.apply(runner, x, dt, A, B, C, D, z, initial_state, dt_bias)


# ------------------------------------------------------------------------------------------
# causal conv1d
# ------------------------------------------------------------------------------------------

class _ConvRunner:
    """State: the W-1 inputs [D, W-1] before a piece, oldest first (zeros before a sequence's
    first token, or the given conv_state). What is sent on is the last W-1 inputs of the last
    piece, reaching back into the received ones when the rank holds fewer than W-1."""
    names = ("x", "weight", "bias", "conv_state")
    per_token = ("x",)
    op = "causal_conv1d"
    early_leaf_grads = True   # what is sent on is a slice of x: its backward is a copy

    def __init__(self, cp, D, W, activation):
        self.cp, self.D, self.W, self.activation = cp, D, W, activation
        self.settings = f"activation={activation!r}"
        self.grad_enabled = torch.is_grad_enabled()
        self.advance_uses_start = cp.through

    def zero_state(self):
        return torch.zeros(self.D, self.W - 1)

    def _start_of(self, a, n):
        state = a["conv_state"]
        return self.zero_state() if state is None else state[n]

    def summarize(self, leaves):
        a = dict(zip(self.names, leaves))
        cp = self.cp
        if not cp.sends:
            return ()
        lo = cp.local_offsets[-2] if len(cp.local_offsets) > 1 else 0
        lo = max(lo, cp.end - cp.start - (self.W - 1))   # no more than the state reads
        x = a["x"]
        tail = x[0, lo:]
        self.stand_ins = ()
        if torch.is_grad_enabled() and x.requires_grad:
            # a leaf of its own: the backward adds its [W-1, D] gradient into dx's last
            # rows instead of differentiating a slice of x (a full-size zeros tensor)
            tail = tail.detach().requires_grad_()
            self.stand_ins = ((x, tail, lo),)
        tail = tail.transpose(0, 1)   # [D, last W-1 tokens of the last piece]
        if cp.through:
            return (tail,)
        return (torch.cat([self._start_of(a, cp.piece_seqs[-1]), tail], 1)[:, -(self.W - 1):],)

    def advance(self, summary, s_in):
        if self.cp.through:
            return torch.cat([s_in, summary[0]], 1)[:, -(self.W - 1):]
        return summary[0]

    def finish(self, leaves, summary, s_in):
        a = dict(zip(self.names, leaves))
        cp = self.cp
        if cp.end == cp.start:
            return (a["x"].new_zeros((1, 0, self.D)),
                    _final_states(cp, [], (self.D, self.W - 1), s_in))
        starts = [s_in if (i == 0 and cp.receives) else self._start_of(a, n)
                  for i, n in enumerate(cp.piece_seqs)]
        arrays = dict(x=a["x"], weight=a["weight"], bias=a["bias"],
                      conv_state=torch.stack(starts))
        y, ht = TorchBackend.run(CONV1D, arrays, cp.local_cu_seqlens,
                                 ConvOptions(activation=self.activation))
        rows = [(n, h) for n, h in zip(cp.piece_seqs, ht) if n in cp.ends_here]
        return y, _final_states(cp, rows, (self.D, self.W - 1), s_in)


def causal_conv1d(x, weight, bias=None, activation=None, conv_state=None, *, cp_context):
    """Causal depthwise conv1d over this rank's tokens: x [1,T_r,D]; weight [D,W]; bias [D];
    conv_state [N,D,W-1] the global inputs before each sequence (read by the rank holding its
    first token). Returns (y [1,T_r,D], final conv state [N,D,W-1] with the rows of the
    sequences ending on this rank)."""
    cp = cp_context
    _check_local(cp, "x", x)
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight: expected a [D, W] tensor, got {type(weight)}")
    if weight.dim() == 3:
        weight = weight.reshape(weight.shape[0], weight.shape[-1])
    if weight.dim() != 2 or weight.shape[1] < 2:
        raise ValueError(f"weight: expected [D, W] with W >= 2, got {list(weight.shape)}")
    if conv_state is not None and (not isinstance(conv_state, torch.Tensor)
                                   or conv_state.dim() != 3 or conv_state.shape[0] != cp.num_seqs):
        raise ValueError(f"conv_state: expected [{cp.num_seqs}, D, W-1] (one row per global "
                         f"sequence), got {_shape(conv_state)}")
    runner = _ConvRunner(cp, x.shape[-1], weight.shape[1], activation)
    return _Segment.apply(runner, x, weight, bias, conv_state)
