"""What an op module (op_*.py) declares about each of its ops: the OpDef record, and the
helpers several ops' entries share. Generic: names no op.

A case (an op module's CASES and CHECKS) is its meta.json options plus: op, name, seed, and
how to draw inputs (the op's own keys, e.g. g_style and g_mag for KDA decays), 'cu' (packed
sequence offsets, making the case varlen), 'dstate_at_zero' (list the initial state's
gradient although there is no initial state) and 'd_state' (give the upstream gradient of
the final state). Sizes stay small enough that generating every case takes seconds and the
C tests stay fast, with T > 16, 32, 64 and 128 somewhere for the chunked ops, so that every
chunk size has chunk boundaries and the backward's 64-token segments split a sequence.
"""
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class OpDef:
    draw: Callable        # (rng, case) -> {input name: float64 array}
    forward: Callable     # (values, case) -> {output name: Value}
    outputs: tuple        # the outputs' file names; d_<first> is always given upstream,
    #                       d_<second> (the state's) with the case's 'd_state'
    optional: Callable    # case -> {optional differentiable input: shape}: zeros when absent
    grads: Optional[Callable]  # (case, inputs) -> the inputs whose gradient files the case
    #                            lists; None for a forward-only op (no upstream, no gradients)
    options: Callable     # (case, arrays) -> meta.json's options and presence flags
    prepare: Optional[Callable] = None  # case -> case with derived options (KDA's scale)


def state_rows(c):
    """The rows of a state: the sequences of a varlen case, else the batch."""
    return len(c['cu']) - 1 if 'cu' in c else c['B']


def with_state_grad(c, inputs, state, names):
    """names, plus the initial state's when it is given or asked for at zeros."""
    return names + ([state] if state in inputs or c.get('dstate_at_zero') else [])
