"""vmap rules of linseq's custom calls: the mapped axis folded into the kernels' batch axis.

A kernel already runs many sequences in one call (its batch B). Under jax.vmap with M mapped
elements, an op whose mapped arrays all carry the batch axis first runs once over M*B
sequences: the mapped axis is folded into B ([M,B,...] -> [M*B,...], an unmapped per-sequence
array broadcast), and the results unfolded. That is exact: the sequences of a batch never mix.
It is refused, and the op runs once per element (jax.lax.map), when a shared parameter (A_log,
dt_bias, A, D, weight, bias) or a float option is mapped, with cu_seqlens (the batch is one
packed row), and in a backward with any shared parameter (vmap wants its gradient per element,
the kernel sums it over the batch). Decode folds the pool too: element m's row r becomes row
m*R + r of one pool of M*R rows.
"""

import jax
import jax.numpy as jnp

from . import _lib, _opspec

# An operand's role: "batch" (the batch axis first), "param" (shared by the batch), "option"
# (a float scalar), "offsets" (cu_seqlens), "proj" (SSM1's B or C: "param" given as [D,N],
# else "batch"), "pool" and "rows" (decode).


def roles(spec, present, has_cu, floats):
    """The roles of a forward's operands (a backward's upstream gradients follow: "batch")."""
    out = []
    for name in present:
        dims = next(t["dims"] for t in _table(spec)["tensors"] if t["name"] == name)
        if spec is _opspec.SSM1 and name in ("B", "C"):
            out.append("proj")
        else:
            out.append("batch" if dims.startswith(("[B,", "[N,", "[N_seq,")) else "param")
    return out + ["offsets"] * has_cu + ["option"] * len(floats)


def decode_roles(names, has_rows, floats):
    return (roles(_opspec.KDA, names, False, ()) + ["pool"] + ["rows"] * has_rows
            + ["option"] * len(floats))


def _table(spec):
    return _lib.op_desc(spec.table)


def _resolve(role, operand, batched):
    if role == "proj":
        return "param" if operand.ndim - batched == 2 else "batch"
    return role


def _fold(operand, batched, size):
    """[M,B,...] (broadcast first when not mapped) -> [M*B,...]."""
    if not batched:
        operand = jnp.broadcast_to(operand, (size,) + operand.shape)
    return operand.reshape((size * operand.shape[1],) + operand.shape[2:])


def _unfold(result, size):
    return result.reshape((size, result.shape[0] // size) + result.shape[1:])


def _one_by_one(fn, in_batched, operands):
    """fn once per mapped element (jax.lax.map), the unmapped operands shared."""
    mapped = [a for a, b in zip(operands, in_batched) if b]

    def one(elements):
        it = iter(elements)
        return fn(*(next(it) if b else a for a, b in zip(operands, in_batched)))

    results = jax.lax.map(one, mapped)
    return tuple(results), (True,) * len(results)


def folding(fn, operand_roles, fold_parameters):
    """fn(*operands) -> tuple of per-sequence results, with the vmap rule above.
    fold_parameters: whether shared parameters may be present when folding (a forward), or
    not (a backward, whose parameter gradients are wanted per element)."""
    batched_fn = jax.custom_batching.custom_vmap(fn)

    @batched_fn.def_vmap
    def rule(axis_size, in_batched, *operands):
        tags = [_resolve(operand_roles[i] if i < len(operand_roles) else "batch", a, b)
                for i, (a, b) in enumerate(zip(operands, in_batched))]
        foldable = (all(t == "batch" for t, b in zip(tags, in_batched) if b)
                    and "offsets" not in tags and (fold_parameters or "param" not in tags))
        if not foldable:
            return _one_by_one(batched_fn, in_batched, operands)
        folded = [_fold(a, b, axis_size) if t == "batch" else a
                  for a, b, t in zip(operands, in_batched, tags)]
        results = batched_fn(*folded)
        return tuple(_unfold(r, axis_size) for r in results), (True,) * len(results)

    return batched_fn


def folding_decode(decode, operand_roles, with_rows):
    """decode(arrays..., pool, [rows], options...) -> (o, new pool), with the vmap rule above;
    with_rows: the same decode taking rows (None when decode takes them itself)."""
    batched_fn = jax.custom_batching.custom_vmap(decode)
    at_pool = operand_roles.index("pool")

    @batched_fn.def_vmap
    def rule(axis_size, in_batched, *operands):
        if any(b and r in ("param", "option") for r, b in zip(operand_roles, in_batched)):
            return _one_by_one(batched_fn, in_batched, operands)
        size = axis_size
        q, pool = operands[0], operands[at_pool]
        n_requests = q.shape[1] if in_batched[0] else q.shape[0]
        if not in_batched[at_pool]:
            pool = jnp.broadcast_to(pool, (size,) + pool.shape)
        n_rows = pool.shape[1]
        first_row = (jnp.arange(size, dtype=jnp.int32) * n_rows)[:, None]
        if "rows" in operand_roles:
            at_rows = operand_roles.index("rows")
            rows = operands[at_rows]
            if not in_batched[at_rows]:
                rows = jnp.broadcast_to(rows, (size,) + rows.shape)
            rows = jnp.where(rows < 0, -1, rows.astype(jnp.int32) + first_row)
        else:
            rows = first_row + jnp.arange(n_requests, dtype=jnp.int32)[None, :]
        arrays = [_fold(a, b, size) if r == "batch" else a
                  for a, b, r in zip(operands[:at_pool], in_batched, operand_roles)]
        options = [a for a, r in zip(operands, operand_roles) if r == "option"]
        target = batched_fn if with_rows is None else with_rows
        o, new_pool = target(*arrays, pool.reshape((size * n_rows,) + pool.shape[2:]),
                             rows.reshape(-1), *options)
        return (_unfold(o, size), _unfold(new_pool, size)), (True, True)

    return batched_fn
