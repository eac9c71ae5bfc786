"""linseq.ops.decode_pool (linseq_op_decode_pool) from NumPy: a serving engine's pool —
pages of which the state is one part, int32 slot indices, a null block as padding,
destination slots apart from the source slots, float16 and bfloat16 states — gives the
plain decode's results on the same states (bitwise; the half pools rounded once on write),
and a refused call leaves the pool as it was."""

import numpy as np
import pytest

from linseq import LinseqError, _lib, ops

rng = np.random.default_rng(3)
B, H, P, N, ROWS = 3, 2, 4, 5, 6
STEP = {"x": rng.standard_normal((B, 1, H, P), np.float32),
        "dt": np.full((B, 1, H), 0.3, np.float32), "A": -np.ones(H, np.float32),
        "B": rng.standard_normal((B, 1, 1, N), np.float32),
        "C": rng.standard_normal((B, 1, 1, N), np.float32)}


def _pages(states, extra=3):
    """Pool pages of `extra` more floats than a state each, the state first (a view)."""
    pages = np.full((states.shape[0], states[0].size + extra), -7.0, np.float32)
    pages[:, :states[0].size] = states.reshape(states.shape[0], -1)
    return pages, pages[:, :states[0].size].reshape(states.shape)


def test_pages_int32_null_block_and_destinations():
    states = rng.standard_normal((ROWS, H, P, N)).astype(np.float32)
    src = np.array([4, 0, 2], np.int32)          # request 1 names the null block 0: padding
    dst = np.array([5, 3, 1], np.int32)          # its dst is never read
    want_states = states.copy()
    (want_y,) = ops.decode("ssd", STEP, want_states, np.array([4, -1, 2]))
    pages, pool = _pages(states)
    before = pages.copy()
    (y,) = ops.decode_pool("ssd", STEP, pool, src, dst, pad_value=0)
    assert np.array_equal(y, want_y)
    assert np.array_equal(pool[5], want_states[4]) and np.array_equal(pool[1], want_states[2])
    untouched = [0, 2, 3, 4]                     # sources and the padding's dst stay
    assert np.array_equal(pages[untouched], before[untouched])
    assert np.all(pages[:, -3:] == -7.0)        # the rest of each page too


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_pools_round_once(dtype):
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dtype = ml_dtypes.bfloat16
    states = rng.standard_normal((ROWS, H, P, N)).astype(dtype)
    wide = states.astype(np.float32)
    (want_y,) = ops.decode("ssd", STEP, wide, np.array([1, 3, 5]))
    (y,) = ops.decode_pool("ssd", STEP, states, np.array([1, 3, 5]))
    assert np.array_equal(y, want_y)
    assert np.array_equal(states.view(np.uint16), wide.astype(dtype).view(np.uint16))


def test_refusals_leave_the_pool():
    states = rng.standard_normal((ROWS, H, P, N)).astype(np.float32)
    before = states.copy()
    with pytest.raises(LinseqError, match="both write pool row"):
        ops.decode_pool("ssd", STEP, states, np.array([1, 2, 3]), np.array([4, 4, 5]))
    with pytest.raises(LinseqError, match="src_rows"):
        ops.decode_pool("ssd", STEP, states, np.array([1, 2, ROWS], np.int32))
    with pytest.raises(ValueError, match="src_rows"):
        ops.decode_pool("ssd", STEP, states, np.array([1.0, 2.0, 3.0]))
    assert np.array_equal(states, before)


def test_pool_layouts_by_the_librarys_rule():
    """The pool's layout is judged by the library (linseq_state_pool_row_stride): rows of a
    size-1 dimension with any stride run; a row that is not C-contiguous, rows that overlap,
    and strides of part of an element are refused by name, the pool left as it was."""
    states = rng.standard_normal((ROWS, 1, H, P, N)).astype(np.float32)
    wide = np.lib.stride_tricks.as_strided(states,
                                           strides=(states.strides[0], 8, *states.strides[2:]))
    want = states[:, 0].copy()
    (want_y,) = ops.decode("ssd", STEP, want, np.array([1, 3, 5]))
    (y,) = ops.decode_pool("ssd", STEP, wide[:, 0], np.array([1, 3, 5]))
    assert np.array_equal(y, want_y) and np.array_equal(states[:, 0], want)
    base = rng.standard_normal((ROWS, H, N, P)).astype(np.float32)
    before = base.copy()
    with pytest.raises(ValueError, match=r"strides\[3\]"):
        ops.decode_pool("ssd", STEP, base.transpose(0, 1, 3, 2), np.array([1, 2, 3]))
    dense = rng.standard_normal((ROWS, H, P, N)).astype(np.float32)
    overlapping = np.lib.stride_tricks.as_strided(dense, shape=(ROWS - 1, H, P, N),
                                                  strides=(4 * P * N, *dense.strides[1:]))
    dense_before = dense.copy()
    with pytest.raises(ValueError, match=r"strides\[0\]"):
        ops.decode_pool("ssd", STEP, overlapping, np.array([1, 2, 3]))
    assert np.array_equal(dense, dense_before)
    raw = np.zeros(ROWS * (H * P * N * 4 + 2) + 2, np.uint8)
    odd = np.ndarray((ROWS, H, P, N), np.float32, raw, offset=2,
                     strides=(H * P * N * 4 + 2, P * N * 4, N * 4, 4))
    with pytest.raises(ValueError, match="whole elements"):
        ops.decode_pool("ssd", STEP, odd, np.array([1, 2, 3]))
    assert np.array_equal(base, before)


