"""Any op of the library's table on NumPy arrays, from the table alone: a new op of the C
library is callable here without a line of Python written for it.

    ys = linseq.ops.run("ema", {"x": x, "a": a})          # the op's outputs, table order
    y, = linseq.ops.decode("ema", {"x": x1, "a": a}, pool, state_rows=rows)
    grads = linseq.ops.backward("scaleshift", inputs, {"d_y": dy})  # {grad name: array}

The arrays are named as the table names the op's input tensors; the problem's sizes come
from the arrays wherever an input's dims are plain size names ("[B,T,D]": x's shape gives B,
T and D), and the rest from `sizes`; `cu_seqlens=` packs sequences into one row (B = 1) for
an op the table gives "varlen"; options are the table's option keys, an enum by its
name. Before any pointer reaches C, every array is checked against the shape the library
gives it under that problem (one linseq_op_shapes call), and the library validates again.
The ops with a front end of their own (kda, ssm1, conv1d, the gate) are also reachable here,
without their framework-style argument names, bf16 storage or strides.
"""

import ctypes
import re

import numpy as np

from .. import _lib
from .._arrays import as_f32, as_row_indices, check_pool
from ._common import make_exec, pointer, sequences

_PLAIN_DIMS = re.compile(r"^\[([A-Za-z_][A-Za-z0-9_]*(?:,[A-Za-z_][A-Za-z0-9_]*)*)\]$")
# "[D,W] ([W,D] weight_tap_major)": the dims, and other dims under a boolean option
_OPTION_DIMS = re.compile(r"^(\[[^\]]*\]) \((\[[^\]]*\]) ([A-Za-z_][A-Za-z0-9_]*)\)$")


def _dims_under(dims, options):
    """A tensor's dims under the call's options: the alternative a boolean option names when
    it is set."""
    m = _OPTION_DIMS.match(dims)
    if m is None:
        return dims
    return m.group(2) if options.get(m.group(3)) else m.group(1)


def _sizes(desc, arrays, given, options):
    """The problem's sizes: `given`, then those an input's plain dims name ([B,T,D])."""
    names = [s["name"] for s in desc["sizes"]]
    unknown = set(given) - set(names)
    if unknown:
        raise ValueError(f"sizes: {desc['name']} has {names}, got {sorted(unknown)}")
    sizes = dict(given)
    for t in desc["tensors"]:
        m = _PLAIN_DIMS.match(_dims_under(t["dims"], options)) if t["role"] == "input" else None
        arr = arrays.get(t["name"])
        if m is None or arr is None or arr.ndim != len(m.group(1).split(",")):
            continue
        for name, n in zip(m.group(1).split(","), arr.shape):
            if name in names:
                sizes.setdefault(name, int(n))
    missing = [s["name"] for s in desc["sizes"] if s["required"] and s["name"] not in sizes]
    if missing:
        raise ValueError(f"sizes: {desc['name']} needs {missing}; pass them in sizes= (no "
                         f"input's dims name them plainly)")
    return sizes


def _option_value(o, value):
    if "values" in o:  # an enum, by name
        if value not in o["values"]:
            raise ValueError(f"{o['key']}: expected one of {sorted(o['values'])}, got "
                             f"{value!r}")
        return o["values"][value]
    return value


