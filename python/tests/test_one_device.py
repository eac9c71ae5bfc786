"""A call whose tensors are on more than one device is refused before dispatch, naming the
argument and its device, and nothing is written. Before, a meta tensor among CPU tensors
(an optional one: cu_seqlens, bias, delta_bias, state indices ...) sent the call of a
torch.library op to its fake implementation: uninitialised CPU memory came back as the
output, and a pool was not updated."""

import numpy as np
import pytest

from conftest import require

torch = require("torch")

import linseq  # noqa: E402
import linseq.torch as lt  # noqa: E402
from linseq.compat import causal_conv1d as cc  # noqa: E402
from linseq.compat import fla  # noqa: E402
from linseq.compat import mamba_ssm  # noqa: E402

META = torch.device("meta")


def _meta(t):
    return torch.empty(t.shape, dtype=t.dtype, device=META)


def _refused(call, name):
    with pytest.raises(ValueError, match=rf"^{name}: a tensor on meta, while \w+ is on cpu"):
        call()


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# fla: cu_seqlens and initial_state beside CPU tensors -------------------------------------

def _fla_args(B=1, T=6, H=2, K=4, V=3):
    return dict(q=_randn(B, T, H, K, seed=1), k=_randn(B, T, H, K, seed=2),
                v=_randn(B, T, H, V, seed=3), g=-torch.rand(B, T, H, K), beta=torch.rand(B, T, H))


@pytest.mark.parametrize("fn", [fla.chunk_kda, fla.fused_recurrent_kda,
                                fla.chunk_gated_delta_rule,
                                fla.fused_recurrent_gated_delta_rule])
def test_fla_functions_refuse_meta_cu_seqlens_and_state(fn):
    a = _fla_args()
    if fn in (fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule):
        a["g"] = -torch.rand(a["g"].shape[:3])
    cu = torch.tensor([0, 2, 6])
    _refused(lambda: fn(**a, cu_seqlens=_meta(cu)), "cu_seqlens")
    h0 = torch.zeros(2, 2, 4, 3)
    _refused(lambda: fn(**a, cu_seqlens=cu, initial_state=_meta(h0),
                        output_final_state=True), "initial_state")


def test_linseq_kda_decode_refuses_meta_state_indices():
    a = _fla_args(B=3, T=1)
    pool = _randn(4, 2, 4, 3, seed=4)
    before = pool.clone()
    rows = torch.tensor([2, 0, 3])
    _refused(lambda: linseq.kda_decode(a["q"], a["k"], a["v"], a["g"], a["beta"], pool,
                                       _meta(rows), inplace=True), "state_indices")
    assert torch.equal(pool, before)


# mamba-ssm ---------------------------------------------------------------------------------

b, d, l, n = 2, 6, 5, 3


def _scan_args():
    return dict(u=_randn(b, d, l, seed=5), delta=torch.rand(b, d, l), A=-torch.rand(d, n),
                B=_randn(b, n, l, seed=6), C=_randn(b, n, l, seed=7))


@pytest.mark.parametrize("name,value", [("delta_bias", torch.zeros(d)), ("D", torch.ones(d)),
                                        ("z", torch.zeros(b, d, l))])
def test_selective_scan_fn_refuses_a_meta_optional(name, value):
    a = _scan_args()
    _refused(lambda: mamba_ssm.selective_scan_fn(**a, **{name: _meta(value)},
                                                 delta_softplus=True), name)


def test_mamba_inner_fn_refuses_meta_delta_bias():
    rank = 2
    xz = _randn(b, 2 * d, l, seed=8)
    args = (xz, _randn(d, 1, 4, seed=9), torch.zeros(d), _randn(rank + 2 * n, d, seed=10),
            _randn(d, rank, seed=11), _randn(5, d, seed=12), None, -torch.rand(d, n))
    _refused(lambda: mamba_ssm.mamba_inner_fn(*args, delta_bias=_meta(torch.zeros(d))),
             "delta_bias")


@pytest.mark.parametrize("name", ["state_batch_indices", "dt_bias", "D"])
def test_selective_state_update_refuses_a_meta_optional(name):
    state = _randn(4, d, n, seed=13)
    before = state.clone()
    optional = dict(state_batch_indices=torch.tensor([3, 1]), dt_bias=torch.zeros(d),
                    D=torch.ones(d))
    optional[name] = _meta(optional[name])
    _refused(lambda: mamba_ssm.selective_state_update(
        state, _randn(b, d, seed=14), torch.rand(b, d), -torch.rand(d, n), _randn(b, n),
        _randn(b, n, seed=15), dt_softplus=True, **optional), name)
    assert torch.equal(state, before)


# causal-conv1d -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["bias", "initial_states", "seq_idx"])
def test_causal_conv1d_fn_refuses_a_meta_optional(name):
    x, w = _randn(b, d, l, seed=16).transpose(1, 2).contiguous().transpose(1, 2), _randn(d, 4)
    optional = dict(bias=torch.zeros(d))
    if name == "seq_idx":
        optional["seq_idx"] = _meta(torch.zeros(b, l, dtype=torch.int32))
    elif name == "initial_states":
        optional["initial_states"] = _meta(torch.zeros(b, d, 3))
    else:
        optional["bias"] = _meta(optional["bias"])
    _refused(lambda: cc.causal_conv1d_fn(x, w, activation="silu", **optional), name)


@pytest.mark.parametrize("name", ["bias", "cache_seqlens", "conv_state_indices"])
def test_causal_conv1d_update_refuses_a_meta_optional(name):
    pool = _randn(4, d, 5, seed=17)
    before = pool.clone()
    optional = dict(bias=torch.zeros(d), cache_seqlens=torch.tensor([1, 7]),
                    conv_state_indices=torch.tensor([3, 0]))
    optional[name] = _meta(optional[name])
    _refused(lambda: cc.causal_conv1d_update(_randn(b, d, seed=18), pool, _randn(d, 4),
                                             activation="silu", **optional), name)
    assert torch.equal(pool, before)


# the library's own functions ------------------------------------------------------------

def test_front_ends_refuse_a_meta_optional():
    x, A = _randn(1, 6, d, seed=19), -torch.rand(d, n)
    Bp, dt = _randn(1, 6, n, seed=20), torch.rand(1, 6, d)
    _refused(lambda: lt.state_space_v1(x, A, Bp, Bp, None, dt,
                                       initial_state=_meta(torch.zeros(1, d, n))),
             "initial_state")
    _refused(lambda: lt.state_space_v1(x, A, Bp, Bp, None, dt,
                                       cu_seqlens=_meta(torch.tensor([0, 6]))), "cu_seqlens")
    _refused(lambda: lt.causal_conv1d(x, _randn(d, 4), _meta(torch.zeros(d))), "bias")


def test_all_tensors_on_meta_still_give_shapes():
    """One device for all, meta included, is no mixture: the fake implementation's shapes."""
    a = {k: _meta(v) for k, v in _scan_args().items()}
    y = mamba_ssm.selective_scan_fn(**a)
    assert y.device == META and tuple(y.shape) == (b, d, l)


def test_numpy_arrays_count_as_no_device():
    """A NumPy array beside tensors is converted by the backend, not refused."""
    x = _randn(1, 6, d, seed=21)
    y, _ = lt.causal_conv1d(x, np.ones((d, 4), np.float32))
    assert isinstance(y, torch.Tensor)