def _kda_inputs(B, T, H=2, K=8, V=6):
    return {"q": rng.standard_normal((B, T, H, K), np.float32),
            "k": rng.standard_normal((B, T, H, K), np.float32) * 0.3,
            "v": rng.standard_normal((B, T, H, V), np.float32),
            "beta": np.full((B, T, H), 0.5, np.float32),
            "g": -np.abs(rng.standard_normal((B, T, H, K))).astype(np.float32) * 0.2}


PREFILLS = {
    "ssd": lambda B, T: ({"x": rng.standard_normal((B, T, H, P), np.float32),
                          "dt": np.full((B, T, H), 0.2, np.float32),
                          "A": -np.ones(H, np.float32),
                          "B": rng.standard_normal((B, T, 1, N), np.float32),
                          "C": rng.standard_normal((B, T, 1, N), np.float32)}, {}),
    "kda": lambda B, T: (_kda_inputs(B, T), {"decay": "per_channel"}),
    "ema": lambda B, T: ({"x": rng.standard_normal((B, T, 5), np.float32),
                          "a": np.full(5, 0.8, np.float32)}, {}),
    "causal_conv1d": lambda B, T: ({"x": rng.standard_normal((B, T, 6), np.float32),
                                    "weight": rng.standard_normal((6, 4), np.float32)},
                                   {"activation": "silu"}),
}


@pytest.mark.parametrize("op", sorted(PREFILLS))
@pytest.mark.parametrize("varlen", [False, True])
def test_prefill_from_and_into_pool_rows(op, varlen):
    """vLLM's prefill: each sequence starts from its slot where has_initial_state, from zeros
    elsewhere, and its final state goes to its slot (here: another slot, int32 indices, pool
    rows inside larger pages): the plain forward with the gathered initial states."""
    if varlen and op == "ema":
        pytest.skip("ema takes no packed sequences")
    arrays, options = PREFILLS[op](1 if varlen else 3, 20)
    cu = np.array([0, 7, 7, 20]) if varlen else None   # the middle sequence is empty
    n = 3
    state_shape = ops.run(op, arrays, cu_seqlens=cu, **options)[-1].shape[1:]
    states = rng.standard_normal((8,) + state_shape).astype(np.float32)
    src = np.array([5, 2, 6], np.int32)
    dst = np.array([1, 3, 7], np.int32)
    has = np.array([True, False, True])
    h0 = np.where(has.reshape((n,) + (1,) * len(state_shape)), states[src], 0).astype(np.float32)
    state_input = _lib.op_desc(op)["decode"]["state"]   # h0, conv_state
    want = ops.run(op, dict(arrays, **{state_input: h0}), cu_seqlens=cu, **options)
    pages, pool = _pages(states)
    before = pages.copy()
    got = ops.forward_pool(op, arrays, pool, src, dst, has, cu_seqlens=cu, **options)
    assert all(np.array_equal(g, w) for g, w in zip(got, want[:-1]))
    assert np.array_equal(pool[dst], want[-1])
    others = [r for r in range(8) if r not in dst]
    assert np.array_equal(pages[others], before[others])


def test_prefill_refusals_leave_the_pool():
    arrays, _ = PREFILLS["ssd"](3, 10)
    states = rng.standard_normal((ROWS, H, P, N)).astype(np.float16)
    before = states.copy()
    with pytest.raises(LinseqError, match="both write pool row"):
        ops.forward_pool("ssd", arrays, states, np.array([0, 1, 2]), np.array([3, 3, 4]))
    with pytest.raises(ValueError, match="has_initial_state"):
        ops.forward_pool("ssd", arrays, states, np.array([0, 1, 2]), has_initial_state=[True])
    assert np.array_equal(states.view(np.uint16), before.view(np.uint16))


