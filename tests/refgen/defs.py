"""Every op the generator knows, found by file name: each op_*.py of this folder is one op
(or an op and its close relatives, such as KDA and its segment summary) and holds all of
it: how a case draws its inputs, the op's float64 definition on the tape, its OpDef (its
outputs, the optional inputs that are zeros when absent, the gradient files a case lists,
its meta.json options) in OPS = {op name: OpDef}, its cases in CASES and the tiny cases of
the gradient self-check in CHECKS. A new op is one new op_<name>.py and no edit elsewhere.

The other modules reach an op only through op_def(name), which raises for an op with no
entry: an op missing here is an error that names it, never another op's branch. The C test
test_op_coverage checks that every op of the library's op table has generated cases, so a
new op of the table fails there, named, until its op_*.py is written.

CASES (and so the case index, index.json) lists the ops in LEGACY_ORDER, the order of the
hand-kept list this discovery replaced (the op table's), then every other op by name: the
index keeps its bytes, and a new op's cases come after the others'. Within an op, its
module's order.
"""
import glob
import importlib
import os

HERE = os.path.dirname(os.path.abspath(__file__))
LEGACY_ORDER = ('kda', 'kda_gate', 'ssm1', 'causal_conv1d', 'kda_segment', 'ssm1_segment',
                'ema')


def _rank(op):
    return (0, LEGACY_ORDER.index(op)) if op in LEGACY_ORDER else (1, op)


def _discover():
    """(OPS, CASES, CHECKS) of every op_*.py here; an op defined twice, or a case in a
    module that does not define its op, is an error naming them."""
    ops, where, cases, checks = {}, {}, [], []
    for path in sorted(glob.glob(os.path.join(HERE, 'op_*.py'))):
        module = importlib.import_module(os.path.basename(path)[:-3])
        for name, op in module.OPS.items():
            if name in ops:
                raise ValueError(f'refgen: op {name!r} is defined in both {where[name]} and '
                                 f'{module.__name__}')
            ops[name], where[name] = op, module.__name__
        for c in list(module.CASES) + list(getattr(module, 'CHECKS', [])):
            if c['op'] not in module.OPS:
                raise ValueError(f"refgen: {module.__name__} has a case of op {c['op']!r}, "
                                 f"which it does not define")
        cases += module.CASES
        checks += getattr(module, 'CHECKS', [])
    ordered = sorted(ops, key=_rank)
    by_op = lambda c: _rank(c['op'])  # noqa: E731 (sorted() is stable: module order kept)
    return {n: ops[n] for n in ordered}, sorted(cases, key=by_op), sorted(checks, key=by_op)


OPS, CASES, CHECKS = _discover()


def op_def(name):
    """The definition of op `name`; ValueError, naming it, when there is none."""
    if name not in OPS:
        raise ValueError(f'refgen: no definition of op {name!r} (defined: {", ".join(OPS)})')
    return OPS[name]
