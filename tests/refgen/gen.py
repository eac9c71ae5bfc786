#!/usr/bin/env python3
"""Writes the repository's own reference cases (docs/semantics.md, "Case folders").

    python3 tests/refgen/gen.py OUT_DIR

First checks the tape's gradients against finite differences on tiny cases (selfcheck.py),
then writes one folder per case of the op modules (op_*.py, found by defs.py: meta.json and
float32 .npy files, cu_seqlens int64) and OUT_DIR/index.json, into OUT_DIR.tmp, which replaces
OUT_DIR at the end: a failed run leaves no partial set. The reference is float64 (each op's
entry in its op_*.py: its definition there on tape.py) from the float32 inputs as stored,
rounded to float32 when written. A case of an op with no entry, or an entry with no case,
stops it. Deterministic: fixed seeds, so a rerun writes the same bytes. Needs Python 3 and
NumPy only.
"""
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import defs  # noqa: E402
import draw  # noqa: E402
import reference  # noqa: E402
import selfcheck  # noqa: E402
from tape import grad  # noqa: E402

FWD_TOL = {'max_rel_err': 1e-4, 'min_cos': 0.999999}
GRAD_TOL = {'max_rel_err': 1e-3, 'min_cos': 0.99999}
ABS_FLOOR = 1e-6
# index.json is read by the Python tests alone (python/tests/conftest.py), and their

def options_meta(c, arrays):
    """The meta.json keys the case loader reads, plus a few that only describe the draw."""
    sizes = {k: c[k] for k in ('B', 'T', 'H', 'HV', 'K', 'V', 'D', 'N', 'G', 'W', 'P') if k in c}
    m = {'op': c['op'], 'name': c['name'], 'seed': c['seed'], **sizes}
    m.update(defs.op_def(c['op']).options(c, arrays))
    if 'cu' in c:
        m['cu_seqlens'] = list(c['cu'])
    return m


def prepared(c):
    """The case with what its options imply (c['given']: the keys the case set itself)."""
    op = defs.op_def(c['op'])
    c = dict(c, given=set(c))
    return op.prepare(c) if op.prepare else c


def build(c):
    """(meta, {file name: array}) of one case."""
    rng = np.random.default_rng(c['seed'])
    c = prepared(c)
    op = defs.op_def(c['op'])
    arrays = draw.inputs(c, rng, op.draw)
    outputs, values = reference.forward(c, arrays)
    out_names = list(op.outputs)
    up_names = reference.upstream_names(c)
    upstream = {u: draw.f32(rng.standard_normal(outputs[u[2:]].shape)) for u in up_names}
    names = reference.grad_names(c, arrays)
    loss = reference.loss_of(outputs, upstream)
    grads = grad(loss, [values[n] for n in names]) if names else []
    files = dict(arrays, **upstream)
    files.update({n: outputs[n].data for n in out_names})
    files.update({'d' + n: g for n, g in zip(names, grads)})
    meta = options_meta(c, arrays)
    if up_names:
        meta['loss'] = ' + '.join(f'sum({u[2:]}*{u})' for u in up_names)
    meta['inputs'] = list(arrays)
    meta['upstream_grads'] = up_names
    meta['outputs'] = out_names
    meta['grads'] = ['d' + n for n in names]
    meta['tolerance'] = {n: FWD_TOL for n in out_names}
    meta['tolerance'].update({'d' + n: GRAD_TOL for n in names})
    meta['tolerance_abs_floor'] = ABS_FLOOR
    meta['shapes'] = {n: list(a.shape) for n, a in files.items()}
    meta['dtypes'] = {n: 'int64' if n == 'cu_seqlens' else 'float32' for n in files}
    return meta, files


def check_coverage():
    """Every case names a defined op, and every defined op has cases, and self-check cases
    where it has gradients: a definition nothing runs would be a reference nothing is
    compared with."""
    for c in defs.CASES + defs.CHECKS:
        defs.op_def(c['op'])
    for name, op in defs.OPS.items():
        for what, listed in (('CASES', defs.CASES), ('CHECKS', defs.CHECKS)):
            if (op.grads or listed is defs.CASES) and not any(c['op'] == name for c in listed):
                raise SystemExit(f'refgen: op {name!r} has no case in {what} of its op_*.py')


def write_case(root, meta, files):
    folder = os.path.join(root, meta['name'])
    os.makedirs(folder)
    with open(os.path.join(folder, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=1)
        f.write('\n')
    for name, a in files.items():
        dtype = '<i8' if name == 'cu_seqlens' else '<f4'
        np.save(os.path.join(folder, name + '.npy'), np.ascontiguousarray(a, dtype=dtype))


def main(argv):
    if len(argv) != 2:
        sys.exit('usage: python3 tests/refgen/gen.py OUT_DIR')
    out = argv[1].rstrip('/')
    start = time.time()
    check_coverage()
    worst = max(selfcheck.check_case(c) for c in defs.CHECKS)
    print(f'refgen: gradients match finite differences on {len(defs.CHECKS)} tiny cases '
          f'(worst {worst:.1e} relative)')
    tmp = out + '.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    index = []
    for c in defs.CASES:
        meta, files = build(c)
        write_case(tmp, meta, files)
        index.append({'name': meta['name'], 'op': meta['op'], 'seed': meta['seed']})
    with open(os.path.join(tmp, 'index.json'), 'w') as f:
        json.dump(index, f, indent=1)
        f.write('\n')
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    print(f'refgen: {len(defs.CASES)} reference cases in {out} ({len(index)} in its index, '
          f'{time.time() - start:.1f} s)')


if __name__ == '__main__':
    main(sys.argv)
