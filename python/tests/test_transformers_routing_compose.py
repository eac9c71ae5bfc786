"""linseq.integrations.transformers: enable(), disable() and routing() blocks compose in
any order. The innermost open block decides what a module global holds; outside the blocks
enable() and disable() do; on every exit the enclosing choice comes back, and disable()
always puts back the functions from outside linseq (transformers' own, still wrapped),
never the unwrapped PyTorch functions a "torch" block installs."""

import importlib

import pytest

from conftest import require

require("torch")
require("transformers")
import linseq.integrations.transformers as linseq_hf  # noqa: E402

NAMES = [f"{m}.{f}" for m, functions in linseq_hf.ROUTES.items() for f in functions]


def current():
    return {n: getattr(importlib.import_module(n.rsplit(".", 1)[0]), n.rsplit(".", 1)[1])
            for n in NAMES}


@pytest.fixture
def originals():
    linseq_hf.disable()
    before = current()
    yield before
    linseq_hf.disable()
    assert current() == before


def is_linseq(fns):
    return all(getattr(fns[n], "linseq_route", None) == n for n in NAMES)


def is_torch(fns, originals):
    return all(fns[n] is getattr(originals[n], "__wrapped__", originals[n]) for n in NAMES)


def test_enable_inside_a_torch_block_holds_after_it(originals):
    with linseq_hf.routing("torch"):
        linseq_hf.enable()
        assert is_torch(current(), originals)      # the block's choice, inside it
    assert is_linseq(current())                     # enable() was not undone
    assert set(linseq_hf.disable()) == set(NAMES)
    assert current() == originals                   # the wrapped originals, not torch's


def test_disable_inside_a_linseq_block_takes_effect_at_its_exit(originals):
    linseq_hf.enable()
    with linseq_hf.routing("linseq"):
        assert set(linseq_hf.disable()) == set(NAMES)
        assert is_linseq(current())
    assert current() == originals
    assert linseq_hf.disable() == ()


def test_nested_blocks_and_enable_disable_in_between(originals):
    with linseq_hf.routing("torch"):
        with linseq_hf.routing("linseq"):
            assert is_linseq(current())
            linseq_hf.enable()
        assert is_torch(current(), originals)
        linseq_hf.disable()
        with linseq_hf.routing("linseq"):
            linseq_hf.enable()
        assert is_torch(current(), originals)
    assert is_linseq(current())
    with linseq_hf.routing("torch"):
        linseq_hf.disable()
    assert current() == originals


def test_enable_twice_then_blocks_then_disable(originals):
    linseq_hf.enable()
    enabled = current()
    linseq_hf.enable()
    with linseq_hf.routing("torch"):
        with linseq_hf.routing("torch"):
            pass
        assert is_torch(current(), originals)
    assert current() == enabled
    linseq_hf.disable()
    assert current() == originals
