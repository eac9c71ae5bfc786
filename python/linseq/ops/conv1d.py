"""Causal depthwise conv1d on NumPy arrays: the problem (Conv1dInputs), forward, backward
and decode."""

import ctypes

import numpy as np

from .. import _lib
from .._arrays import (as_bf16_ndim, as_f32_ndim, as_f32_strided, as_row_indices, bf16_result,
                       check_pool, is_bf16, ptr)
from ._common import (activation_code, check_inputs, grads, make_exec, optional, outputs,
                      pointer, sequences, strides, upstream)


class Conv1dInputs:
    """x [B,T,D] ([B,D,T] with channel_first, causal-conv1d's layout); weight [D,W] (or
    [D,1,W] as nn.Conv1d stores it); bias [D]; conv_state [N_seq,D,W-1], oldest input first,
    or with state_tap_major [N_seq,W-1,D] (vLLM's conv-state layout): every conv state of the
    problem (conv_state, conv_state_out, their gradients, a decode pool's rows) in that order.
    With weight_tap_major the weight (and dweight) is [W,D], packed once by the caller
    (weight.T made contiguous), which a decode step reads in place.
    bf16=True with a bfloat16 x (is_bf16) keeps x in bfloat16 storage, dense [B,T,D] (a
    C-contiguous copy if it is not), and conv1d_forward returns y in bfloat16 (self.bf16
    says what was taken; the forward only).

    x is read where it lies: a float32 view with non-negative strides (a transposed tensor,
    a slice of xBC) reaches the kernels as the caller's memory (problem.x is its pointer),
    but one value broadcast over every dimension, which is copied once (read_as_dense); y,
    d_y and dx are dense in the problem's layout."""

    def __init__(self, x, weight, bias=None, *, conv_state=None, cu_seqlens=None,
                 activation=None, channel_first=False, state_tap_major=False,
                 weight_tap_major=False, bf16=False):
        cf = bool(channel_first)
        what = "[B,D,T]" if cf else "[B,T,D]"
        self.bf16 = bool(bf16) and is_bf16(x)
        if self.bf16 and cf:
            raise ValueError("x: bfloat16 storage takes the token-major layout [B,T,D]; pass "
                             "channel_first=False, or bf16=False")
        if self.bf16:
            self.x = as_bf16_ndim(x, "x", (3,), "x of shape [B,T,D]")
            sx = (0, 0, 0)  # dense
        else:
            self.x, sx = as_f32_strided(x, "x", (3,), f"x of shape {what}")
        B, T, D = (self.x.shape[0], self.x.shape[2], self.x.shape[1]) if cf else self.x.shape
        x_strides = (sx[0], sx[2], sx[1], 0) if cf else (sx[0], sx[1], sx[2], 0)
        packed = bool(weight_tap_major)
        if packed:
            w = as_f32_ndim(weight, "weight", (2,), "weight of shape [W,D] (weight_tap_major)")
            if w.shape[1] != D:
                raise ValueError(f"weight: expected shape [W,D] with D = {D} "
                                 f"(weight_tap_major), got {list(w.shape)}")
        else:
            w = as_f32_ndim(weight, "weight", (2, 3), "weight of shape [D,W] or [D,1,W]")
        if w.ndim == 3:
            if w.shape[1] != 1:
                raise ValueError(f"weight: expected [D,W] or a depthwise [D,1,W], got "
                                 f"{list(w.shape)}")
            w = w.reshape(w.shape[0], w.shape[2])
        if not packed and w.shape[0] != D:
            raise ValueError(f"weight: expected shape [D,W] with D = {D}, got {list(w.shape)}")
        self.weight_shape = np.shape(weight)
        self.weight = w
        W = w.shape[0] if packed else w.shape[1]
        self.bias = optional(bias, "bias", (D,), "[D]")
        self.cu_seqlens, n_state = sequences(cu_seqlens, B, T)
        tap_major = bool(state_tap_major)
        self.state_shape = (n_state, W - 1, D) if tap_major else (n_state, D, W - 1)
        self.conv_state = optional(conv_state, "conv_state", self.state_shape,
                                    "[B,W-1,D] (state_tap_major), oldest input first"
                                    if tap_major else "[B,D,W-1], oldest input first")
        self.state_tap_major = tap_major
        self.channel_first = cf
        self.B, self.T, self.D, self.W = B, T, D, W
        self.problem = _lib.Conv1dProblem(
            B=B, T=T, D=D, W=W, cu_seqlens=ptr(self.cu_seqlens),
            n_seqs=n_state if self.cu_seqlens is not None else 0,
            x=ptr(self.x), weight=ptr(self.weight), bias=ptr(self.bias),
            conv_state=ptr(self.conv_state),
            activation=activation_code(activation, _lib.ACT_IDENTITY), channel_first=cf,
            x_strides=strides(x_strides), state_tap_major=tap_major, weight_tap_major=packed)
        check_inputs("causal_conv1d", self, strided=("x",))


