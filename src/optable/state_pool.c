/* The state pools of serving engines (linseq_state_pool) for every op with a decode step,
 * from its description alone: a decode step over the pool, and a prefill (forward) whose
 * sequences start from and end in pool rows.
 *
 * The problem's sizes and inputs are checked first, as the op checks them, so that nothing
 * here is sized by a size the op would refuse (negative, or overflowing its tensors). The
 * indices are read into int64 rows (padding: -1) and checked, all before any write. A pool
 * the op's own decode takes as it is (float32, contiguous rows, each request writing the row
 * it reads) goes to it directly and is updated in place. Any other decode pool goes to the
 * op's decode_rows where it has one and no request writes a row another request reads: each
 * request's state is then read from its row and written to its destination where they lie
 * (strided, bf16 or half), once each, after the op's checks. Every other pool, and every
 * prefill, is gathered: the source rows, widened to float32, into a contiguous block the op
 * runs in place; only when it succeeds is each new state written to its destination row,
 * rounded once to the pool's type. So every source row is read before any row is written,
 * and a refusal by the op itself (a positive log decay, say) leaves the pool untouched too. */
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/status.h"
#include "optable/check.h"
#include "optable/state_pool.h"

linseq_status linseq_state_pool_row_stride(int n_dims, const int64_t *sizes, const int64_t *strides,
                                           int64_t *row_stride)
{
    static const char fn[] = "linseq_state_pool_row_stride";
    ls_clear_error();
    if (!sizes || !strides || !row_stride)
        return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "'%s' is NULL",
                       !sizes     ? "sizes"
                       : !strides ? "strides"
                                  : "row_stride");
    if (n_dims < 1)
        return ls_fail(fn, LINSEQ_ERR_INVALID_SIZE, "n_dims = %d; expected >= 1 (the rows)",
                       n_dims);
    int64_t row = 1; /* the elements of one row, from its last dimension */
    for (int i = n_dims - 1; i >= 0; i--) {
        if (sizes[i] < 1)
            return ls_fail(fn, LINSEQ_ERR_INVALID_SIZE, "sizes[%d] = %lld; expected >= 1", i,
                           (long long)sizes[i]);
        if (i == 0) break;
        if (sizes[i] != 1 && strides[i] != row)
            return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                           "strides[%d] = %lld; expected %lld (each row C-contiguous)", i,
                           (long long)strides[i], (long long)row);
        if (!ls_mul_ok(&row, 2, row, sizes[i]))
            return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW, "a row of the pool overflows int64");
    }
    const int64_t stride = sizes[0] > 1 ? strides[0] : row;
    if (stride < row)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "strides[0] = %lld; expected >= %lld, a row's elements (rows apart)",
                       (long long)strides[0], (long long)row);
    *row_stride = stride;
    return LINSEQ_OK;
}

/* Elements of one request's state: the decode state's shape without its first (row) dim. */
int64_t ls_pool_state_elements(const ls_op *op, const void *p)
{
    const ls_tensor_desc *t = ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state);
    int64_t d[LS_OP_MAX_DIMS], n = 1;
    const int nd = t->shape(p, d);
    for (int i = 1; i < nd; i++) n = ls_mul_sat(n, d[i]);
    return n;
}

linseq_status ls_pool_check(const char *fn, const linseq_state_pool *pool, int64_t row,
                            const linseq_exec *exec)
{
    if (!pool) return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "argument 'pool' is NULL");
    if (ls_on_cuda(exec))
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED, "exec->device is CUDA; %s runs on the CPU only",
                       fn);
    if (!pool->data) return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "'pool->data' is NULL");
    if (pool->dtype != LINSEQ_POOL_F32 && pool->dtype != LINSEQ_POOL_BF16 &&
        pool->dtype != LINSEQ_POOL_F16)
        return ls_fail(fn, LINSEQ_ERR_INVALID_ENUM,
                       "pool->dtype = %d; expected LINSEQ_POOL_F32, _BF16 or _F16",
                       (int)pool->dtype);
    if (pool->index_bits != 0 && pool->index_bits != 32 && pool->index_bits != 64)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "pool->index_bits = %d; expected 32 or 64 (0: 64)", pool->index_bits);
    if (pool->n_rows < 1)
        return ls_fail(fn, LINSEQ_ERR_INVALID_SIZE, "pool->n_rows = %lld; expected >= 1",
                       (long long)pool->n_rows);
    const int64_t stride = pool->row_stride ? pool->row_stride : row;
    if (stride < row)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "pool->row_stride = %lld; expected >= %lld, the elements of one state "
                       "(or 0 for that)",
                       (long long)pool->row_stride, (long long)row);
    int64_t span; /* the last row's end: saturated, as the sum may overflow too */
    if (__builtin_add_overflow(ls_mul_sat(pool->n_rows - 1, stride), row, &span)) span = INT64_MAX;
    span = ls_mul_sat(span, (int64_t)ls_state_elem_bytes(pool->dtype));
    if (span >= INT64_MAX / 2)
        return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW,
                       "pool: %lld rows %lld elements apart overflow the address range",
                       (long long)pool->n_rows, (long long)stride);
    if ((uintptr_t)pool->data % ls_state_elem_bytes(pool->dtype))
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE, "'pool->data' is not aligned to its elements");
    return LINSEQ_OK;
}

