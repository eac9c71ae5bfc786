"""The Mamba1 selective scan (SSM1) on NumPy arrays: the problem (Ssm1Inputs, B and C in
their forms), forward, training forward, backward and decode."""

import ctypes

import numpy as np

from .. import _lib
from .._arrays import as_f32_ndim, as_f32_strided, as_row_indices, check_pool, ptr
from ._common import (activation_code, check_inputs, forward_train, grads, make_exec,
                      optional, outputs, sequences, strides, upstream)


def _proj_layout(value, name, B, T, D, channel_first):
    """B_proj or C_proj in any of its forms, as (array, groups, strides(G) -> (batch, token,
    group, state) element strides, form). Forms: "shared" [B,T,N] ([B,N,T] channel first),
    "grouped" [B,T,G,N] ([B,G,N,T]), "constant" [D,N] (one B for every token: G = D groups
    read with zero batch and token strides)."""
    forms = "[B,N,T] or [B,G,N,T]" if channel_first else "[B,T,N] or [B,T,G,N]"
    arr, st = as_f32_strided(value, name, (2, 3, 4), f"{name} of shape [D,N] (constant), {forms}")
    if arr.ndim == 2:
        if arr.shape[0] != D:
            raise ValueError(f"{name}: a constant {name} has shape [D,N] with D = {D}, got "
                             f"{list(arr.shape)}")
        return arr, D, arr.shape[1], lambda G: (0, 0, st[0], st[1]), "constant"
    if arr.ndim == 3:
        b, t, n = (0, 2, 1) if channel_first else (0, 1, 2)
        shape = (arr.shape[b], arr.shape[t], arr.shape[n])
        if shape[:2] != (B, T):
            raise ValueError(f"{name}: expected shape "
                             f"{'[B,N,T]' if channel_first else '[B,T,N]'} with B = {B}, T = {T}, "
                             f"got {list(arr.shape)}")
        return arr, 1, shape[2], lambda G: (st[b], st[t], 0, st[n]), "shared"
    b, t, g, n = (0, 3, 1, 2) if channel_first else (0, 1, 2, 3)
    if (arr.shape[b], arr.shape[t]) != (B, T):
        raise ValueError(f"{name}: expected shape {'[B,G,N,T]' if channel_first else '[B,T,G,N]'}"
                         f" with B = {B}, T = {T}, got {list(arr.shape)}")
    if arr.shape[g] == 1:  # one group, read by all the problem's groups: a zero group stride
        return arr, 1, arr.shape[n], lambda G: (st[b], st[t], 0, st[n]), "shared"
    return arr, arr.shape[g], arr.shape[n], lambda G: (st[b], st[t], st[g], st[n]), "grouped"


def _proj_groups(name_b, gb, name_c, gc, D):
    """The problem's group count for B and C given as they were: equal, or one of them with a
    single group (read by every group through a zero group stride)."""
    if gb == gc:
        G = gb
    elif gb == 1 or gc == 1:
        G = max(gb, gc)
    else:
        raise ValueError(f"{name_b}, {name_c}: {gb} and {gc} groups; linseq takes B and C with "
                         "the same number of groups, or one of them with a single group (or "
                         "constant [D,N])")
    if D % G:
        raise ValueError(f"{name_b}: the groups G = {G} must divide D = {D}")
    return G