def conv1d_forward(inputs, *, threads=0, final_state=True):
    """(y [B,T,D] ([B,D,T] channel first), conv_state_out [N_seq,D,W-1] or None). y is
    bfloat16 when x is (Conv1dInputs.bf16; see bf16_result), float32 otherwise."""
    ex = make_exec(threads=threads, bf16=inputs.bf16)
    (y, state), out = outputs("causal_conv1d", inputs, final_state, first_bf16=inputs.bf16)
    _lib.check(_lib.lib.linseq_conv1d_forward(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                              *out))
    return (bf16_result(y) if inputs.bf16 else y), state


def _float32_only(inputs, what):
    if inputs.bf16:
        raise ValueError(f"{what}: takes a float32 x; build Conv1dInputs with bf16=False")


def conv1d_backward(inputs, d_y, d_state=None, *, threads=0, wanted=None):
    """dict of dx (in the problem's layout), dweight (in the weight's given shape), dbias,
    dconv_state."""
    _float32_only(inputs, "conv1d_backward")
    ex = make_exec(threads=threads)
    d_y, d_state = upstream("causal_conv1d", inputs, (d_y, d_state))
    out, grads_struct = grads("causal_conv1d", inputs, wanted)
    _lib.check(_lib.lib.linseq_conv1d_backward(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                               ptr(d_y), pointer(d_state),
                                               ctypes.byref(grads_struct)))
    if "dweight" in out:
        out["dweight"] = out["dweight"].reshape(inputs.weight_shape)
    return out


def conv1d_decode(inputs, state, state_rows=None, cache_seqlens=None, *, threads=0):
    """causal_conv1d_update over a pool: inputs hold the T >= 1 new tokens of B requests
    (no conv_state, no cu_seqlens); `state` is the pool [R,D,state_len] ([R,state_len,D] with
    state_tap_major; state_len >= W-1), a C-contiguous float32 array updated in place. state_rows (int [B], optional): request ->
    pool row (None: row b; negative: a padding request, y = 0, no state touched).
    cache_seqlens (int [B], optional, each >= 0): the rows are circular buffers and request b's
    new inputs go to positions (cache_seqlens[b] + i) % state_len (see linseq.h); without it
    each row is a shift register. Returns y in the problem's layout ([B,T,D] or [B,D,T])."""
    _float32_only(inputs, "conv1d_decode")
    if inputs.conv_state is not None or inputs.cu_seqlens is not None:
        raise ValueError("conv_state, cu_seqlens: decode reads the state pool instead")
    check_pool(state, "state")
    if not (isinstance(state, np.ndarray) and state.dtype == np.float32
            and state.flags.c_contiguous and state.flags.writeable):
        raise TypeError("state: in-place decode needs a writable C-contiguous float32 array")
    channel_axis, len_axis = (2, 1) if inputs.state_tap_major else (1, 2)
    if state.ndim != 3 or state.shape[channel_axis] != inputs.D:
        want = (f"[R,state_len,{inputs.D}]" if inputs.state_tap_major
                else f"[R,{inputs.D},state_len]")
        raise ValueError(f"state: expected a pool of shape {want}, got {list(state.shape)}")
    rows = None if state_rows is None else as_row_indices(state_rows, inputs.B, "state_rows")
    cache = (None if cache_seqlens is None
             else as_row_indices(cache_seqlens, inputs.B, "cache_seqlens"))
    ex = make_exec(threads=threads)
    (y, _), _ = outputs("causal_conv1d", inputs, final_state=False)
    _lib.check(_lib.lib.linseq_conv1d_decode(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                             ptr(state), state.shape[0], state.shape[len_axis],
                                             ptr(rows), ptr(cache), ptr(y)))
    return y
