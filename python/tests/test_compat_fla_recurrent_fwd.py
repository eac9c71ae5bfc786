"""linseq.compat.fla.fused_recurrent_kda_fwd: fla-core's forward of fused_recurrent_kda, the
function serving code calls for decode, with fla's signature (read from the installed
fla-core), its in-place final state, out= buffer and state pool (ssm_state_indices, [N] for
decode and [N,S] with num_accepted_tokens for speculative decoding). Values against fla's
own float64 reference (fla.ops.kda.naive.naive_recurrent_kda) and the float64 loop of
naive.py, and against linseq's chunked path."""

import inspect

import numpy as np
import pytest

from conftest import require

torch = require("torch")
F = torch.nn.functional
import linseq  # noqa: E402
import naive  # noqa: E402
from linseq.compat import fla  # noqa: E402

H, HV, K, V = 2, 4, 8, 6


def close(name, got, want, tol=2e-5):
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, (name, tuple(got.shape), tuple(want.shape))
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    assert err <= tol, f"{name}: max rel err {err:.3g} > {tol}"


def tokens(B, T, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HV, K, generator=gen))
    beta = torch.rand(B, T, HV, generator=gen)
    return q, k, v, g, beta


def test_signature_is_flas():
    reference = pytest.importorskip("fla.ops.kda.fused_recurrent").fused_recurrent_kda_fwd
    reference = inspect.unwrap(reference)

    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
    assert params(fla.fused_recurrent_kda_fwd) == params(reference)


def test_dense_in_place_equals_flas_naive_and_the_chunk_path():
    naive_fla = pytest.importorskip("fla.ops.kda.naive").naive_recurrent_kda
    q, k, v, g, beta = tokens(2, 29, seed=1)
    h0 = 0.3 * torch.randn(2, HV, K, V, generator=torch.Generator().manual_seed(2))
    state, out = h0.clone(), torch.full_like(v, float("nan"))
    o, final = fla.fused_recurrent_kda_fwd(q, k, v, g, beta, None, None, state, 0.4, out=out)
    assert o is out and final is state               # fla's defaults: in place, out= filled
    o_ref, h_ref = naive_fla(*(x.double() for x in (q, k, v, g, beta)), scale=0.4,
                             initial_state=h0.double(), output_final_state=True)
    close("o", o, o_ref)
    close("final_state", state, h_ref)
    o_chunk, h_chunk = linseq.chunk_kda(q, k, v, g, beta, scale=0.4, initial_state=h0,
                                        output_final_state=True, chunk_size=16)
    close("o vs chunk", o, o_chunk)
    close("final_state vs chunk", state, h_chunk)
    # inplace_final_state=False: a new float32 state, the given one untouched
    o2, h2 = fla.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=h0, scale=0.4,
                                         inplace_final_state=False, output_final_state=True)
    assert h2 is not h0 and h2.dtype == torch.float32
    torch.testing.assert_close(h2, state, rtol=0, atol=0)
    torch.testing.assert_close(o2, o, rtol=0, atol=0)


def _pool(R, seed, padded=True):
    """A pool of R rows whose rows are not contiguous (a padded row stride, as in vLLM's
    cache), so the writes go to the caller's memory through its strides."""
    gen = torch.Generator().manual_seed(seed)
    storage = torch.randn(R, HV * K * V + 5, generator=gen) * 0.3
    pool = storage[:, :HV * K * V].view(R, HV, K, V) if padded else storage[:, :HV * K * V]
    return storage, pool


def _gate_args(seed):
    gen = torch.Generator().manual_seed(seed)
    return dict(A_log=torch.randn(HV, generator=gen), dt_bias=torch.randn(HV * K, generator=gen))


