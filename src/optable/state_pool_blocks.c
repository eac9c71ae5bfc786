/* A prefill over a serving engine's pool that also keeps the state at every block boundary
 * of each sequence (linseq_op_forward_pool_blocks): prefix caching, where a later request
 * that shares the first blocks of a prompt restarts from the state cached after them.
 *
 * Each sequence is cut at its block boundaries into pieces, and the op's own forward runs
 * piece by piece as a one-sequence problem whose tensors are the piece's tokens in the
 * caller's arrays (dense [B,T,...] or packed [1,T,...], so a piece is a pointer offset and
 * nothing is copied), each piece starting from the state the previous one ended in. The
 * state at a boundary is so bitwise the final state of a forward from the previous
 * boundary's state over that block. The states are kept in float32 and written to their
 * rows, each rounded once to the pool's type, only after every piece succeeded: a refusal at
 * any piece leaves every row as it was. Every index is checked before the first piece. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/status.h"
#include "core/validate.h"
#include "optable/check.h"
#include "optable/state_pool.h"

/* One state the call writes: the final state of a sequence, or its state at a boundary. */
typedef struct {
    int64_t row;   /* the pool row, -1: not written */
    int64_t seq;   /* the sequence */
    int64_t block; /* the table's column, -1: the final state */
    int64_t token; /* the boundary's token within the sequence's tokens of this call */
} pool_write;

/* The tokens of sequence s within the packed token axis: [*begin, *begin + *len). */
static void sequence_span(const ls_op *op, const void *p, int64_t s, int64_t *begin, int64_t *len)
{
    const int64_t *cu = op->varlen ? ls_op_cu_seqlens(op, p) : NULL;
    const int64_t T = ls_op_size_named(op, p, "T");
    *begin = cu ? cu[s] : s * T;
    *len = cu ? cu[s + 1] - cu[s] : T;
}

/* The layouts a piece can be cut from by a pointer offset: dense, token-major. */
static linseq_status check_layout(const char *fn, const ls_op *op, const void *p)
{
    for (int i = 0; i < op->n_strides; i++) {
        const linseq_strides *s = (const void *)((const char *)p + op->strides[i].offset);
        if (s->batch || s->token || s->channel || s->state)
            return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                           "problem->%s: a prefill with block states takes dense [B,T,...] inputs",
                           op->strides[i].field);
    }
    for (int i = 0; i < op->n_options; i++)
        if (!strcmp(op->options[i].field, "channel_first") &&
            *(const bool *)((const char *)p + op->options[i].offset))
            return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                           "channel_first: a prefill with block states takes [B,T,...] tensors");
    const int64_t *cu = op->varlen ? ls_op_cu_seqlens(op, p) : NULL;
    if (!cu) return LINSEQ_OK;
    int64_t n_seqs;
    memcpy(&n_seqs, (const char *)p + op->n_seqs_offset, sizeof n_seqs);
    return ls_check_cu_seqlens(fn, cu, n_seqs, ls_op_size_named(op, p, "B"),
                               ls_op_size_named(op, p, "T"));
}

/* The boundaries strictly inside sequence s's tokens: positions P = k * block_size with
 * computed < P < computed + len. Counts them, or (writes non-NULL) lists them from *n on. */
static linseq_status list_boundaries(const char *fn, const linseq_state_pool *pool, int64_t s,
                                     int64_t computed, int64_t len, int64_t block_size,
                                     const void *block_rows, int64_t max_blocks, pool_write *writes,
                                     int64_t *n)
{
    for (int64_t P = (computed / block_size + 1) * block_size; P < computed + len;
         P += block_size) {
        const int64_t column = P / block_size - 1;
        if (column >= max_blocks)
            return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                           "sequence %lld crosses block boundary %lld (tokens %lld to %lld, "
                           "block_size %lld); expected max_blocks > %lld, got %lld; nothing was "
                           "written",
                           (long long)s, (long long)column, (long long)computed,
                           (long long)(computed + len), (long long)block_size, (long long)column,
                           (long long)max_blocks);
        if (writes) {
            const int64_t r = ls_pool_index_at(pool, block_rows, s * max_blocks + column);
            const bool pad = r < 0 || (pool->has_pad_value && r == pool->pad_value);
            if (!pad && r >= pool->n_rows)
                return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                               "block_rows[%lld][%lld] = %lld; expected a row in [0, %lld), a "
                               "negative index or the pad value (not kept); nothing was written",
                               (long long)s, (long long)column, (long long)r,
                               (long long)pool->n_rows);
            writes[*n] = (pool_write){pad ? -1 : r, s, column, P - computed};
        }
        ++*n;
    }
    return LINSEQ_OK;
}

static int compare_writes(const void *x, const void *y)
{
    const pool_write *a = x, *b = y;
    if (a->row != b->row) return (a->row > b->row) - (a->row < b->row);
    return (a->seq > b->seq) - (a->seq < b->seq);
}

