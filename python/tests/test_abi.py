"""The Python binding's structs against the C library's: every struct the binding passes to C
is laid out from the library's own description (linseq_op_table_json), and refused when
ctypes would place any field elsewhere than the C compiler did."""

import ctypes
import copy

import pytest

from linseq import _lib


def _structs():
    yield _lib.op_table["exec"]
    for op in _lib.op_table["ops"]:
        yield op["problem"]
        if op["grads"] is not None:  # a forward-only op has no grads struct
            yield op["grads"]


@pytest.mark.parametrize("desc", list(_structs()), ids=lambda d: d["type"])
def test_layout_matches_the_c_library(desc):
    cls = getattr(_lib, _lib._class_name(desc["type"]))
    assert ctypes.sizeof(cls) == desc["size"]
    for field in desc["fields"]:
        assert getattr(cls, field["name"]).offset == field["offset"], field["name"]


def test_every_struct_of_the_api_is_described():
    names = {d["type"] for d in _structs()}
    for op in ("kda", "kda_gate", "ssm1", "conv1d"):
        assert f"linseq_{op}_problem" in names and f"linseq_{op}_grads" in names
    assert "linseq_exec" in names


def _misdescribed(kind):
    desc = copy.deepcopy(_lib.op_table["ops"][0]["problem"])
    fields = desc["fields"]
    if kind == "type":        # a bool read as an int64 would shift every later field
        next(f for f in fields if f["type"] == "bool")["type"] = "int64"
    elif kind == "missing":   # a field added to the header but not to the description
        del fields[len(fields) // 2]
    else:                      # a struct that grew at its end
        desc["size"] += 8
    return desc


@pytest.mark.parametrize("kind", ["type", "missing", "size"])
def test_a_layout_that_would_misbind_is_refused(kind):
    with pytest.raises(ValueError):
        _lib.struct_class(_misdescribed(kind))


def test_enum_values_come_from_the_library():
    kda = next(o for o in _lib.op_table["ops"] if o["name"] == "kda")
    decay = next(o for o in kda["options"] if o["key"] == "decay")["values"]
    assert (_lib.DECAY_NONE, _lib.DECAY_PER_HEAD, _lib.DECAY_PER_CHANNEL) == (
        decay["none"], decay["per_head"], decay["per_channel"])
