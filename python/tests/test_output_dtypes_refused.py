"""Output dtypes that cannot hold the result are refused by the argument's name, before
anything is computed or written: fla's gate helpers' output_dtype (an integer or complex
dtype would truncate or reinterpret a log decay) and causal-conv1d's final_states_out of an
integer dtype (copy_ would truncate the states silently). Floating dtypes stay accepted."""

import numpy as np
import pytest

from conftest import require

torch = require("torch")
from linseq.compat import causal_conv1d, fla  # noqa: E402

H, K = 3, 4


def _gate_args():
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(2, 5, H, K, generator=gen), torch.randn(H, generator=gen),
            torch.randn(H * K, generator=gen))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64,
                                   np.int32, "int16"])
def test_gate_output_dtype_must_be_floating(dtype):
    g, A_log, dt_bias = _gate_args()
    with pytest.raises(TypeError, match="output_dtype"):
        fla.fused_kda_gate(g, A_log, dt_bias, output_dtype=dtype)
    with pytest.raises(TypeError, match="output_dtype"):
        fla.fused_gdn_gate(g[..., 0], A_log, dt_bias[:H], output_dtype=dtype)
    with pytest.raises(TypeError, match="output_dtype"):
        fla.fused_kda_gate(g.numpy(), A_log.numpy(), dt_bias.numpy(), output_dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_gate_floating_output_dtypes_still_work(dtype):
    g, A_log, dt_bias = _gate_args()
    want = fla.fused_kda_gate(g, A_log, dt_bias)
    got = fla.fused_kda_gate(g, A_log, dt_bias, output_dtype=dtype)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want.to(dtype))
    assert fla.fused_kda_gate(g.numpy(), A_log.numpy(), dt_bias.numpy(),
                              output_dtype=np.float64).dtype == np.float64


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_conv_final_states_out_must_be_floating(dtype):
    gen = torch.Generator().manual_seed(1)
    x, weight = torch.randn(2, 6, 9, generator=gen), torch.randn(6, 4, generator=gen)
    buffer = torch.zeros(2, 6, 3, dtype=dtype)
    with pytest.raises(TypeError, match="final_states_out"):
        causal_conv1d.causal_conv1d_fn(x, weight, return_final_states=True,
                                       final_states_out=buffer)
    assert not buffer.any()   # nothing written
    floating = torch.zeros(2, 6, 3, dtype=torch.float64)
    out, states = causal_conv1d.causal_conv1d_fn(x, weight, return_final_states=True,
                                                 final_states_out=floating)
    assert states is floating
    torch.testing.assert_close(states, x[..., -3:].double())