linseq_status ls_pool_check_index_count(const char *fn, const char *what, int64_t n, int per)
{
    if (n <= (int64_t)(PTRDIFF_MAX / ((size_t)per * sizeof(int64_t)))) return LINSEQ_OK;
    return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW,
                   "%s = %lld: the pool's indices overflow the address range", what, (long long)n);
}

/* The outputs' element counts: the pool paths size their index and state blocks from B
 * and the state's elements before the op's own checks of the outputs run, so an output whose
 * size overflows must be refused first. The bound leaves room for the float32 copy of the
 * states that a gathered call holds beside the output. */
static linseq_status check_output_counts(const char *fn, const ls_op *op, const void *p)
{
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        int64_t count;
        if (t->role != LS_ROLE_OUTPUT) continue;
        if (!ls_tensor_count(t, p, &count) || count > (int64_t)(PTRDIFF_MAX / 8))
            return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW,
                           "output '%s': the product of its sizes overflows the address range",
                           t->name);
    }
    return LINSEQ_OK;
}

linseq_status ls_pool_check_problem(const char *fn, const ls_op *op, const void *p,
                                    const linseq_exec *exec)
{
    linseq_status st = ls_op_check_problem(fn, op, p, exec, true);
    ls_args a = {.fn = fn};
    if (!st) st = ls_op_add_tensors(&a, op, p, LS_ROLE_INPUT, p, ls_token_bytes(exec));
    if (!st) st = ls_args_validate(&a);
    return st ? st : check_output_counts(fn, op, p);
}

int64_t ls_pool_index_at(const linseq_state_pool *pool, const void *rows, int64_t b)
{
    if (pool->index_bits == 32) return ((const int32_t *)rows)[b];
    return ((const int64_t *)rows)[b];
}

linseq_status ls_pool_read_rows(const char *fn, const linseq_state_pool *pool, int64_t B,
                                int64_t *src, int64_t *dst)
{
    for (int64_t b = 0; b < B; b++) {
        const int64_t s = pool->src_rows ? ls_pool_index_at(pool, pool->src_rows, b) : b;
        const bool pad = s < 0 || (pool->has_pad_value && s == pool->pad_value);
        src[b] = pad ? -1 : s;
        dst[b] = pad ? -1 : pool->dst_rows ? ls_pool_index_at(pool, pool->dst_rows, b) : s;
        if (pad) continue;
        if (s >= pool->n_rows)
            return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                           "pool->src_rows[%lld] = %lld; expected a row in [0, %lld), a negative "
                           "index or the pad value (padding); nothing was written",
                           (long long)b, (long long)s, (long long)pool->n_rows);
        if (dst[b] < 0 || dst[b] >= pool->n_rows)
            return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                           "pool->dst_rows[%lld] = %lld; expected a row in [0, %lld) for a request "
                           "that is not padding; nothing was written",
                           (long long)b, (long long)dst[b], (long long)pool->n_rows);
    }
    return LINSEQ_OK;
}

static int compare_i64(const void *x, const void *y)
{
    const int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* Two live requests writing one row: found in a sorted copy, reported with both requests. */
linseq_status ls_pool_check_distinct(const char *fn, const int64_t *dst, int64_t n, int64_t tokens,
                                     int64_t *work)
{
    memcpy(work, dst, (size_t)n * sizeof *work);
    qsort(work, (size_t)n, sizeof *work, compare_i64);
    for (int64_t i = 1; i < n; i++) {
        if (work[i] < 0 || work[i] != work[i - 1]) continue;
        int64_t first = -1, second = -1;
        for (int64_t k = 0; k < n && second < 0; k++) {
            if (dst[k] != work[i]) continue;
            if (first < 0)
                first = k;
            else
                second = k;
        }
        if (tokens > 1)
            return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                           "request %lld token %lld and request %lld token %lld both write pool "
                           "row %lld; each row may be written once in a call; nothing was written",
                           (long long)(first / tokens), (long long)(first % tokens),
                           (long long)(second / tokens), (long long)(second % tokens),
                           (long long)work[i]);
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "requests %lld and %lld both write pool row %lld; each row may be written "
                       "by one request of a call; nothing was written",
                       (long long)first, (long long)second, (long long)work[i]);
    }
    return LINSEQ_OK;
}

