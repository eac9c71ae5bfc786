"""linseq.compat.neuron.kda_chunk_step takes g_last in the shape the Trainium package passes
it, the last row of g_cumsum broadcast to (C, dk) (g_cumsum[-1:, :].expand(C, dk)), as well
as (1, dk) and (dk,); a broadcast whose rows are not all that last row is refused by name.
Values against the float64 token loop of test_compat_neuron."""

import numpy as np
import pytest

from conftest import require

torch = require("torch")
from linseq.compat import neuron  # noqa: E402
from test_compat_neuron import close, inputs, ref  # noqa: E402

f32 = np.float32


@pytest.mark.parametrize("lead", [(), (3,)])
@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_g_last_broadcast_to_the_chunk(lead, framework):
    S, dk, dv = 19, 6, 4
    q, k, v, g, beta, s0 = inputs(lead, S, dk, dv, seed=21)
    gc = np.cumsum(g.astype(np.float64), axis=-2).astype(f32)
    rows = np.repeat(beta[..., None], dk, -1)
    g_last = np.broadcast_to(gc[..., -1:, :], gc.shape)          # (..., C, dk)
    args = [q, k, v, rows, gc, g_last, s0]
    if framework == "torch":
        args = [torch.tensor(x) for x in args[:5]] + \
            [torch.tensor(gc)[..., -1:, :].expand(gc.shape), torch.tensor(s0)]
    o, h = neuron.kda_chunk_step(*args)
    o_ref, h_ref = ref(q, k, v, g, beta, s0)
    close("out", o, o_ref, 5e-5)
    close("state", h, h_ref, 5e-5)
    # the other documented forms give the same bits
    for other in (gc[..., -1:, :], gc[..., -1, :]):
        o2, h2 = neuron.kda_chunk_step(q, k, v, rows, gc, other, s0)
        np.testing.assert_array_equal(np.asarray(o2), np.asarray(o))
        np.testing.assert_array_equal(np.asarray(h2), np.asarray(h))


def test_a_broadcast_with_another_row_is_refused():
    S, dk, dv = 9, 4, 3
    q, k, v, g, beta, s0 = inputs((), S, dk, dv, seed=22)
    gc = np.cumsum(g.astype(np.float64), axis=0).astype(f32)
    rows = np.repeat(beta[:, None], dk, 1)
    g_last = np.repeat(gc[-1:], S, 0)
    g_last[4, 1] -= 0.5
    with pytest.raises(ValueError, match="g_last: every row"):
        neuron.kda_chunk_step(q, k, v, rows, gc, g_last, s0)
    with pytest.raises(ValueError, match=r"g_last: expected shape \(\.\.\., C, dk\)"):
        neuron.kda_chunk_step(q, k, v, rows, gc, np.repeat(gc[-1:], S + 1, 0), s0)
