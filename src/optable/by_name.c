/* Every op's calls by the op's name (linseq_op_forward, _decode, _decode_pool,
 * _decode_tokens_pool, _forward_pool, _backward), for bindings that
 * drive every op from the table: what they add to the op's own entry points is the lookup and
 * the refusal of a call the op does not have. */
#include <string.h>

#include "core/status.h"
#include "optable/check.h"
#include "optable/optable.h"

/* The op of that name, or a failure naming fn and the name (nothing else is touched). */
static linseq_status find(const char *fn, const char *name, const ls_op **op)
{
    ls_clear_error();
    *op = name ? ls_op_find(name) : NULL;
    if (*op) return LINSEQ_OK;
    return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                   "op_name = '%.64s' names no op of the table (linseq_op_table_json)",
                   name ? name : "(null)");
}

static linseq_status no_call(const char *fn, const ls_op *op, const char *call)
{
    return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED, "op '%s' has no %s (linseq_op_table_json)", op->name,
                   call);
}

static linseq_status no_array(const char *fn, const char *what)
{
    return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "argument '%s' is NULL; expected an array", what);
}

linseq_status linseq_op_forward(const char *op_name, const void *problem, const linseq_exec *exec,
                                float *const *outputs)
{
    static const char fn[] = "linseq_op_forward";
    const ls_op *op;
    linseq_status st = find(fn, op_name, &op);
    if (st) return st;
    if (!outputs) return no_array(fn, "outputs");
    return op->forward(problem, exec, outputs);
}

linseq_status linseq_op_decode(const char *op_name, const void *problem, const linseq_exec *exec,
                               float *state, int64_t n_state_rows, const int64_t *state_rows,
                               float *const *outputs)
{
    static const char fn[] = "linseq_op_decode";
    const ls_op *op;
    linseq_status st = find(fn, op_name, &op);
    if (st) return st;
    if (!op->decode) return no_call(fn, op, "decode step");
    if (!outputs) return no_array(fn, "outputs");
    return op->decode(problem, exec, state, n_state_rows, state_rows, outputs);
}

linseq_status linseq_op_decode_pool(const char *op_name, const void *problem,
                                    const linseq_exec *exec, const linseq_state_pool *pool,
                                    float *const *outputs)
{
    static const char fn[] = "linseq_op_decode_pool";
    const ls_op *op;
    linseq_status st = find(fn, op_name, &op);
    if (st) return st;
    if (!op->decode) return no_call(fn, op, "decode step");
    if (!outputs) return no_array(fn, "outputs");
    return ls_op_decode_pool(fn, op, problem, exec, pool, outputs);
}

linseq_status linseq_op_decode_tokens_pool(const char *op_name, const void *problem,
                                           const linseq_exec *exec, const linseq_state_pool *pool,
                                           float *const *outputs)
{
    static const char fn[] = "linseq_op_decode_tokens_pool";
    const ls_op *op;
    linseq_status st = find(fn, op_name, &op);
    if (st) return st;
    if (!op->decode) return no_call(fn, op, "decode step");
    if (!outputs) return no_array(fn, "outputs");
    return ls_op_decode_tokens_pool(fn, op, problem, exec, pool, outputs);
}

linseq_status linseq_op_forward_pool(const char *op_name, const void *problem,
                                     const linseq_exec *exec, const linseq_state_pool *pool,
                                     const bool *has_initial_state, float *const *outputs)
{
    static const char fn[] = "linseq_op_forward_pool";
    const ls_op *op;
    linseq_status st = find(fn, op_name, &op);
    if (st) return st;
    if (!op->decode) return no_call(fn, op, "state pool (it has no decode step)");
    if (!outputs) return no_array(fn, "outputs");
    return ls_op_forward_pool(fn, op, problem, exec, pool, has_initial_state, outputs);
}

linseq_status linseq_op_backward(const char *op_name, const void *problem, const linseq_exec *exec,
                                 const float *const *upstream, const void *grads)
{
    static const char fn[] = "linseq_op_backward";
    const ls_op *op;
    linseq_status st = find(fn, op_name, &op);
    if (st) return st;
    if (!op->backward) return no_call(fn, op, "backward");
    if (!upstream) return no_array(fn, "upstream");
    return op->backward(problem, exec, upstream, grads);
}

linseq_status linseq_op_forward_pool_blocks(const char *op_name, const void *problem,
                                            const linseq_exec *exec, const linseq_state_pool *pool,
                                            const bool *has_initial_state, int64_t block_size,
                                            const void *block_rows, int64_t max_blocks,
                                            const void *computed_tokens, float *const *outputs)
{
    static const char fn[] = "linseq_op_forward_pool_blocks";
    const ls_op *op;
    linseq_status st = find(fn, op_name, &op);
    if (st) return st;
    if (!op->decode) return no_call(fn, op, "state pool (it has no decode step)");
    if (!outputs) return no_array(fn, "outputs");
    return ls_op_forward_pool_blocks(fn, op, problem, exec, pool, has_initial_state, block_size,
                                     block_rows, max_blocks, computed_tokens, outputs);
}
