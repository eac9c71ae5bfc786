"""The generator checks its own gradients: on tiny cases (the CHECKS of the op modules,
defs.CHECKS) the tape's gradient of every differentiable input, element by element, against
central finite differences of the float64 loss. A mismatch raises, so a wrong definition or
tape rule stops generation."""
import numpy as np

import defs
import draw
import reference
from tape import grad

STEP = 1e-6      # float64: truncation ~STEP^2, rounding ~1e-16/STEP, both far below TOL
TOL = 1e-6       # max |numeric - tape| over a tensor, relative to max(1, max |tape|)


def _loss(c, arrays, upstream):
    outputs, _ = reference.forward(c, arrays)
    return float(reference.loss_of(outputs, upstream).data)


def check_case(c):
    """Returns the largest relative mismatch over the case's gradients; raises on failure."""
    rng = np.random.default_rng(c['seed'])
    op = defs.op_def(c['op'])
    c = op.prepare(dict(c, given=set(c))) if op.prepare else c
    arrays = {n: a.astype(np.float64) if a.dtype == np.float32 else a
              for n, a in draw.inputs(c, rng, op.draw).items()}
    outputs, values = reference.forward(c, arrays)
    upstream = {u: rng.standard_normal(outputs[u[2:]].shape)
                for u in reference.upstream_names(c)}
    names = reference.grad_names(c, arrays)
    tape_grads = grad(reference.loss_of(outputs, upstream), [values[n] for n in names])
    worst = 0.0
    for name, g in zip(names, tape_grads):
        base = dict(arrays)
        base.setdefault(name, np.zeros(values[name].shape))
        numeric = np.zeros_like(g)
        for i in np.ndindex(*g.shape):
            plus, minus = base[name].copy(), base[name].copy()
            plus[i] += STEP
            minus[i] -= STEP
            numeric[i] = (_loss(c, dict(base, **{name: plus}), upstream) -
                          _loss(c, dict(base, **{name: minus}), upstream)) / (2 * STEP)
        err = np.abs(numeric - g).max() / max(1.0, np.abs(g).max()) if g.size else 0.0
        if not err <= TOL:
            raise AssertionError(f"refgen self-check: {c['op']} '{c['name']}': d{name} differs "
                                 f"from finite differences by {err:.3g} (> {TOL})")
        worst = max(worst, err)
    return worst