def test_decode_pool_as_vllm_calls_it():
    """q..beta [1, N, ...] with cu_seqlens = arange(N+1), a [N] row per request (-1: a
    padding request), the gate and beta sigmoid and l2 norm in the kernel, in place."""
    N, R = 5, 8
    q, k, v, g_raw, beta_logit = tokens(1, N, seed=3)
    rows = torch.tensor([6, 0, -1, 3, 1])
    storage, pool = _pool(R, seed=4)
    before = storage.clone()
    gate = _gate_args(5)
    o, final = fla.fused_recurrent_kda_fwd(
        q, k, v, g_raw, beta_logit, gate["A_log"], gate["dt_bias"], pool, None,
        cu_seqlens=torch.arange(N + 1), ssm_state_indices=rows, use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=-5.0)
    assert final is pool
    for n, r in enumerate(rows.tolist()):
        if r < 0:
            assert torch.equal(o[0, n], torch.zeros(HV, V))
            continue
        o_ref, h_ref = naive.kda(q[:, n:n + 1], k[:, n:n + 1], v[:, n:n + 1],
                                 g_raw[:, n:n + 1], torch.sigmoid(beta_logit[:, n:n + 1]),
                                 h0=before[r:r + 1, :HV * K * V].view(1, HV, K, V), l2=True,
                                 gate_in_kernel=True, lower_bound=-5.0, **gate)
        close(f"o[{n}]", o[0, n], o_ref[0, 0])
        close(f"row {r}", pool[r], h_ref[0])
    untouched = [r for r in range(R) if r not in rows.tolist()]
    assert torch.equal(storage[untouched], before[untouched])
    assert torch.equal(storage[:, HV * K * V:], before[:, HV * K * V:])   # the padding
    # the same step through linseq's own decode
    want_pool = before[:, :HV * K * V].reshape(R, HV, K, V).clone()
    o_dec, _ = linseq.kda_decode(q[0], k[0], v[0], g_raw[0], beta_logit[0], want_pool, rows,
                                 use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                 use_beta_sigmoid_in_kernel=True, lower_bound=-5.0,
                                 inplace=True, **gate)
    close("o vs kda_decode", o[0], o_dec[:, 0])
    close("pool vs kda_decode", pool, want_pool)


def test_speculative_decoding_slots_per_token():
    """[N,S] rows and num_accepted_tokens: sequence n starts from row [n, accepted-1] and the
    state after its token t lands in row [n, t]; lengths 3, 1, 2 (and a padding one)."""
    lengths = [3, 1, 0, 2]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]))
    T = int(cu[-1])
    q, k, v, g, beta = tokens(1, T, seed=6)
    rows = torch.tensor([[0, 1, 2], [3, 4, 5], [-1, -1, -1], [6, 7, 8]])
    accepted = torch.tensor([2, 1, 1, 3])
    R = 10
    pool = 0.3 * torch.randn(R, HV, K, V, generator=torch.Generator().manual_seed(7))
    before = pool.clone()
    o, final = fla.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool,
                                           cu_seqlens=cu, ssm_state_indices=rows,
                                           num_accepted_tokens=accepted)
    assert final is pool
    written = set()
    for n, length in enumerate(lengths):
        if length == 0:
            continue
        start = int(rows[n, int(accepted[n]) - 1])
        h = before[start:start + 1]
        for t in range(length):
            at = int(cu[n]) + t
            o_ref, h = naive.kda(q[:, at:at + 1], k[:, at:at + 1], v[:, at:at + 1],
                                 g[:, at:at + 1], beta[:, at:at + 1], h0=h)
            close(f"o seq {n} token {t}", o[0, at], o_ref[0, 0])
            close(f"row {int(rows[n, t])}", pool[int(rows[n, t])], h[0])
            written.add(int(rows[n, t]))
        # the chunk path over the whole sequence ends where the last slot says
        s = slice(int(cu[n]), int(cu[n + 1]))
        o_c, h_c = linseq.chunk_kda(q[:, s], k[:, s], v[:, s], g[:, s], beta[:, s],
                                    initial_state=before[start:start + 1],
                                    output_final_state=True)
        close(f"seq {n} vs chunk", o[:, s], o_c)
        close(f"seq {n} state vs chunk", pool[int(rows[n, length - 1])], h_c[0])
    for r in set(range(R)) - written:
        assert torch.equal(pool[r], before[r]), r
    # not in place: the state after every token, one row per token
    o2, per_token = fla.fused_recurrent_kda_fwd(
        q, k, v, g, beta, initial_state=before, cu_seqlens=cu, ssm_state_indices=rows,
        num_accepted_tokens=accepted, inplace_final_state=False, output_final_state=True)
    assert per_token.shape == (T, HV, K, V)
    torch.testing.assert_close(o2, o, rtol=0, atol=0)
    for n, length in enumerate(lengths):
        for t in range(length):
            torch.testing.assert_close(per_token[int(cu[n]) + t], pool[int(rows[n, t])],
                                       rtol=0, atol=0)


