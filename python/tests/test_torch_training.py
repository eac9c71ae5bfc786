"""PyTorch training steps through linseq: loss.backward() gives the gradients float64
autograd gives on the plain token-by-token definition, for every KDA option (gate in the
kernel, grouped value heads, packed sequences, beta logits, V-first state) and for the
Mamba1 scan with in-kernel and framework-side gate activations."""

import numpy as np
import pytest

from conftest import require

torch = require("torch")
import linseq  # noqa: E402
import naive  # noqa: E402


def _close(name, got, want, tol):
    got = got.detach().double()
    want = want.detach().double()
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    assert err <= tol, f"{name}: max rel err {err:.3g} > {tol}"


def _params(*shapes, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(scale * torch.randn(*s, generator=gen)) for s in shapes]


@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("varlen", [False, True])
def test_chunk_kda_training_step(mode, per_channel, varlen):
    B, T, H, G, K, V = (1, 45, 2, 2, 24, 20) if varlen else (2, 37, 2, 2, 24, 20)
    HV = H * G
    cu = torch.tensor([0, 7, 30, 45]) if varlen else None
    N = 3 if varlen else B
    q, k = _params((B, T, H, K), (B, T, H, K), seed=1)
    v, = _params((B, T, HV, V), seed=2)
    g_raw, = _params((B, T, HV, K) if per_channel else (B, T, HV), seed=3)
    beta_logit, = _params((B, T, HV), seed=4)
    h0, = _params((N, HV, V, K), scale=0.3, seed=5)
    A_log, = _params((HV,), scale=0.5, seed=6)
    dt_bias, = _params((HV * K,) if per_channel else (HV,), scale=0.5, seed=7)
    params = [q, k, v, g_raw, beta_logit, h0, A_log, dt_bias]
    opts = dict(scale=0.3, initial_state=h0, output_final_state=True,
                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log,
                dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, cu_seqlens=cu,
                state_v_first=True)
    f = linseq.chunk_kda if mode == "chunked" else linseq.fused_recurrent_kda
    gen = torch.Generator().manual_seed(9)
    w_o = torch.randn(B, T, HV, V, generator=gen)
    w_h = torch.randn(N, HV, V, K, generator=gen)

    o, ht = f(q, k, v, g_raw, beta_logit, **opts)
    loss = (o * w_o).sum() + (ht * w_h).sum()
    loss.backward()
    ours = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None

    o_ref, ht_ref = naive.kda(q, k, v, g_raw, beta_logit, scale=0.3, h0=h0, l2=True,
                              gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                              beta_logit=True, cu_seqlens=cu, state_v_first=True)
    _close("o", o, o_ref, 2e-6)
    _close("ht", ht, ht_ref, 2e-6)
    ((o_ref * w_o.double()).sum() + (ht_ref * w_h.double()).sum()).backward()
    names = ["q", "k", "v", "gate", "beta", "h0", "A_log", "dt_bias"]
    for name, got, p in zip(names, ours, params):
        _close(name, got, p.grad, 5e-5)

    # the step itself: an optimizer update from these gradients moves the loss down
    opt = torch.optim.SGD(params, lr=1e-3)
    for p, gr in zip(params, ours):
        p.grad = gr
    opt.step()
    with torch.no_grad():
        o2, ht2 = f(q, k, v, g_raw, beta_logit, **opts)
        assert (o2 * w_o).sum() + (ht2 * w_h).sum() < loss