@pytest.mark.parametrize("op", sorted(PREFILLS))
def test_several_tokens_keep_each_state(op):
    """Speculative decoding: T tokens per request in one call equal T one-token calls (bit
    for bit), each token's state kept in its own row; padding untouched; and the last state
    is the forward's over the T tokens."""
    T = 4
    arrays, options = PREFILLS[op](3, T)
    state_input = _lib.op_desc(op)["decode"]["state"]
    state_shape = ops.run(op, arrays, **options)[-1].shape[1:]
    states = rng.standard_normal((20,) + state_shape).astype(np.float32)
    src = np.array([3, -1, 7], np.int32)                 # request 1 is padding
    dst = np.array([[10, 11, 12, 13], [0, 0, 0, 0], [14, 15, 16, 17]], np.int32)
    pages, pool = _pages(states)
    before = pages.copy()
    got = ops.decode_tokens_pool(op, arrays, pool, src, dst, **options)
    live = [0, 2]
    steps, rows = states.copy(), src.copy()
    for t in range(T):
        token = {n: (a[:, t:t + 1] if np.ndim(a) >= 2 and np.shape(a)[:2] == (3, T) else a)
                 for n, a in arrays.items()}
        outs = ops.decode_pool(op, token, steps, rows, np.where(rows < 0, -1, dst[:, t]),
                               **options)
        for g, o in zip(got, outs):
            assert np.array_equal(g[:, t:t + 1], o)
        assert np.array_equal(pool[dst[live, t]], steps[dst[live, t]])
        rows = np.where(rows < 0, -1, dst[:, t]).astype(np.int32)
    untouched = [r for r in range(20) if r not in dst[live].ravel()]
    assert np.array_equal(pages[untouched], before[untouched])
    h0 = np.stack([states[3], np.zeros(state_shape, np.float32), states[7]])
    final = ops.run(op, dict(arrays, **{state_input: h0}), **options)[-1]
    np.testing.assert_allclose(pool[dst[live, -1]], final[live], rtol=1e-5, atol=1e-5)


def test_several_tokens_refusal_at_a_later_token_writes_nothing():
    """KDA refuses a positive log decay: here in the third token only. Nothing is written,
    not even the states of the first two tokens."""
    arrays, options = PREFILLS["kda"](2, 3)
    arrays["g"][:, 2] = 0.5
    states = np.zeros((8, 2, 8, 6), np.float32)
    with pytest.raises(LinseqError, match="g"):
        ops.decode_tokens_pool("kda", arrays, states, np.array([0, 1]),
                               np.array([[2, 3, 4], [5, 6, 7]]), **options)
    assert not states.any()