def test_numpy_pool_in_place():
    q, k, v, g, beta = (x.numpy() for x in tokens(3, 1, seed=8))
    pool = np.random.default_rng(9).standard_normal((4, HV, K, V)).astype(np.float32)
    before = pool.copy()
    rows = np.array([2, 0, 3])
    o, final = fla.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool,
                                           ssm_state_indices=rows)
    assert final is pool and isinstance(o, np.ndarray)
    o_ref, h_ref = naive.kda(*(torch.as_tensor(x) for x in (q, k, v, g, beta)),
                             h0=torch.as_tensor(before[rows]))
    close("o", torch.as_tensor(o), o_ref)
    close("rows", torch.as_tensor(pool[rows]), h_ref)
    assert np.array_equal(pool[1], before[1])


def test_bad_arguments_are_refused_before_anything_is_written():
    q, k, v, g, beta = tokens(1, 3, seed=10)
    pool = torch.randn(4, HV, K, V)
    before = pool.clone()
    cu = torch.tensor([0, 1, 2, 3])
    out = torch.zeros_like(v)

    def bad(exc, match, **kwargs):
        args = dict(initial_state=pool, cu_seqlens=cu, ssm_state_indices=torch.tensor([0, 1, 2]))
        args.update(kwargs)
        with pytest.raises(exc, match=match):
            fla.fused_recurrent_kda_fwd(q, k, v, g, beta, **args)
        assert torch.equal(pool, before) and torch.equal(out, torch.zeros_like(v))
    bad(ValueError, "ssm_state_indices: .*row 4, out of range",
        ssm_state_indices=torch.tensor([0, 4, 1]), out=out)
    bad(ValueError, "ssm_state_indices: .*row 1 twice", ssm_state_indices=torch.tensor([1, 1, 2]))
    bad(ValueError, r"ssm_state_indices: expected \[N\] or \[N,S\] with N = 3",
        ssm_state_indices=torch.tensor([0, 1]))
    bad(ValueError, "num_accepted_tokens", ssm_state_indices=torch.tensor([[0], [1], [2]]),
        num_accepted_tokens=torch.tensor([1, 2, 1]))
    bad(ValueError, "sequence 0 has 3 tokens", cu_seqlens=torch.tensor([0, 3]),
        ssm_state_indices=torch.tensor([0]))
    bad(ValueError, "initial_state: required", initial_state=None)
    bad(TypeError, "out: .*floating", out=torch.zeros(v.shape, dtype=torch.int32))
    bad(TypeError, "initial_state: .*floating", initial_state=torch.zeros(4, HV, K, V,
                                                                          dtype=torch.int64))
    bad(ValueError, "out: expected v's shape", out=torch.zeros(1, 2, HV, V))
    bad(TypeError, "unexpected keyword argument 'bogus'", bogus=1)


def test_flas_own_function_reaches_it_through_the_backend():
    """With linseq registered as fla's backend, fla's fused_recurrent_kda_fwd on CPU tensors
    with a state pool (what fla's vLLM-decode tests call) runs here."""
    require("fla.backends")
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    from linseq.integrations import fla_backend
    fla_backend.register()
    q, k, v, g, beta = tokens(1, 3, seed=11)
    pool = torch.randn(5, HV, K, V, generator=torch.Generator().manual_seed(12))
    want = pool.clone()
    rows = torch.tensor([4, -1, 0])
    kwargs = dict(scale=K ** -0.5, cu_seqlens=torch.arange(4), ssm_state_indices=rows,
                  use_qk_l2norm_in_kernel=True)
    before = fla_backend.calls["fused_recurrent_kda"]
    o, final = fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool, **kwargs)
    assert fla_backend.calls["fused_recurrent_kda"] == before + 1 and final is pool
    o_want, _ = fla.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=want, **kwargs)
    assert torch.equal(o, o_want) and torch.equal(pool, want)