def _problem(op, arrays, sizes, options, cu_seqlens=None):
    """The op's problem struct over the arrays (kept alive by the caller), and its shapes;
    cu_seqlens: packed sequences (B = 1), for an op the table gives "varlen"."""
    desc = _lib.op_desc(op)
    if cu_seqlens is not None and not desc.get("varlen"):
        raise ValueError(f"cu_seqlens: {op} takes no packed sequences (the table gives it no "
                         f"varlen)")
    inputs = {t["name"]: t for t in desc["tensors"] if t["role"] == "input"}
    unknown = set(arrays) - set(inputs)
    if unknown:
        raise ValueError(f"arrays: {op} takes {sorted(inputs)}, got {sorted(unknown)}")
    arrays = {n: as_f32(a, n) for n, a in arrays.items() if a is not None}
    problem = _lib.problem_class(op)()
    for name, n in _sizes(desc, arrays, sizes or {}, options).items():
        setattr(problem, name, n)
    _set_options(problem, desc, options)
    for name, arr in arrays.items():
        setattr(problem, inputs[name]["field"], pointer(arr))
    if cu_seqlens is not None:
        cu, problem.n_seqs = sequences(cu_seqlens, problem.B, problem.T)
        problem.cu_seqlens = pointer(cu)
        arrays["cu_seqlens"] = cu  # kept alive with the arrays
    shapes = _lib.Shapes(op, problem)
    for name, arr in arrays.items():
        if name == "cu_seqlens":
            continue
        want = shapes[name]
        if want != tuple(arr.shape):
            raise ValueError(f"{name}: expected shape {inputs[name]['dims']} = "
                             f"{list(want) if want else 'absent with these options'}, got "
                             f"{list(arr.shape)}")
    return problem, shapes, arrays


class _ShapeOnly:
    """A stand-in with an array's shape and no data: what the sizes are read from."""

    def __init__(self, shape):
        self.shape, self.ndim = tuple(int(n) for n in shape), len(shape)


_PRESENT = (ctypes.c_float * 1)()  # a non-NULL pointer for a tensor given as a shape only


def shapes_of(op, shapes, n_seqs=None, sizes=None, **options):
    """Every tensor's shape of op (a _lib.Shapes) from its inputs' shapes alone ({name: tuple
    or None}): what a fake tensor or a tracer gives. n_seqs: the number of packed sequences
    when cu_seqlens is given."""
    desc = _lib.op_desc(op)
    given = {n: _ShapeOnly(s) for n, s in shapes.items() if s is not None}
    problem = _lib.problem_class(op)()
    for name, n in _sizes(desc, given, sizes or {}, options).items():
        setattr(problem, name, n)
    _set_options(problem, desc, options)
    for t in desc["tensors"]:
        if t["role"] == "input" and t["name"] in given:
            setattr(problem, t["field"], ctypes.cast(_PRESENT, ctypes.c_void_p))
    if n_seqs is not None:
        problem.cu_seqlens = ctypes.cast(_PRESENT, ctypes.c_void_p)
        problem.n_seqs = n_seqs
    return _lib.Shapes(op, problem)


def _set_options(problem, desc, options):
    by_key = {o["key"]: o for o in desc["options"]}
    for key, value in options.items():
        if key not in by_key:
            raise ValueError(f"{key}: not an option of {desc['name']} (its options: "
                             f"{sorted(by_key)})")
        if value is not None:
            setattr(problem, by_key[key]["field"], _option_value(by_key[key], value))


class TableInputs:
    """The problem of any op of the table over NumPy arrays (by the table's input names; None
    or missing: absent), from its description alone: the inputs object of the generic front
    end (_opspec.generic), as ops.KdaInputs is KDA's. problem and shapes as the library sees
    them; the arrays are kept alive with it."""

    def __init__(self, op, arrays, cu_seqlens=None, sizes=None, options=None):
        given = {n: a for n, a in arrays.items() if a is not None}
        self.op = op
        self.problem, self.shapes, self._kept = _problem(op, given, sizes, options or {},
                                                         cu_seqlens)


def forward_of(inputs, ex):
    """The forward over a TableInputs: its outputs in the table's order (None where absent)."""
    outs, ptrs = _outputs(inputs.op, inputs.shapes)
    _lib.check(_lib.lib.linseq_op_forward(inputs.op.encode(), ctypes.byref(inputs.problem),
                                          ctypes.byref(ex), ptrs))
    return outs


