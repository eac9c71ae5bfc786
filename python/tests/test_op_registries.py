"""The hand-kept lists of the Python package agree with the library's op table: an op of
the table is reachable from Python, through its own front end (a spec, its torch custom ops,
its XLA FFI targets) or through linseq.ops.run / decode / backward, which read the table;
and the front-end lists name the same ops as each other. A new op of the table, or a spec
added without its other half, fails here by name."""
import pytest

import linseq
from linseq import _lib, _opspec
from conftest import require


def table_ops():
    return {o["name"]: o for o in _lib.op_table["ops"]}


def test_every_op_of_the_table_has_a_spec():
    """A spec per op: the ops with a front end of their own, and every other op from its
    description alone (_opspec.generic), a new op of the table included."""
    assert set(_opspec.SPECS) == set(table_ops())
    for name, spec in _opspec.SPECS.items():
        assert spec.table == name
        assert spec.has_backward == table_ops()[name]["backward"], name


def test_an_op_without_its_own_front_end_is_refused_by_name():
    """ops.run reaches any op by its description; a forward-only op with no front end (the
    template EMA) and the segment summaries (linseq.distributed's) among them."""
    for name in table_ops():
        if name in {s.table for s in _opspec._OWN}:
            continue
        with pytest.raises(ValueError, match="needs|expected"):
            linseq.ops.run(name, {})  # refused by name, not a KeyError: it is known


def test_jax_ffi_handlers_take_every_op_of_the_table():
    """The XLA handlers are one per call kind and take the op by name: every op's problem and
    grads struct fits what they carry, and the handler library exports each kind."""
    require("jax")
    from linseq import _jax_ffi
    if not _jax_ffi.AVAILABLE:
        pytest.skip(f"no XLA FFI handlers: {_jax_ffi.WHY_NOT}")
    for name, desc in table_ops().items():
        for struct in (desc["problem"], desc["grads"]):
            if struct is not None:
                assert 0 < struct["size"] <= _jax_ffi._STRUCT_CAPACITY, (name, struct["type"])
    for target in _jax_ffi.TARGETS:
        assert hasattr(_jax_ffi._handlers, "linseq_xla_" + target), target


def test_torch_custom_ops_cover_the_specs():
    require("torch")
    from linseq import _torch_ops
    if not _torch_ops.AVAILABLE:
        pytest.skip("this PyTorch has no torch.library.custom_op")
    assert {spec.table for spec in _torch_ops.OPS} == set(_opspec.SPECS)