static void describe_write(const pool_write *w, char *buf, size_t n)
{
    if (w->block < 0)
        snprintf(buf, n, "sequence %lld's final state", (long long)w->seq);
    else
        snprintf(buf, n, "sequence %lld's block %lld", (long long)w->seq, (long long)w->block);
}

/* No pool row written twice, among final states and block states; work holds n writes. */
static linseq_status check_distinct(const char *fn, const pool_write *writes, int64_t n,
                                    pool_write *work)
{
    memcpy(work, writes, (size_t)n * sizeof *work);
    qsort(work, (size_t)n, sizeof *work, compare_writes);
    for (int64_t i = 1; i < n; i++) {
        if (work[i].row < 0 || work[i].row != work[i - 1].row) continue;
        char first[64], second[64];
        describe_write(&work[i - 1], first, sizeof first);
        describe_write(&work[i], second, sizeof second);
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "%s and %s both go to pool row %lld; each row may be written once in a "
                       "call; nothing was written",
                       first, second, (long long)work[i].row);
    }
    return LINSEQ_OK;
}

/* The writes of the call, checked: the n_seqs final states (to dst, read with src), then
 * every boundary of every sequence that is not padding, in order. */
static linseq_status plan_writes(const char *fn, const ls_op *op, const void *p,
                                 const linseq_state_pool *pool, int64_t n_seqs, const int64_t *src,
                                 const int64_t *dst, int64_t block_size, const void *block_rows,
                                 int64_t max_blocks, const void *computed_tokens,
                                 pool_write **writes, int64_t *n)
{
    int64_t count = n_seqs;
    linseq_status st = LINSEQ_OK;
    for (int pass = 0; pass < 2 && !st; pass++) {
        if (pass == 1 && !(*writes = malloc((size_t)(2 * count) * sizeof **writes))) {
            st = ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "pool: could not allocate %lld writes",
                         (long long)count);
            break;
        }
        *n = n_seqs;
        for (int64_t s = 0; s < n_seqs && !st; s++) {
            int64_t begin, len;
            sequence_span(op, p, s, &begin, &len);
            const int64_t computed =
                computed_tokens ? ls_pool_index_at(pool, computed_tokens, s) : 0;
            if (computed < 0 || computed > INT64_MAX / 2 - len)
                st = ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                             "computed_tokens[%lld] = %lld; expected >= 0 (the tokens of the "
                             "sequence before this call); nothing was written",
                             (long long)s, (long long)computed);
            else if (src[s] >= 0) /* padding keeps no state */
                st = list_boundaries(fn, pool, s, computed, len, block_size, block_rows, max_blocks,
                                     pass ? *writes : NULL, n);
            if (pass) (*writes)[s] = (pool_write){dst[s], s, -1, len};
        }
        if (pass == 0 && !st) {
            count = *n;
            st = ls_pool_check_index_count(fn, "block states", count, 8);
        }
    }
    return st ? st : check_distinct(fn, *writes, *n, *writes + *n);
}

/* The op's forward over tokens [a, b) of sequence s, from and to the state at `state`. */
static linseq_status run_piece(const ls_op *op, const void *p, const linseq_exec *exec,
                               float *const *out, void *piece, int64_t begin, int64_t a, int64_t b,
                               float *state)
{
    memcpy(piece, p, op->problem_size);
    const int64_t tokens = ls_op_size_named(op, p, "B") * ls_op_size_named(op, p, "T");
    const size_t elem = ls_token_bytes(exec);
    float *outputs[LS_OP_MAX_OUT] = {0};
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        int64_t count;
        if (!t->token || !ls_tensor_count(t, p, &count) || count == 0) continue;
        const size_t offset = (size_t)((begin + a) * (count / tokens)) * elem;
        if (t->role == LS_ROLE_INPUT && ls_tensor_get(t, p))
            ls_tensor_set(t, piece, (const unsigned char *)ls_tensor_get(t, p) + offset);
        if (t->role == LS_ROLE_OUTPUT && out[t->offset])
            outputs[t->offset] = (float *)((unsigned char *)out[t->offset] + offset);
    }
    for (int i = 0; i < op->n_sizes; i++) {
        if (!strcmp(op->sizes[i].name, "B")) ls_size_set(&op->sizes[i], piece, 1);
        if (!strcmp(op->sizes[i].name, "T")) ls_size_set(&op->sizes[i], piece, b - a);
    }
    if (op->varlen) ls_op_set_varlen(op, piece, NULL, 0);
    ls_tensor_set(ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state), piece, state);
    outputs[ls_op_tensor_named(op, LS_ROLE_OUTPUT, op->decode_state_out)->offset] = state;
    return op->forward(piece, exec, outputs);
}