def backward_of(inputs, ex, upstream, wanted=None):
    """The backward over a TableInputs: upstream {name: array or None}; {gradient name: array}
    for the gradients in `wanted` (None: all) that exist under the problem."""
    op = inputs.op
    ups = _lib.op_tensors(op, "upstream")
    unknown = set(upstream) - {t["name"] for t in ups}
    if unknown:
        raise ValueError(f"upstream: {op} takes {[t['name'] for t in ups]}, got {sorted(unknown)}")
    up_arrays = [None if upstream.get(t["name"]) is None
                 else as_f32(upstream[t["name"]], t["name"]) for t in ups]
    up_ptrs = (ctypes.c_void_p * max(len(ups), 1))(*[pointer(a) for a in up_arrays])
    grads = _lib.grads_class(op)()
    out = {}
    for t in _lib.op_tensors(op, "grad"):
        if inputs.shapes[t["name"]] is not None and (wanted is None or t["name"] in wanted):
            out[t["name"]] = np.empty(inputs.shapes[t["name"]], np.float32)
            setattr(grads, t["field"], pointer(out[t["name"]]))
    _lib.check(_lib.lib.linseq_op_backward(op.encode(), ctypes.byref(inputs.problem),
                                           ctypes.byref(ex), up_ptrs, ctypes.byref(grads)))
    del up_arrays
    return out


def _outputs(op, shapes, skip=None):
    outs = [None if t["name"] == skip or shapes[t["name"]] is None
            else np.empty(shapes[t["name"]], np.float32)
            for t in _lib.op_tensors(op, "output")]
    return outs, (ctypes.c_void_p * max(len(outs), 1))(*[pointer(a) for a in outs])


def run(op, arrays, sizes=None, *, cu_seqlens=None, threads=0, **options):
    """The forward of op (its table name) on float32 arrays: a tuple of its outputs in the
    table's order (None for one that does not exist with these options). cu_seqlens: packed
    sequences in one row (B = 1), where the table gives the op "varlen"."""
    inputs = TableInputs(op, arrays, cu_seqlens, sizes, options)
    return tuple(forward_of(inputs, make_exec(mode="default", threads=threads)))


def decode(op, arrays, state, state_rows=None, sizes=None, *, threads=0, **options):
    """One token per request (T = 1) of op over a pool of states, updated in place: `state`
    is a C-contiguous float32 array whose rows are the requests' states, `state_rows` [B] the
    row of each request (negative: a padding request), None: row b. Returns the outputs but
    the state's, in the table's order."""
    desc = _lib.op_desc(op)
    if not desc.get("decode"):
        raise ValueError(f"{op}: the library's table gives it no decode step")
    check_pool(state, "state")
    if not (isinstance(state, np.ndarray) and state.dtype == np.float32 and
            state.flags.c_contiguous and state.ndim >= 1):
        raise ValueError("state: expected a C-contiguous float32 array of rows")
    problem, shapes, kept = _problem(op, arrays, sizes, options)
    rows = None if state_rows is None else as_row_indices(state_rows, problem.B, "state_rows")
    want = shapes[desc["decode"]["state"]]
    if want is not None and tuple(state.shape[1:]) != want[1:]:
        raise ValueError(f"state: expected rows of shape {list(want[1:])}, got "
                         f"{list(state.shape[1:])}")
    outs, ptrs = _outputs(op, shapes, skip=desc["decode"]["state_out"])
    ex = make_exec(mode="default", threads=threads)
    _lib.check(_lib.lib.linseq_op_decode(op.encode(), ctypes.byref(problem), ctypes.byref(ex),
                                         pointer(state), state.shape[0],
                                         pointer(rows), ptrs))
    del kept
    return tuple(o for o, t in zip(outs, _lib.op_tensors(op, "output"))
                 if t["name"] != desc["decode"]["state_out"])


_POOL_DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}


