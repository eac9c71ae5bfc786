#!/usr/bin/env python3
"""Judges candidate output files against reference cases (docs/semantics.md, "Tolerance").

    python3 tests/refgen/judge.py REF_ROOT CAND_ROOT    every case folder of REF_ROOT against
                                                        CAND_ROOT/<case name>/
    python3 tests/refgen/judge.py REF_CASE CAND_DIR     one case

For every file of the case's "outputs" and "grads": the candidate must exist, have exactly
the reference's shape, be finite, and meet meta.json's tolerance for that file:
max|cand-ref| / max|ref| <= max_rel_err and cosine(cand, ref) >= min_cos; when the reference
is all zero, max|cand| <= tolerance_abs_floor instead. Prints one line per file and a
summary; exits 1 when anything fails, 2 on bad usage. Written independently of the library
and its CLI: NumPy only.
"""
import json
import os
import sys

import numpy as np


def judge_file(ref, cand, tol, floor):
    """(passed, text) for one candidate array against its reference."""
    if cand.shape != ref.shape:
        return False, f'shape {list(cand.shape)}, expected {list(ref.shape)}'
    cand, ref = cand.astype(np.float64), ref.astype(np.float64)
    if not np.all(np.isfinite(cand)):
        return False, f'{int(np.sum(~np.isfinite(cand)))} non-finite values'
    peak = float(np.abs(ref).max()) if ref.size else 0.0
    err = float(np.abs(cand - ref).max()) if ref.size else 0.0
    if peak == 0.0:
        ok = err <= floor
        return ok, f'reference all zero: max|cand| {err:.3g} (floor {floor:g})'
    rel = err / peak
    norms = float(np.linalg.norm(cand) * np.linalg.norm(ref))
    cos = float(np.sum(cand * ref)) / norms if norms > 0 else 0.0
    ok = rel <= tol['max_rel_err'] and cos >= tol['min_cos']
    return ok, (f'max abs {err:.3g}, max_rel_err {rel:.3g} (<= {tol["max_rel_err"]:g}), '
                f'cos {cos:.12f} (>= {tol["min_cos"]})')


def judge_case(ref_dir, cand_dir):
    """(files passed, files failed) of one case, printing a line per file."""
    with open(os.path.join(ref_dir, 'meta.json')) as f:
        meta = json.load(f)
    name = os.path.basename(os.path.normpath(ref_dir))
    floor = meta.get('tolerance_abs_floor', 1e-6)
    passed = failed = 0
    for key in meta['outputs'] + meta.get('grads', []):
        path = os.path.join(cand_dir, key + '.npy')
        if not os.path.isfile(path):
            ok, text = False, 'missing'
        else:
            try:
                cand = np.load(path, allow_pickle=False)
            except (ValueError, OSError) as e:
                ok, text = False, f'unreadable: {e}'
            else:
                ref = np.load(os.path.join(ref_dir, key + '.npy'), allow_pickle=False)
                ok, text = judge_file(ref, cand, meta['tolerance'][key], floor)
        print(f'{"PASS" if ok else "FAIL"}  {name}/{key}: {text}')
        passed, failed = passed + ok, failed + (not ok)
    return passed, failed


def main(argv):
    if len(argv) != 3 or not os.path.isdir(argv[1]):
        print('usage: judge.py REF_ROOT CAND_ROOT | judge.py REF_CASE CAND_DIR', file=sys.stderr)
        return 2
    ref, cand = argv[1], argv[2]
    if os.path.isfile(os.path.join(ref, 'meta.json')):
        pairs = [(ref, cand)]
    else:
        pairs = [(os.path.join(ref, n), os.path.join(cand, n)) for n in sorted(os.listdir(ref))
                 if os.path.isfile(os.path.join(ref, n, 'meta.json'))]
    if not pairs:
        print(f'judge.py: no case folders (with meta.json) in {ref}', file=sys.stderr)
        return 2
    passed = failed = 0
    for ref_dir, cand_dir in pairs:
        p, f = judge_case(ref_dir, cand_dir)
        passed, failed = passed + p, failed + f
    print(f'judge: {len(pairs)} cases, {passed} files passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