/* The sequences (or requests) of problem p: the rows of its state tensor. */
static int64_t state_count(const ls_op *op, const void *p)
{
    const ls_tensor_desc *t = ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state);
    int64_t d[LS_OP_MAX_DIMS];
    return t->shape(p, d) ? d[0] : 0;
}

void *ls_pool_row(const linseq_state_pool *pool, int64_t r, int64_t stride)
{
    return (unsigned char *)pool->data + (size_t)(r * stride) * ls_state_elem_bytes(pool->dtype);
}

/* True when no live request writes a row another request reads (src sorted into work, B
 * int64): then each request can be advanced on its own (ls_op.decode_rows), and "every
 * source row is read before any row is written" holds without a copy of the rows. */
static bool writes_only_own_rows(const int64_t *src, const int64_t *dst, int64_t B, int64_t *work)
{
    memcpy(work, src, (size_t)B * sizeof *work);
    qsort(work, (size_t)B, sizeof *work, compare_i64);
    for (int64_t b = 0; b < B; b++) {
        if (src[b] < 0) continue;
        int64_t lo = 0, hi = B; /* the first entry >= dst[b] */
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (work[mid] < dst[b])
                lo = mid + 1;
            else
                hi = mid;
        }
        int64_t readers = 0;
        for (int64_t i = lo; i < B && work[i] == dst[b] && readers < 2; i++) readers++;
        if (readers > 1 || (readers == 1 && src[b] != dst[b])) return false;
    }
    return true;
}

/* The gathered form: live request b decodes row slot[b] of a float32 block; its new state
 * goes to its destination row only after the whole step succeeded. */
static linseq_status decode_gathered(const char *fn, const ls_op *op, const void *p,
                                     const linseq_exec *exec, const linseq_state_pool *pool,
                                     int64_t B, int64_t row, const int64_t *src, const int64_t *dst,
                                     int64_t *slot, float *const *out)
{
    const int64_t stride = pool->row_stride ? pool->row_stride : row;
    int64_t live = 0;
    for (int64_t b = 0; b < B; b++) slot[b] = src[b] < 0 ? -1 : live++;
    const int64_t block_rows = live ? live : 1;
    if (ls_mul_sat(block_rows, row) > (int64_t)(SIZE_MAX / 2 / sizeof(float)))
        return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW, "pool: %lld states of %lld elements",
                       (long long)live, (long long)row);
    float *block = malloc((size_t)(block_rows * row) * sizeof *block);
    if (!block)
        return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY,
                       "pool: could not allocate %lld float32 states of %lld elements",
                       (long long)block_rows, (long long)row);
    memset(block, 0, (size_t)row * sizeof *block); /* a block of padding only is still defined */
    for (int64_t b = 0; b < B; b++)
        if (slot[b] >= 0)
            ls_state_widen(pool->dtype, ls_pool_row(pool, src[b], stride), block + slot[b] * row,
                           row);
    const linseq_status st = op->decode(p, exec, block, block_rows, slot, out);
    if (!st)
        for (int64_t b = 0; b < B; b++)
            if (slot[b] >= 0)
                ls_state_narrow(pool->dtype, block + slot[b] * row,
                                ls_pool_row(pool, dst[b], stride), row);
    free(block);
    return st;
}

linseq_status ls_op_decode_pool(const char *fn, const ls_op *op, const void *p,
                                const linseq_exec *exec, const linseq_state_pool *pool,
                                float *const *out)
{
    if (!p) return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "argument 'problem' is NULL");
    linseq_status st = ls_pool_check_problem(fn, op, p, exec);
    if (st) return st;
    const int64_t B = ls_op_size_named(op, p, "B"), row = ls_pool_state_elements(op, p);
    if ((st = ls_pool_check(fn, pool, row, exec))) return st;
    if (B < 1) return op->decode(p, exec, pool->data, pool->n_rows, NULL, out); /* its refusal */
    if ((st = ls_pool_check_index_count(fn, "B", B, 4))) return st;
    int64_t *rows = malloc((size_t)(4 * B) * sizeof *rows);
    if (!rows)
        return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "pool: could not allocate %lld indices",
                       (long long)(4 * B));
    int64_t *src = rows, *dst = rows + B, *work = rows + 2 * B;
    if (!(st = ls_pool_read_rows(fn, pool, B, src, dst)) &&
        !(st = ls_pool_check_distinct(fn, dst, B, 1, work))) {
        bool in_place =
            pool->dtype == LINSEQ_POOL_F32 && (!pool->row_stride || pool->row_stride == row);
        for (int64_t b = 0; b < B && in_place; b++) in_place = dst[b] == src[b];
        const ls_state_rows by_row = {.from = pool->data,
                                      .to = pool->data,
                                      .dtype = pool->dtype,
                                      .stride = pool->row_stride ? pool->row_stride : row,
                                      .src = src,
                                      .dst = dst};
        if (in_place)
            st = op->decode(p, exec, pool->data, pool->n_rows, src, out);
        else if (op->decode_rows &&
                 (!op->decode_rows_takes || op->decode_rows_takes(p, pool->dtype)) &&
                 writes_only_own_rows(src, dst, B, work))
            st = op->decode_rows(p, exec, &by_row, pool->n_rows, out);
        else
            st = decode_gathered(fn, op, p, exec, pool, B, row, src, dst, work, out);
    }
    free(rows);
    return st;
}