def _pool_rows(rows, name, B):
    """An int32 or int64 index array [B] kept as given (the library reads either), or None."""
    if rows is None:
        return None, 0
    arr = np.ascontiguousarray(rows)
    if arr.dtype not in (np.int32, np.int64) or arr.shape != (B,):
        raise ValueError(f"{name}: expected an int32 or int64 array of shape [B] = [{B}], got "
                         f"{arr.dtype} {list(arr.shape)}")
    return arr, arr.dtype.itemsize * 8


def _pool_row_stride(pool):
    """The row stride, in elements, of a writable NumPy pool whose layout the library's rule
    takes (linseq_state_pool_row_stride: each row C-contiguous, rows at least a row apart);
    a ValueError naming what is wrong otherwise."""
    if not pool.flags.writeable:
        raise ValueError("pool: expected a writable array (the steps write its rows)")
    if any(s % pool.itemsize for s in pool.strides):
        raise ValueError(f"pool: strides {list(pool.strides)} bytes; expected whole "
                         f"elements of {pool.itemsize} bytes")
    row_stride = _lib.state_pool_row_stride(pool.shape,
                                            [s // pool.itemsize for s in pool.strides])
    if row_stride is None:
        raise ValueError(f"pool: {_lib.lib.linseq_last_error().decode()}")
    return row_stride


def _pool_spec(pool, row_shape, count, src_rows, dst_rows, pad_value):
    """The linseq_state_pool over a NumPy pool [R, *row_shape] for `count` requests or
    sequences, and the index arrays it points at (kept alive by the caller)."""
    if not isinstance(pool, np.ndarray) or pool.dtype.name not in _POOL_DTYPES:
        raise TypeError(f"pool: expected a NumPy array of float32, float16 or bfloat16, got "
                        f"{type(pool).__name__} {getattr(pool, 'dtype', '')}")
    if pool.ndim < 1 or tuple(pool.shape[1:]) != tuple(row_shape):
        raise ValueError(f"pool: expected rows of shape {list(row_shape)}, got "
                         f"{list(pool.shape[1:])}")
    row_stride = _pool_row_stride(pool)
    src, src_bits = _pool_rows(src_rows, "src_rows", count)
    dst, dst_bits = _pool_rows(dst_rows, "dst_rows", count)
    if src is not None and dst is not None and src_bits != dst_bits:
        raise ValueError("src_rows, dst_rows: expected the same integer type")
    spec = _lib.StatePool(data=pool.ctypes.data, n_rows=pool.shape[0],
                          row_stride=row_stride,
                          dtype=_POOL_DTYPES[pool.dtype.name], src_rows=pointer(src),
                          dst_rows=pointer(dst), index_bits=src_bits or dst_bits or 64,
                          has_pad_value=pad_value is not None,
                          pad_value=0 if pad_value is None else int(pad_value))
    return spec, (src, dst)


def _pool_op(op):
    desc = _lib.op_desc(op)
    if not desc.get("decode"):
        raise ValueError(f"{op}: the library's table gives it no decode step (and no state pool)")
    return desc["decode"]


def _without_state(op, outs, state_out):
    return tuple(o for o, t in zip(outs, _lib.op_tensors(op, "output")) if t["name"] != state_out)


def decode_pool(op, arrays, pool, src_rows=None, dst_rows=None, sizes=None, *, pad_value=None,
                threads=0, **options):
    """One token per request of op over a serving engine's pool (linseq_op_decode_pool):
    `pool` [R, *state] a NumPy array of float32, float16 or bfloat16 (ml_dtypes) whose rows
    may lie any stride apart (a view of larger pages) but are each C-contiguous; src_rows
    and dst_rows [B] int32 or int64 (dst None: in place); pad_value marks padding besides
    negative rows. Writes the new states into the pool's rows; returns the other outputs."""
    roles = _pool_op(op)
    problem, shapes, kept = _problem(op, arrays, sizes, options)
    spec, rows = _pool_spec(pool, shapes[roles["state"]][1:], problem.B, src_rows, dst_rows,
                            pad_value)
    outs, ptrs = _outputs(op, shapes, skip=roles["state_out"])
    ex = make_exec(mode="default", threads=threads)
    _lib.check(_lib.lib.linseq_op_decode_pool(op.encode(), ctypes.byref(problem),
                                              ctypes.byref(ex), ctypes.byref(spec), ptrs))
    del kept, rows
    return _without_state(op, outs, roles["state_out"])


def decode_tokens_pool(op, arrays, pool, src_rows=None, dst_rows=None, sizes=None, *,
                       pad_value=None, threads=0, **options):
    """T tokens per request of op over a serving engine's pool, as T decode steps
    (linseq_op_decode_tokens_pool; speculative decoding): arrays hold [B,T,...] per-token
    inputs; request b starts from row src_rows[b] and the state after its token t goes to row
    dst_rows[b, t] (dst_rows [B,T]; None: only the last token's state, to the source row).
    Pool and rows as decode_pool's. Returns the [B,T,...] outputs but the state."""
    roles = _pool_op(op)
    problem, shapes, kept = _problem(op, arrays, sizes, options)
    dst = None if dst_rows is None else np.ascontiguousarray(dst_rows).reshape(-1)
    count = getattr(problem, "T", 1)
    if dst is not None and dst.shape != (problem.B * count,):
        raise ValueError(f"dst_rows: expected [B,T] = [{problem.B},{count}] row indices, got "
                         f"{list(np.shape(dst_rows))}")
    spec, rows = _pool_spec(pool, shapes[roles["state"]][1:], problem.B, src_rows, None,
                            pad_value)
    dst, dst_bits = _pool_rows(dst, "dst_rows", problem.B * count)
    if dst is not None:
        if src_rows is not None and dst_bits != spec.index_bits:
            raise ValueError("src_rows, dst_rows: expected the same integer type")
        spec.dst_rows, spec.index_bits = pointer(dst), dst_bits
    outs, ptrs = _outputs(op, shapes, skip=roles["state_out"])
    ex = make_exec(mode="default", threads=threads)
    _lib.check(_lib.lib.linseq_op_decode_tokens_pool(op.encode(), ctypes.byref(problem),
                                                     ctypes.byref(ex), ctypes.byref(spec),
                                                     ptrs))
    del kept, rows, dst
    return _without_state(op, outs, roles["state_out"])


def _prefill_pool(op, arrays, pool, src_rows, dst_rows, has_initial_state, sizes, cu_seqlens,
                  pad_value, options):
    """What forward_pool and forward_pool_blocks share: the problem, the pool's spec, the
    has_initial_state array and the outputs, and what must stay alive through the call."""
    roles = _pool_op(op)
    given = {n: a for n, a in arrays.items() if a is not None}
    problem, shapes, kept = _problem(op, given, sizes, options, cu_seqlens)
    state_shape = shapes[roles["state"]]
    spec, rows = _pool_spec(pool, state_shape[1:], state_shape[0], src_rows, dst_rows,
                            pad_value)
    has = None
    if has_initial_state is not None:
        has = np.ascontiguousarray(has_initial_state, dtype=np.bool_)
        if has.shape != (state_shape[0],):
            raise ValueError(f"has_initial_state: expected [N] = [{state_shape[0]}] booleans, "
                             f"got shape {list(has.shape)}")
    outs, ptrs = _outputs(op, shapes, skip=roles["state_out"])
    return roles, problem, spec, has, outs, ptrs, (kept, rows), state_shape[0]


def forward_pool(op, arrays, pool, src_rows=None, dst_rows=None, has_initial_state=None,
                 sizes=None, *, cu_seqlens=None, pad_value=None, threads=0, **options):
    """A prefill of op whose sequences start from and end in a serving engine's pool
    (linseq_op_forward_pool): sequence s starts from row src_rows[s] where
    has_initial_state[s] (None: everywhere), from zeros otherwise, and its final state goes
    to row dst_rows[s] (None: its source row). Pool and rows as decode_pool's. Returns the
    outputs but the final state."""
    roles, problem, spec, has, outs, ptrs, alive, _ = _prefill_pool(
        op, arrays, pool, src_rows, dst_rows, has_initial_state, sizes, cu_seqlens, pad_value,
        options)
    ex = make_exec(mode="default", threads=threads)
    _lib.check(_lib.lib.linseq_op_forward_pool(op.encode(), ctypes.byref(problem),
                                               ctypes.byref(ex), ctypes.byref(spec),
                                               pointer(has), ptrs))
    del alive
    return _without_state(op, outs, roles["state_out"])


def forward_pool_blocks(op, arrays, pool, block_rows, block_size, src_rows=None, dst_rows=None,
                        has_initial_state=None, computed_tokens=None, sizes=None, *,
                        cu_seqlens=None, pad_value=None, threads=0, mode="default", **options):
    """forward_pool that also keeps the state at each block boundary of each sequence
    (linseq_op_forward_pool_blocks; prefix caching): with sequence s's first token at
    position computed_tokens[s] (None: 0) of its prompt, the state after each boundary
    P = (j + 1) * block_size strictly inside its tokens goes to row block_rows[s, j]
    (block_rows [N, max_blocks], negative or pad_value: not kept), the final state to
    dst_rows[s]. block_rows, computed_tokens, src_rows and dst_rows share one integer type
    (int32 or int64). Returns the outputs but the final state."""
    blocks = np.ascontiguousarray(block_rows)
    if blocks.dtype not in (np.int32, np.int64) or blocks.ndim != 2:
        raise ValueError(f"block_rows: expected an int32 or int64 array [N, max_blocks], got "
                         f"{blocks.dtype} {list(blocks.shape)}")
    roles, problem, spec, has, outs, ptrs, alive, n = _prefill_pool(
        op, arrays, pool, src_rows, dst_rows, has_initial_state, sizes, cu_seqlens, pad_value,
        options)
    rows_given = src_rows is not None or dst_rows is not None
    if blocks.shape[0] != n or (rows_given and blocks.dtype.itemsize * 8 != spec.index_bits):
        raise ValueError(f"block_rows: expected [N = {n}, max_blocks] of the rows' integer "
                         f"type, got {blocks.dtype} {list(blocks.shape)}")
    spec.index_bits = blocks.dtype.itemsize * 8
    computed = None
    if computed_tokens is not None:
        computed = np.ascontiguousarray(computed_tokens, dtype=blocks.dtype)
        if computed.shape != (blocks.shape[0],):
            raise ValueError(f"computed_tokens: expected [N] = [{blocks.shape[0]}], got shape "
                             f"{list(computed.shape)}")
    ex = make_exec(mode=mode, threads=threads)
    _lib.check(_lib.lib.linseq_op_forward_pool_blocks(
        op.encode(), ctypes.byref(problem), ctypes.byref(ex), ctypes.byref(spec), pointer(has),
        int(block_size), pointer(blocks), blocks.shape[1], pointer(computed), ptrs))
    del alive, blocks, computed
    return _without_state(op, outs, roles["state_out"])


def backward(op, arrays, upstream, sizes=None, *, cu_seqlens=None, threads=0, **options):
    """The backward of op on float32 arrays: `upstream` maps its upstream tensors' names
    (d_y, ...) to arrays (absent: NULL); returns {gradient name: array} for every gradient
    the table gives it under this problem."""
    if not _lib.has_backward(_lib.op_desc(op)):
        raise ValueError(f"{op}: the library's table gives it no backward")
    inputs = TableInputs(op, arrays, cu_seqlens, sizes, options)
    return backward_of(inputs, make_exec(mode="default", threads=threads), upstream)
