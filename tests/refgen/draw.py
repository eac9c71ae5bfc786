"""Random inputs for one case: float32 values from a seeded PCG64 generator, so reruns are
identical. Which files an op takes with the case's options, and how each is drawn, is its
module's draw function (op_*.py); these are the shared pieces."""
import numpy as np


def f32(a):
    return np.asarray(a, dtype=np.float32)


def inputs(c, rng, draw_op):
    """The case's input files as float32 arrays (cu_seqlens added as int64): draw_op is its
    op's draw function (its op_*.py)."""
    x = {name: f32(a) for name, a in draw_op(rng, c).items()}
    if 'cu' in c:
        x['cu_seqlens'] = np.asarray(c['cu'], dtype=np.int64)
    return x