@pytest.mark.parametrize("act", ["default", "sigmoid", "erf_gelu", "lambda"])
def test_state_space_v1_training_step(act):
    B, T, D, N, G = 2, 70, 12, 5, 3
    x, Bp, Cp, gate = _params((B, T, D), (B, T, G, N), (B, T, G, N), (B, T, D), seed=11)
    A = torch.nn.Parameter(-torch.rand(D, N, generator=torch.Generator().manual_seed(12)) - 0.2)
    Dskip, = _params((D,), seed=13)
    dt = torch.nn.Parameter(0.05 + 0.2 * torch.rand(B, T, D,
                                                    generator=torch.Generator().manual_seed(14)))
    h0, = _params((B, D, N), scale=0.5, seed=15)
    params = [x, A, Bp, Cp, Dskip, dt, gate, h0]
    act_fn = {"default": None, "sigmoid": torch.sigmoid,
              "erf_gelu": torch.nn.functional.gelu,  # not the kernel's tanh gelu: run in torch
              "lambda": lambda z: z * torch.tanh(z)}[act]
    ref_act = {"default": torch.nn.functional.silu}.get(act, act_fn)
    gen = torch.Generator().manual_seed(16)
    w_y, w_h = torch.randn(B, T, D, generator=gen), torch.randn(B, D, N, generator=gen)

    y, h, conv = linseq.state_space_v1(x, A, Bp, Cp, Dskip, dt, gate=gate, initial_state=h0,
                                       conv_state="untouched", act_fn=act_fn)
    assert conv == "untouched"
    ((y * w_y).sum() + (h * w_h).sum()).backward()
    ours = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    y_ref, h_ref = naive.ssm1(x, A, Bp, Cp, Dskip, dt, gate=gate, h0=h0, act=ref_act)
    _close("y", y, y_ref, 2e-6)
    _close("hT", h, h_ref, 2e-6)
    ((y_ref * w_y.double()).sum() + (h_ref * w_h.double()).sum()).backward()
    for name, got, p in zip(["x", "A", "B", "C", "D", "dt", "gate", "h0"], ours, params):
        _close(name, got, p.grad, 2e-5)


def test_kda_decay_and_conv_gradients():
    gate, dt_bias = _params((2, 9, 3, 8), (3, 8), seed=21)
    A_log, = _params((3,), seed=22)
    g = linseq.kda_decay(gate, A_log, dt_bias)
    w = torch.randn(g.shape, generator=torch.Generator().manual_seed(23))
    (g * w).sum().backward()
    ours = [gate.grad.clone(), A_log.grad.clone(), dt_bias.grad.clone()]
    for p in (gate, A_log, dt_bias):
        p.grad = None
    ref = -torch.exp(A_log.double())[:, None] * torch.nn.functional.softplus(
        gate.double() + dt_bias.double())
    _close("g", g, ref, 1e-6)
    (ref * w.double()).sum().backward()
    for name, got, p in zip(["gate", "A_log", "dt_bias"], ours, (gate, A_log, dt_bias)):
        _close(name, got, p.grad, 1e-5)

    x, w3, bias, state = _params((2, 11, 6), (6, 1, 4), (6,), (2, 6, 3), seed=24)
    y, new_state = linseq.causal_conv1d(x, w3, bias, activation="silu", conv_state=state)
    up = torch.randn(y.shape, generator=torch.Generator().manual_seed(25))
    ((y * up).sum() + new_state.sum()).backward()
    ours = [x.grad.clone(), w3.grad.clone(), bias.grad.clone(), state.grad.clone()]
    for p in (x, w3, bias, state):
        p.grad = None
    xs = torch.cat([state.double().transpose(1, 2), x.double()], dim=1)     # [B, W-1+T, D]
    ref = torch.nn.functional.conv1d(xs.transpose(1, 2), w3.double(), bias.double(),
                                     groups=6).transpose(1, 2)
    ref = torch.nn.functional.silu(ref)
    _close("y", y, ref, 1e-6)
    _close("state", new_state, xs[:, -3:].transpose(1, 2), 0)
    ((ref * up.double()).sum() + xs[:, -3:].sum()).backward()
    for name, got, p in zip(["x", "weight", "bias", "conv_state"], ours, (x, w3, bias, state)):
        _close(name, got, p.grad, 1e-5)
    assert np.shape(ours[1]) == (6, 1, 4)