class Ssm1Inputs:
    """x, dt [B,T,D]; A [D,N]; B_proj, C_proj [B,T,N], [B,T,G,N] or constant [D,N]; D_skip,
    dt_bias [D]; gate [B,T,D]; h0 [N_seq,D,N]. `dt` is the step after softplus unless
    dt_softplus.

    channel_first=True: x, dt and gate are [B,D,T] and B_proj, C_proj [B,N,T] or [B,G,N,T]
    (mamba-ssm's layout), and y and the per-token gradients come back [B,D,T] / [B,G,N,T].

    The per-token inputs (x, dt, gate, B_proj, C_proj) are read where they lie: a float32 view
    with any non-negative strides (a transposed tensor, one half of xz, a broadcast) reaches
    the kernels as the caller's memory with its strides, without a copy; other dtypes,
    negative strides and one value broadcast over every dimension (whose all-zero strides
    would read as dense: read_as_dense) are converted once. The arrays the kernels read are this object's x, dt,
    gate, B_proj and C_proj (their pointers are problem.x, ...)."""

    def __init__(self, x, dt, A, B_proj, C_proj, D_skip=None, *, gate=None, h0=None,
                 cu_seqlens=None, dt_softplus=False, dt_bias=None, activation=None,
                 channel_first=False):
        cf = bool(channel_first)
        tok_what = "[B,D,T]" if cf else "[B,T,D]"
        self.x, sx = as_f32_strided(x, "hidden_states", (3,), f"hidden_states of shape {tok_what}")
        B, T, D = (self.x.shape[0], self.x.shape[2], self.x.shape[1]) if cf else self.x.shape
        tok_shape = (B, D, T) if cf else (B, T, D)

        def per_token(value, name):
            if value is None:
                return None, (0, 0, 0, 0)
            arr, st = as_f32_strided(value, name, (3,), f"{name} of shape {tok_what}")
            if arr.shape != tok_shape:
                raise ValueError(f"{name}: expected shape {tok_what} = {list(tok_shape)} like "
                                 f"hidden_states, got {list(arr.shape)}")
            # (batch, token, channel, 0) in elements
            return arr, ((st[0], st[2], st[1], 0) if cf else (st[0], st[1], st[2], 0))

        xs = (sx[0], sx[2], sx[1], 0) if cf else (sx[0], sx[1], sx[2], 0)
        self.dt, dts = per_token(dt, "dt")
        self.gate, gs = per_token(gate, "gate")
        A = as_f32_ndim(A, "A", (2,), "A of shape [D,N]")
        if A.shape[0] != D:
            raise ValueError(f"A: expected shape [D,N] with D = {D}, got {list(A.shape)}")
        self.A = A
        N = A.shape[1]
        self.B_proj, gb, nb, b_strides, self.B_form = _proj_layout(B_proj, "B", B, T, D, cf)
        self.C_proj, gc, nc, c_strides, self.C_form = _proj_layout(C_proj, "C", B, T, D, cf)
        for name, n in (("B", nb), ("C", nc)):
            if n != N:
                raise ValueError(f"{name}: expected N = {N} states (A is [D,N]), got {n}")
        G = _proj_groups("B", gb, "C", gc, D)
        self.D_skip = optional(D_skip, "D", (D,), "[D]")
        self.cu_seqlens, n_state = sequences(cu_seqlens, B, T)
        self.state_shape = (n_state, D, N)
        self.h0 = optional(h0, "initial_state", self.state_shape, "[B,D,N]")
        if dt_bias is not None and not dt_softplus:
            raise ValueError("dt_bias: given without dt_softplus=True")
        self.dt_bias = optional(dt_bias, "dt_bias", (D,), "[D]")
        self.channel_first = cf
        # G = 0: one group, so that y's and dB's shapes stay [B,T,N] as the table gives them
        self.B, self.T, self.D, self.N, self.G = B, T, D, N, (G if G > 1 else 0)
        self.problem = _lib.Ssm1Problem(
            B=B, T=T, D=D, N=N, G=self.G, cu_seqlens=ptr(self.cu_seqlens),
            n_seqs=n_state if self.cu_seqlens is not None else 0,
            x=ptr(self.x), dt=ptr(self.dt), A=ptr(self.A), B_proj=ptr(self.B_proj),
            C_proj=ptr(self.C_proj), D_skip=ptr(self.D_skip), gate=ptr(self.gate),
            h0=ptr(self.h0), dt_softplus=bool(dt_softplus), dt_bias=ptr(self.dt_bias),
            gate_activation=activation_code(activation, _lib.ACT_SILU), channel_first=cf,
            x_strides=strides(xs), dt_strides=strides(dts), gate_strides=strides(gs),
            B_strides=strides(b_strides(G)), C_strides=strides(c_strides(G)))
        check_inputs("ssm1", self, strided=("x", "dt", "gate", "B", "C"))

    def proj_grad(self, grad, form, shape):
        """dB or dC as the library returns it ([B,T,G,N] or [B,G,N,T] channel first; without
        G when there is one group) summed to the form and shape B or C was given in."""
        cf = self.channel_first
        if grad.ndim == 3:  # one group: [B,T,N] / [B,N,T] -> [B,T,1,N] / [B,1,N,T]
            grad = grad[:, None] if cf else grad[:, :, None]
        if form == "constant":  # [D,N]: the share of every token of every sequence
            grad = grad.sum(axis=(0, 3) if cf else (0, 1), dtype=np.float32)
        elif form == "shared":  # one group, read by all the problem's groups
            grad = grad.sum(axis=1 if cf else 2, dtype=np.float32)
        return np.ascontiguousarray(grad.reshape(shape))


