#!/usr/bin/env python3
"""Writes the repository's own reference cases (docs/semantics.md, "Case folders").

    python3 tests/refgen/gen.py OUT_DIR

First checks the tape's gradients against finite differences on tiny cases (selfcheck.py),
then writes one folder per case of cases.py (meta.json and float32 .npy files, cu_seqlens
int64) and OUT_DIR/index.json, into OUT_DIR.tmp, which replaces OUT_DIR at the end: a failed
run leaves no partial set. The reference is float64 (ops.py on tape.py) from the float32
inputs as stored, rounded to float32 when written. Deterministic: fixed seeds, so a rerun
writes the same bytes. Needs Python 3 and NumPy only.
"""
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cases  # noqa: E402
import draw  # noqa: E402
import reference  # noqa: E402
import selfcheck  # noqa: E402
from tape import grad  # noqa: E402

FWD_TOL = {'max_rel_err': 1e-4, 'min_cos': 0.999999}
GRAD_TOL = {'max_rel_err': 1e-3, 'min_cos': 0.99999}
ABS_FLOOR = 1e-6
STATE_FLAG = {'kda': 'has_dht', 'ssm1': 'has_dhT'}


def options_meta(c, arrays):
    """The meta.json keys the case loader reads, plus a few that only describe the draw."""
    op, varlen = c['op'], 'cu' in c
    sizes = {k: c[k] for k in ('B', 'T', 'H', 'HV', 'K', 'V', 'D', 'N', 'G', 'W') if k in c}
    m = {'op': op, 'name': c['name'], 'seed': c['seed'], **sizes}
    if op == 'kda':
        m.update(decay=c['decay'], use_qk_l2norm=c['use_qk_l2norm'],
                 beta_is_logit=bool(c.get('beta_is_logit')),
                 state_v_first=bool(c.get('state_v_first')),
                 gate_in_kernel=bool(c.get('gate_in_kernel')), scale=c['scale'],
                 scale_is_default='scale' not in c['given'],
                 lower_bound=c.get('lower_bound'), varlen=varlen, has_h0='h0' in arrays,
                 has_dht=bool(c['d_state']), g_style=c.get('g_style', 'rand'))
    elif op == 'kda_gate':
        m.update(decay=c['decay'], lower_bound=c.get('lower_bound'))
    elif op == 'ema':
        m.update(has_h0='h0' in arrays)
    elif op == 'ssm1':
        m.update(dt_softplus=bool(c.get('dt_softplus')), gate_activation=c['gate_activation'],
                 has_gate='gate' in arrays, has_h0='h0' in arrays, has_dhT=bool(c['d_state']),
                 varlen=varlen)
    else:
        m.update(activation=c['activation'], has_bias='bias' in arrays,
                 has_state='conv_state' in arrays, varlen=varlen)
    if varlen:
        m['cu_seqlens'] = list(c['cu'])
    return m


def build(c):
    """(meta, {file name: array}) of one case."""
    rng = np.random.default_rng(c['seed'])
    c = dict(c, given=set(c))
    if c['op'] == 'kda':  # the scale as the float32 the library gets from meta.json
        c['scale'] = float(np.float32(c.get('scale') or c['K'] ** -0.5))
    arrays = draw.inputs(c, rng)
    outputs, values = reference.forward(c, arrays)
    out_names = reference.OUTPUTS[c['op']]
    up_names = ([] if c['op'] in reference.FORWARD_ONLY else
                ['d_' + n for n in out_names[:1 + bool(c.get('d_state'))]])
    upstream = {u: draw.f32(rng.standard_normal(outputs[u[2:]].shape)) for u in up_names}
    names = reference.grad_names(c, arrays)
    grads = grad(reference.loss_of(outputs, upstream), [values[n] for n in names]) if names else []
    files = dict(arrays, **upstream)
    files.update({n: outputs[n].data for n in out_names})
    files.update({'d' + n: g for n, g in zip(names, grads)})
    meta = options_meta(c, arrays)
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
    worst = max(selfcheck.check_case(c) for c in cases.CHECKS)
    print(f'refgen: gradients match finite differences on {len(cases.CHECKS)} tiny cases '
          f'(worst {worst:.1e} relative)')
    tmp = out + '.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    index = []
    for c in cases.CASES:
        meta, files = build(c)
        write_case(tmp, meta, files)
        index.append({'name': meta['name'], 'op': meta['op'], 'seed': meta['seed']})
    with open(os.path.join(tmp, 'index.json'), 'w') as f:
        json.dump(index, f, indent=1)
        f.write('\n')
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    print(f'refgen: {len(index)} reference cases in {out} ({time.time() - start:.1f} s)')


if __name__ == '__main__':
    main(sys.argv)
