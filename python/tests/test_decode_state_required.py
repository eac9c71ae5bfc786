"""linseq.kda_decode without a state (None) says that a state is required, for NumPy,
PyTorch and JAX arrays and through linseq.torch / linseq.jax, instead of a message about
the dtype of an object array."""

import importlib

import numpy as np
import pytest

from conftest import require

import linseq

B, H, K, V = 2, 2, 4, 3


def _step(xp):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((B, H, K)), rng.standard_normal((B, H, K)),
              rng.standard_normal((B, H, V)), -rng.random((B, H, K)), rng.random((B, H))]
    return [xp(a.astype(np.float32)) for a in arrays]


def _frameworks():
    out = [("numpy", np.asarray, linseq.kda_decode)]
    torch = require("torch")
    lt = importlib.import_module("linseq.torch")
    out += [("torch", torch.tensor, linseq.kda_decode),
            ("linseq.torch", torch.tensor, lt.kda_decode)]
    jnp = require("jax.numpy")
    lj = importlib.import_module("linseq.jax")
    out += [("jax", jnp.asarray, linseq.kda_decode),
            ("linseq.jax", jnp.asarray, lj.kda_decode)]
    return out


@pytest.mark.parametrize("index", range(5))
def test_state_none_is_refused_as_required(index):
    name, xp, decode = _frameworks()[index]
    q, k, v, g, beta = _step(xp)
    for kwargs in (dict(), dict(inplace=True), dict(state_indices=np.array([1, 0]))):
        with pytest.raises(ValueError, match="state: a state is required"):
            decode(q, k, v, g, beta, None, **kwargs)