def ssm1_forward(inputs, *, threads=0, final_state=True):
    """(y [B,T,D] ([B,D,T] channel first), hT [N_seq,D,N] or None)."""
    ex = make_exec(threads=threads)
    (y, hT), out = outputs("ssm1", inputs, final_state)
    _lib.check(_lib.lib.linseq_ssm1_forward(ctypes.byref(inputs.problem), ctypes.byref(ex), *out))
    return y, hT


def ssm1_forward_train(inputs, *, threads=0, final_state=True):
    """(y, hT or None, saved): the forward plus the states ssm1_backward(saved=...) starts its
    segments from, so that it need not run the recurrence again."""
    (y, hT), saved = forward_train("ssm1", inputs, make_exec(threads=threads), final_state)
    return y, hT, saved


def ssm1_backward(inputs, d_y, d_hT=None, *, threads=0, wanted=None, saved=None):
    """dict of dx, ddt, dA, dB, dC, dD, dgate, dh0, ddt_bias (those that exist); d_y and the
    per-token gradients in the problem's layout, dB and dC in the shapes B and C were given.
    `saved` is the block ssm1_forward_train returned for the same inputs (the same
    gradients, bit for bit, without recomputing the checkpoints)."""
    ex = make_exec(threads=threads)
    d_y, d_hT = upstream("ssm1", inputs, (d_y, d_hT))
    out, grads_struct = grads("ssm1", inputs, wanted)
    if saved is None:
        status = _lib.lib.linseq_ssm1_backward(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                               ptr(d_y), ptr(d_hT), ctypes.byref(grads_struct))
    else:
        status = _lib.lib.linseq_ssm1_backward_saved(
            ctypes.byref(inputs.problem), ctypes.byref(ex), ptr(saved), saved.nbytes,
            ptr(d_y), ptr(d_hT), ctypes.byref(grads_struct))
    _lib.check(status)
    for key, form, arr in (("dB", inputs.B_form, inputs.B_proj),
                           ("dC", inputs.C_form, inputs.C_proj)):
        if key in out:
            out[key] = inputs.proj_grad(out[key], form, arr.shape)
    return out


def ssm1_decode(inputs, state, state_rows=None, *, threads=0):
    """One token for B requests (inputs with T = 1, no h0 or cu_seqlens): `state` is the pool
    [R,D,N], a C-contiguous float32 array updated in place; state_rows (int [B], optional) maps
    request b to its pool row (None: row b), a negative row is a padding request (its y row
    is 0, no state touched). Returns y [B,1,D] ([B,D,1] channel first)."""
    if inputs.T != 1:
        raise ValueError(f"hidden_states: decode takes one token per request, got T = {inputs.T}")
    if inputs.h0 is not None or inputs.cu_seqlens is not None:
        raise ValueError("initial_state, cu_seqlens: decode reads the state pool instead")
    check_pool(state, "state")
    if not (isinstance(state, np.ndarray) and state.dtype == np.float32
            and state.flags.c_contiguous and state.flags.writeable):
        raise TypeError("state: in-place decode needs a writable C-contiguous float32 array")
    if state.ndim != 3 or state.shape[1:] != inputs.state_shape[1:]:
        raise ValueError(f"state: expected a pool of shape [R,{inputs.D},{inputs.N}], got "
                         f"{list(state.shape)}")
    rows = None if state_rows is None else as_row_indices(state_rows, inputs.B, "state_rows")
    ex = make_exec(threads=threads)
    (y, _), _ = outputs("ssm1", inputs, final_state=False)
    _lib.check(_lib.lib.linseq_ssm1_decode(ctypes.byref(inputs.problem), ctypes.byref(ex),
                                           ptr(state), state.shape[0], ptr(rows), ptr(y)))
    return y