/* Every sequence piece by piece on the float32 block of its states; the state at each kept
 * boundary is copied to kept (one row per write with a row, in the writes' order). */
static linseq_status run_pieces(const char *fn, const ls_op *op, const void *p,
                                const linseq_exec *exec, float *const *out,
                                const pool_write *writes, int64_t n_writes, int64_t n_seqs,
                                int64_t row, float *block, float *kept)
{
    void *piece = malloc(op->problem_size);
    if (!piece) return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "could not copy the problem");
    linseq_status st = LINSEQ_OK;
    int64_t w = n_seqs, k = 0; /* boundaries are listed sequence by sequence, in order */
    for (int64_t s = 0; s < n_seqs && !st; s++) {
        int64_t begin, len, a = 0;
        sequence_span(op, p, s, &begin, &len);
        float *state = block + s * row;
        for (; !st && w < n_writes && writes[w].seq == s; w++) {
            if (writes[w].token > a)
                st = run_piece(op, p, exec, out, piece, begin, a, writes[w].token, state);
            a = writes[w].token;
            if (!st && writes[w].row >= 0)
                memcpy(kept + k++ * row, state, (size_t)row * sizeof *kept);
        }
        if (!st && len > a) st = run_piece(op, p, exec, out, piece, begin, a, len, state);
    }
    free(piece);
    return st;
}

linseq_status ls_op_forward_pool_blocks(const char *fn, const ls_op *op, const void *p,
                                        const linseq_exec *exec, const linseq_state_pool *pool,
                                        const bool *has_initial_state, int64_t block_size,
                                        const void *block_rows, int64_t max_blocks,
                                        const void *computed_tokens, float *const *out)
{
    int64_t row;
    linseq_status st = ls_pool_check_prefill(fn, op, p, exec, pool, &row);
    if (st || (st = check_layout(fn, op, p))) return st;
    if (block_size < 1)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE, "block_size = %lld; expected >= 1 token",
                       (long long)block_size);
    if (max_blocks < 0)
        return ls_fail(fn, LINSEQ_ERR_INVALID_SIZE, "max_blocks = %lld; expected >= 0",
                       (long long)max_blocks);
    if (max_blocks > 0 && !block_rows)
        return ls_fail(fn, LINSEQ_ERR_NULL_POINTER,
                       "block_rows is NULL; expected [n_seqs, max_blocks = %lld] rows",
                       (long long)max_blocks);
    const int64_t *cu = op->varlen ? ls_op_cu_seqlens(op, p) : NULL;
    int64_t n_seqs = ls_op_size_named(op, p, "B");
    if (cu) memcpy(&n_seqs, (const char *)p + op->n_seqs_offset, sizeof n_seqs);
    if (n_seqs < 1) return op->forward(p, exec, out); /* its own refusal of the sizes */
    if ((st = ls_pool_check_index_count(fn, "sequences", n_seqs, 2))) return st;
    pool_write *writes = NULL;
    int64_t n_writes = 0, kept_rows = 0;
    float *block = NULL, *kept = NULL;
    int64_t *src = malloc((size_t)n_seqs * sizeof *src),
            *dst = malloc((size_t)n_seqs * sizeof *dst);
    if (!src || !dst) {
        st = ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "pool: could not allocate indices");
        goto done;
    }
    if ((st = ls_pool_read_rows(fn, pool, n_seqs, src, dst)) ||
        (st = plan_writes(fn, op, p, pool, n_seqs, src, dst, block_size, block_rows, max_blocks,
                          computed_tokens, &writes, &n_writes)))
        goto done;
    for (int64_t w = n_seqs; w < n_writes; w++) kept_rows += writes[w].row >= 0;
    if (ls_mul_sat(kept_rows ? kept_rows : 1, row) > (int64_t)(SIZE_MAX / 2 / sizeof(float))) {
        st = ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW, "pool: %lld block states of %lld elements",
                     (long long)kept_rows, (long long)row);
        goto done;
    }
    if (!(kept = malloc((size_t)((kept_rows ? kept_rows : 1) * row) * sizeof *kept))) {
        st = ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "pool: could not allocate %lld block states",
                     (long long)kept_rows);
        goto done;
    }
    if ((st = ls_pool_gather_initial(fn, pool, n_seqs, row, src, has_initial_state, &block)) ||
        (st = run_pieces(fn, op, p, exec, out, writes, n_writes, n_seqs, row, block, kept)))
        goto done;
    const int64_t stride = pool->row_stride ? pool->row_stride : row;
    for (int64_t w = 0, k = 0; w < n_writes; w++) {
        if (writes[w].row < 0) continue;
        const float *state = w < n_seqs ? block + w * row : kept + k++ * row;
        ls_state_narrow(pool->dtype, state, ls_pool_row(pool, writes[w].row, stride), row);
    }
done:
    free(kept);
    free(block);
    free(writes);
    free(dst);
    free(src);
    return st;
}