@pytest.mark.parametrize("op", sorted(PREFILLS))
def test_prefill_keeps_block_states(op):
    """Prefix caching: the state at each block boundary inside a sequence goes to its
    block's row, bitwise the forward from the previous boundary's state over that block (the
    outputs too); the final state, here on a boundary, goes to its destination only; a
    boundary marked -1 keeps nothing; the empty sequence writes only its final state."""
    varlen = op != "ema"                                  # ema takes no packed sequences
    T = 19 if varlen else 7
    arrays, options = PREFILLS[op](1 if varlen else 3, T)
    cu = np.array([0, 7, 7, 19]) if varlen else None       # 7 tokens, none, 12 tokens
    spans = [(0, 7), (7, 0), (7, 12)] if varlen else [(0, 7), (7, 7), (14, 7)]
    state_input = _lib.op_desc(op)["decode"]["state"]
    state_shape = ops.run(op, arrays, cu_seqlens=cu, **options)[-1].shape[1:]
    states = rng.standard_normal((16,) + state_shape).astype(np.float32)
    src, dst = np.array([5, 2, 6], np.int32), np.array([1, 3, 7], np.int32)
    has = np.array([True, True, False])
    computed = np.array([5, 3, 0], np.int32)
    blocks = np.array([[-1, 10, -1, -1], [9, 14, -1, -1], [11, -1, 15, -1]], np.int32)
    pages, pool = _pages(states)
    before = pages.copy()
    got = ops.forward_pool_blocks(op, arrays, pool, blocks, 4, src, dst, has, computed,
                                  cu_seqlens=cu, **options)

    def tokens(a, begin, end):
        """Tokens [begin, end) of the packed token axis, as one sequence; other arrays as given."""
        if np.ndim(a) < 2 or np.shape(a)[1] != T:
            return a
        return np.reshape(a, (-1,) + np.shape(a)[2:])[begin:end][None]

    want_rows, want_out = {}, [[] for _ in got]
    for s, (begin, length) in enumerate(spans):
        h = states[src[s]] if has[s] else np.zeros(state_shape, np.float32)
        cuts = [p - computed[s] for p in range(4, computed[s] + length, 4) if p > computed[s]]
        for a, b in zip([0] + cuts, cuts + [length]):
            if b > a:
                piece = {n: tokens(x, begin + a, begin + b) for n, x in arrays.items()}
                outs = ops.run(op, dict(piece, **{state_input: h[None]}), **options)
                h = outs[-1][0]
                for k, o in enumerate(outs[:-1]):
                    want_out[k].append(o.reshape((-1,) + o.shape[2:]))
            if b < length and blocks[s, (computed[s] + b) // 4 - 1] >= 0:
                want_rows[blocks[s, (computed[s] + b) // 4 - 1]] = h
        want_rows[dst[s]] = h
    assert sorted(want_rows) == sorted([1, 3, 7, 10, 11] + ([9, 14] if not varlen else []))
    for r, h in want_rows.items():
        assert np.array_equal(pool[r], h), f"row {r}"
    others = [r for r in range(16) if r not in want_rows]
    assert np.array_equal(pages[others], before[others])
    for g, w in zip(got, want_out):
        assert np.array_equal(g.reshape((-1,) + g.shape[2:]), np.concatenate(w))


def test_block_states_refusals_leave_the_pool():
    arrays, _ = PREFILLS["ssd"](3, 10)
    states = rng.standard_normal((ROWS, H, P, N)).astype(np.float32)
    before = states.copy()
    src = np.array([0, 1, 2], np.int32)
    blocks = np.array([[3, 4], [5, -1], [-1, -1]], np.int32)
    with pytest.raises(LinseqError, match="block 0 both go to pool row 3"):
        ops.forward_pool_blocks("ssd", arrays, states, blocks, 4, src,
                                np.array([3, 4, 5], np.int32))
    with pytest.raises(LinseqError, match="block_size = 0"):
        ops.forward_pool_blocks("ssd", arrays, states, blocks, 0, src)
    with pytest.raises(LinseqError, match="max_blocks"):
        ops.forward_pool_blocks("ssd", arrays, states, blocks[:, :1], 4, src)
    with pytest.raises(ValueError, match="block_rows"):
        ops.forward_pool_blocks("ssd", arrays, states, blocks.astype(np.int64), 4, src)
    assert np.array_equal(states, before)


@pytest.mark.parametrize("op", ["causal_conv1d", "ema"])
def test_block_states_as_vllm_schedules_them(op):
    """A prompt of 19 tokens prefilled in two scheduler steps (10 tokens, then 9), mapped as
    include/linseq.h says from vLLM's prefix-caching metadata: a state table [1, max_blocks]
    of cache blocks, block_size 4, num_computed_tokens, the initial block and the last
    scheduled block's index. Each cache block then holds the state after its 4 tokens, and
    the last one the final state: for these ops (each token's step exact in any split) the
    states of one forward over the prefix, bit for bit."""
    bs, T, table = 4, 19, np.array([[7, 3, 9, 2, 11]], np.int32)
    arrays, options = PREFILLS[op](1, T)
    state_shape = ops.run(op, arrays, **options)[-1].shape[1:]
    pool = np.zeros((12,) + state_shape, np.float32)
    for begin, end in ((0, 10), (10, T)):
        computed = np.array([begin], np.int32)
        last = (end - 1) // bs                            # block_idx_last_scheduled_token
        initial = max(begin - 1, 0) // bs                 # the block of the last computed token
        piece = {n: (a[:, begin:end] if np.ndim(a) >= 2 and np.shape(a)[1] == T else a)
                 for n, a in arrays.items()}
        ops.forward_pool_blocks(op, piece, pool, table, bs, table[:, initial],
                                table[:, last], computed > 0, computed, **options)
    for j in range(5):                                    # block j: tokens [0, min(4 (j+1), T))
        prefix = {n: (a[:, :min(bs * (j + 1), T)] if np.ndim(a) >= 2 and np.shape(a)[1] == T
                      else a) for n, a in arrays.items()}
        want = ops.run(op, prefix, **options)[-1][0]
        assert np.array_equal(pool[table[0, j]], want), f"block {j}"
