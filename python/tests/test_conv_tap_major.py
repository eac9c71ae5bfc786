"""The conv's serving layouts from NumPy: states [N,W-1,D] (state_tap_major, vLLM's conv
state layout) and a [W,D] weight (weight_tap_major, packed once), through Conv1dInputs and the
table's pool calls. Each against a float64 reference of the conv written here, and against the
default layouts bitwise (the same values in another order); over bfloat16 pools of strided
rows with int32 slots, packed sequences (vLLM's query_start_loc) and padding; a refused call
leaves every row as it was."""

import numpy as np
import pytest

from linseq import LinseqError, ops

rng = np.random.default_rng(11)
D, W = 40, 4


def conv_reference(x, weight, state):
    """silu(causal conv) of x [T,D] after the W-1 inputs state [W-1,D] (tap-major), and the
    last W-1 inputs after it, in float64. weight [D,W]."""
    xs = np.concatenate([state.astype(np.float64), x.astype(np.float64)])  # [W-1+T, D]
    T = x.shape[0]
    pre = sum(weight[:, j].astype(np.float64) * xs[j:j + T] for j in range(W))
    return pre / (1.0 + np.exp(-pre)), xs[-(W - 1):]


def rel_err(got, want):
    return np.abs(got - want).max() / np.abs(want).max()


def _bf16():
    return pytest.importorskip("ml_dtypes").bfloat16


def _pages(states, extra=5):
    """Pool rows inside pages of `extra` more elements each (a view), the gaps marked."""
    n = states.shape[0]
    pages = np.full((n, states[0].size + extra), -3.0, states.dtype)
    pages[:, :states[0].size] = states.reshape(n, -1)
    return pages, pages[:, :states[0].size].reshape(states.shape)


def _bf16_pool_case(x_shape, n_rows):
    """x of x_shape, a [W,D] weight (tap-major) and n_rows bfloat16 tap-major states inside
    pages, drawn in that order: (bf16, x, weight_t, states, pages, pool)."""
    bf16 = _bf16()
    x = rng.standard_normal(x_shape).astype(np.float32)
    weight_t = (rng.standard_normal((W, D)) * 0.5).astype(np.float32)
    states = rng.standard_normal((n_rows, W - 1, D)).astype(bf16)
    pages, pool = _pages(states)
    return bf16, x, weight_t, states, pages, pool


def test_forward_and_decode_layouts_give_the_default_bits():
    x = rng.standard_normal((3, 9, D)).astype(np.float32)
    weight = rng.standard_normal((D, W)).astype(np.float32) * 0.5
    state = rng.standard_normal((3, D, W - 1)).astype(np.float32)
    plain = ops.Conv1dInputs(x, weight, conv_state=state, activation="silu")
    y, s = ops.conv1d_forward(plain)
    tm = ops.Conv1dInputs(x, np.ascontiguousarray(weight.T),
                          conv_state=np.ascontiguousarray(state.transpose(0, 2, 1)),
                          activation="silu", state_tap_major=True, weight_tap_major=True)
    y_tm, s_tm = ops.conv1d_forward(tm)
    assert np.array_equal(y, y_tm) and np.array_equal(s, s_tm.transpose(0, 2, 1))

    step = rng.standard_normal((3, 1, D)).astype(np.float32)
    pool = rng.standard_normal((5, D, W - 1)).astype(np.float32)
    pool_tm = np.ascontiguousarray(pool.transpose(0, 2, 1))
    rows = np.array([4, -1, 0])
    y = ops.conv1d_decode(ops.Conv1dInputs(step, weight, activation="silu"), pool, rows)
    y_tm = ops.conv1d_decode(ops.Conv1dInputs(step, np.ascontiguousarray(weight.T),
                                              activation="silu", state_tap_major=True,
                                              weight_tap_major=True), pool_tm, rows)
    assert np.array_equal(y, y_tm) and np.array_equal(pool, pool_tm.transpose(0, 2, 1))
    with pytest.raises(ValueError, match=r"\[R,state_len,40\]"):
        ops.conv1d_decode(ops.Conv1dInputs(step, weight, state_tap_major=True), pool, rows)
    with pytest.raises(ValueError, match=r"\[W,D\]"):
        ops.Conv1dInputs(step, weight, weight_tap_major=True)