linseq_status ls_pool_gather_initial(const char *fn, const linseq_state_pool *pool, int64_t n,
                                     int64_t row, const int64_t *src, const bool *has_initial_state,
                                     float **block)
{
    const int64_t stride = pool->row_stride ? pool->row_stride : row;
    if (ls_mul_sat(n, row) > (int64_t)(SIZE_MAX / 2 / sizeof(float)))
        return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW, "pool: %lld states of %lld elements",
                       (long long)n, (long long)row);
    *block = calloc((size_t)(n * row), sizeof **block);
    if (!*block)
        return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "pool: could not allocate %lld states",
                       (long long)n);
    for (int64_t s = 0; s < n; s++)
        if (src[s] >= 0 && (!has_initial_state || has_initial_state[s]))
            ls_state_widen(pool->dtype, ls_pool_row(pool, src[s], stride), *block + s * row, row);
    return LINSEQ_OK;
}

linseq_status ls_pool_forward_from(const char *fn, const ls_op *op, const void *p,
                                   const linseq_exec *exec, float *const *out, float *block)
{
    void *problem = malloc(op->problem_size);
    if (!problem) return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "could not copy the problem");
    memcpy(problem, p, op->problem_size);
    ls_tensor_set(ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state), problem, block);
    float *outputs[LS_OP_MAX_OUT] = {0};
    for (int i = 0; ls_op_tensor(op, LS_ROLE_OUTPUT, i); i++) outputs[i] = out[i];
    /* the final states replace the initial ones in place */
    outputs[ls_op_tensor_named(op, LS_ROLE_OUTPUT, op->decode_state_out)->offset] = block;
    const linseq_status st = op->forward(problem, exec, outputs);
    free(problem);
    return st;
}

linseq_status ls_pool_check_prefill(const char *fn, const ls_op *op, const void *p,
                                    const linseq_exec *exec, const linseq_state_pool *pool,
                                    int64_t *row)
{
    if (!p) return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "argument 'problem' is NULL");
    const ls_tensor_desc *h0 = ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state);
    if (ls_tensor_get(h0, p))
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "problem->%s must be NULL: the sequences start from the pool's rows",
                       h0->field);
    linseq_status st = ls_pool_check_problem(fn, op, p, exec);
    if (st) return st;
    *row = ls_pool_state_elements(op, p);
    return ls_pool_check(fn, pool, *row, exec);
}

linseq_status ls_op_forward_pool(const char *fn, const ls_op *op, const void *p,
                                 const linseq_exec *exec, const linseq_state_pool *pool,
                                 const bool *has_initial_state, float *const *out)
{
    int64_t row;
    linseq_status st = ls_pool_check_prefill(fn, op, p, exec, pool, &row);
    if (st) return st;
    const int64_t n = state_count(op, p);
    if (n < 1) return op->forward(p, exec, out); /* its own refusal of the sizes */
    if ((st = ls_pool_check_index_count(fn, "sequences", n, 3))) return st;
    int64_t *rows = malloc((size_t)(3 * n) * sizeof *rows);
    if (!rows)
        return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "pool: could not allocate %lld indices",
                       (long long)(3 * n));
    int64_t *src = rows, *dst = rows + n, *work = rows + 2 * n;
    float *block = NULL;
    if (!(st = ls_pool_read_rows(fn, pool, n, src, dst)) &&
        !(st = ls_pool_check_distinct(fn, dst, n, 1, work)) &&
        !(st = ls_pool_gather_initial(fn, pool, n, row, src, has_initial_state, &block)) &&
        !(st = ls_pool_forward_from(fn, op, p, exec, out, block))) {
        const int64_t stride = pool->row_stride ? pool->row_stride : row;
        for (int64_t s = 0; s < n; s++)
            if (src[s] >= 0)
                ls_state_narrow(pool->dtype, block + s * row, ls_pool_row(pool, dst[s], stride),
                                row);
    }
    free(block);
    free(rows);
    return st;
}