def test_varlen_prefill_over_a_bf16_tap_major_pool():
    """vLLM's prefill: packed sequences (one empty), each from its slot where it has an
    initial state, its last W-1 inputs into another slot; bf16 rows inside pages."""
    cu = np.array([0, 7, 7, 30])
    bf16, x, weight_t, states, pages, pool = _bf16_pool_case((1, 30, D), 8)
    before = pages.copy()
    src, dst = np.array([5, 2, 6], np.int32), np.array([1, 3, 7], np.int32)
    has = np.array([True, False, False])
    (y,) = ops.forward_pool("causal_conv1d", {"x": x, "weight": weight_t}, pool, src, dst, has,
                            cu_seqlens=cu, activation="silu", state_tap_major=True,
                            weight_tap_major=True)
    for s in range(3):
        lo, hi = cu[s], cu[s + 1]
        start = states[src[s]].astype(np.float64) if has[s] else np.zeros((W - 1, D))
        y_ref, s_ref = conv_reference(x[0, lo:hi], weight_t.T, start)
        if hi > lo:
            assert rel_err(y[0, lo:hi], y_ref) < 1e-6
        # the state is inputs copied: exactly the bf16 rounding of those values
        assert np.array_equal(pool[dst[s]].view(np.uint16),
                              s_ref.astype(np.float32).astype(bf16).view(np.uint16))
    others = [r for r in range(8) if r not in dst]
    assert np.array_equal(pages[others].view(np.uint16), before[others].view(np.uint16))
    assert np.all(pages[:, -5:].astype(np.float32) == -3.0)


def test_decode_over_a_bf16_tap_major_pool():
    """vLLM's update: int32 slots, the null block 0 as padding, the new window written to
    other slots; y against the float64 reference from the bf16 window."""
    bf16, step, weight_t, states, _, pool = _bf16_pool_case((3, 1, D), 6)
    before = states.copy()
    src, dst = np.array([4, 0, 2], np.int32), np.array([5, 3, 1], np.int32)
    (y,) = ops.decode_pool("causal_conv1d", {"x": step, "weight": weight_t}, pool, src, dst,
                           pad_value=0, activation="silu", state_tap_major=True,
                           weight_tap_major=True)
    assert np.all(y[1] == 0.0)
    for b in (0, 2):
        y_ref, s_ref = conv_reference(step[b], weight_t.T, before[src[b]])
        assert rel_err(y[b], y_ref) < 1e-6
        assert np.array_equal(pool[dst[b]].view(np.uint16),
                              s_ref.astype(np.float32).astype(bf16).view(np.uint16))
    for r in (0, 2, 3, 4):
        assert np.array_equal(pool[r].view(np.uint16), before[r].view(np.uint16))


def test_refusals_leave_the_tap_major_pool():
    bf16 = _bf16()
    step = rng.standard_normal((3, 1, D)).astype(np.float32)
    weight_t = rng.standard_normal((W, D)).astype(np.float32)
    states = rng.standard_normal((6, W - 1, D)).astype(bf16)
    before = states.copy()
    args = ("causal_conv1d", {"x": step, "weight": weight_t}, states)
    opts = dict(activation="silu", state_tap_major=True, weight_tap_major=True)
    with pytest.raises(LinseqError, match="both write pool row"):
        ops.decode_pool(*args, np.array([1, 2, 3]), np.array([4, 4, 5]), **opts)
    with pytest.raises(LinseqError, match="src_rows"):
        ops.decode_pool(*args, np.array([1, 2, 6], np.int32), **opts)
    with pytest.raises(ValueError, match="weight"):   # a [D,W] weight under weight_tap_major
        ops.decode_pool("causal_conv1d", {"x": step, "weight": weight_t.T.copy()}, states,
                        np.array([1, 2, 3]), **opts)
    assert np.array_equal(states.view(np.uint16), before.view(np.uint16))


def test_bf16_forward_is_the_float32_call_rounded():
    """A bfloat16 x (a serving engine's activations): y in bfloat16, the float32 call on the
    widened x rounded once; the state the same floats; tap-major layouts too."""
    bf16 = _bf16()
    x = rng.standard_normal((2, 33, D)).astype(bf16)
    weight_t = (rng.standard_normal((W, D)) * 0.5).astype(np.float32)
    state = rng.standard_normal((2, W - 1, D)).astype(np.float32)
    kw = dict(conv_state=state, activation="silu", state_tap_major=True, weight_tap_major=True)
    y, s = ops.conv1d_forward(ops.Conv1dInputs(x, weight_t, bf16=True, **kw))
    y32, s32 = ops.conv1d_forward(ops.Conv1dInputs(x.astype(np.float32), weight_t, **kw))
    assert y.dtype == bf16
    assert np.array_equal(y.view(np.uint16), y32.astype(bf16).view(np.uint16))
    assert np.array_equal(s, s32)
    y_ref, _ = conv_reference(x[0].astype(np.float32), weight_t.T, state[0])
    assert rel_err(y[0].astype(np.float32), y_ref) < 2 ** -8
    with pytest.raises(ValueError, match="float32 x"):
        ops.conv1d_backward(ops.Conv1dInputs(x, weight_t, bf16=True, **kw), y32)
