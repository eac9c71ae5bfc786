/* Several tokens per request over a serving engine's pool (linseq_op_decode_tokens_pool):
 * speculative decoding, where each draft token's state is kept in its own row so that the
 * engine can resume from the last token it accepts.
 *
 * The call is T of the op's own decode steps on a float32 block gathered from the source
 * rows: before step t the t-th token of every per-token input is gathered into [B,1,...]
 * buffers, after it the step's per-token outputs go to token t of the caller's [B,T,...]
 * outputs and the block is kept for token t. Only after the last step succeeded are the
 * kept states written to their rows, each rounded once to the pool's type: a refusal at any
 * step (a positive log decay of a later token, say) leaves every row as it was. */
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/status.h"
#include "optable/check.h"
#include "optable/state_pool.h"

/* A per-token tensor of the call: [B,T,...] in the caller's memory, [B,1,...] in `step`. */
typedef struct {
    const ls_tensor_desc *t;
    unsigned char *whole; /* the caller's array */
    unsigned char *step;
    size_t token_bytes; /* one token of one request */
} token_tensor;

typedef struct {
    token_tensor in[LS_OP_MAX_FIELDS], out[LS_OP_MAX_OUT];
    int n_in, n_out;
} token_tensors;

/* The op's per-token inputs given in p and its per-token outputs (not the state), with their
 * step buffers; false when one cannot be allocated. */
static bool list_token_tensors(const ls_op *op, const void *p, float *const *out, int64_t B,
                               int64_t T, size_t elem, token_tensors *tt)
{
    memset(tt, 0, sizeof *tt);
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        const bool input = t->role == LS_ROLE_INPUT, output = t->role == LS_ROLE_OUTPUT;
        if (!t->token || !(input || output)) continue;
        void *whole = input ? (void *)ls_tensor_get(t, p) : out[t->offset];
        int64_t n;
        if (!whole || !ls_tensor_count(t, p, &n) || n == 0) continue;
        token_tensor *x = input ? &tt->in[tt->n_in++] : &tt->out[tt->n_out++];
        x->t = t;
        x->whole = whole;
        x->token_bytes = (size_t)(n / (B * T)) * elem;
        if (!(x->step = malloc((size_t)B * x->token_bytes))) return false;
    }
    return true;
}

static void free_token_tensors(token_tensors *tt)
{
    for (int i = 0; i < tt->n_in; i++) free(tt->in[i].step);
    for (int i = 0; i < tt->n_out; i++) free(tt->out[i].step);
}

/* Token t of every request: whole [B,T,...] -> step [B,1,...] (or back). */
static void move_token(token_tensor *x, int64_t B, int64_t T, int64_t t, bool gather)
{
    for (int64_t b = 0; b < B; b++) {
        unsigned char *w = x->whole + (size_t)(b * T + t) * x->token_bytes;
        unsigned char *s = x->step + (size_t)b * x->token_bytes;
        memcpy(gather ? s : w, gather ? w : s, x->token_bytes);
    }
}

/* The rows: src [B] (-1: padding), dst [B*T] (the row of each token's state; with no
 * dst_rows only the last token's, to the source row). */
static linseq_status read_token_rows(const char *fn, const linseq_state_pool *pool, int64_t B,
                                     int64_t T, int64_t *src, int64_t *dst)
{
    for (int64_t b = 0; b < B; b++) {
        const int64_t s = pool->src_rows ? ls_pool_index_at(pool, pool->src_rows, b) : b;
        const bool pad = s < 0 || (pool->has_pad_value && s == pool->pad_value);
        src[b] = pad ? -1 : s;
        if (!pad && s >= pool->n_rows)
            return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                           "pool->src_rows[%lld] = %lld; expected a row in [0, %lld), a negative "
                           "index or the pad value (padding); nothing was written",
                           (long long)b, (long long)s, (long long)pool->n_rows);
        for (int64_t t = 0; t < T; t++) {
            const int64_t i = b * T + t;
            dst[i] = pad              ? -1
                     : pool->dst_rows ? ls_pool_index_at(pool, pool->dst_rows, i)
                     : t == T - 1     ? s
                                      : -1;
            if (!pad && (pool->dst_rows || t == T - 1) && (dst[i] < 0 || dst[i] >= pool->n_rows))
                return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                               "pool->dst_rows[%lld] (request %lld, token %lld) = %lld; expected "
                               "a row in [0, %lld); nothing was written",
                               (long long)i, (long long)b, (long long)t, (long long)dst[i],
                               (long long)pool->n_rows);
        }
    }
    return LINSEQ_OK;
}

/* The T steps on the gathered block, each step's states kept in kept[t]. */
static linseq_status run_steps(const char *fn, const ls_op *op, const void *p,
                               const linseq_exec *exec, token_tensors *tt, float *const *out,
                               int64_t B, int64_t T, float *block, int64_t block_rows,
                               const int64_t *slot, float *kept, int64_t kept_floats)
{
    void *step = malloc(op->problem_size);
    if (!step) return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "could not copy the problem");
    memcpy(step, p, op->problem_size);
    for (int i = 0; i < op->n_sizes; i++)
        if (!strcmp(op->sizes[i].name, "T")) ls_size_set(&op->sizes[i], step, 1);
    for (int i = 0; i < tt->n_in; i++) ls_tensor_set(tt->in[i].t, step, tt->in[i].step);
    float *step_out[LS_OP_MAX_OUT] = {0};
    for (int i = 0; ls_op_tensor(op, LS_ROLE_OUTPUT, i); i++) step_out[i] = out[i];
    for (int i = 0; i < tt->n_out; i++) step_out[tt->out[i].t->offset] = (float *)tt->out[i].step;
    linseq_status st = LINSEQ_OK;
    for (int64_t t = 0; t < T && !st; t++) {
        for (int i = 0; i < tt->n_in; i++) move_token(&tt->in[i], B, T, t, true);
        st = op->decode(step, exec, block, block_rows, slot, step_out);
        for (int i = 0; !st && i < tt->n_out; i++) move_token(&tt->out[i], B, T, t, false);
        if (!st && kept) memcpy(kept + t * kept_floats, block, (size_t)kept_floats * sizeof *kept);
    }
    free(step);
    return st;
}

linseq_status ls_op_decode_tokens_pool(const char *fn, const ls_op *op, const void *p,
                                       const linseq_exec *exec, const linseq_state_pool *pool,
                                       float *const *out)
{
    if (!p) return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "argument 'problem' is NULL");
    linseq_status st = ls_pool_check_problem(fn, op, p, exec);
    if (st) return st;
    const int64_t B = ls_op_size_named(op, p, "B"), T = ls_op_size_named(op, p, "T");
    const int64_t row = ls_pool_state_elements(op, p);
    if ((st = ls_pool_check(fn, pool, row, exec))) return st;
    if (B < 1 || T < 1)
        return ls_fail(fn, LINSEQ_ERR_INVALID_SIZE, "B = %lld, T = %lld; expected both >= 1",
                       (long long)B, (long long)T);
    /* B (2T + 2) indices: src, dst and their sort per token, the slots */
    if ((st = ls_pool_check_index_count(fn, "B (T + 1)", ls_mul_sat(B, T + 1), 2))) return st;
    for (int i = 0; i < op->n_strides; i++) {
        const linseq_strides *s = (const void *)((const char *)p + op->strides[i].offset);
        if (s->batch || s->token || s->channel || s->state)
            return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                           "problem->%s: several tokens per request take dense [B,T,...] inputs",
                           op->strides[i].field);
    }
    for (int i = 0; i < op->n_options; i++)
        if (!strcmp(op->options[i].field, "channel_first") &&
            *(const bool *)((const char *)p + op->options[i].offset))
            return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                           "channel_first: several tokens per request take [B,T,...] tensors");
    int64_t *rows = malloc((size_t)(B * (T + 1) + B * T + B) * sizeof *rows);
    if (!rows) return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "pool: could not allocate indices");
    int64_t *src = rows, *dst = src + B, *work = dst + B * T, *slot = work + B * T;
    float *block = NULL, *kept = NULL;
    token_tensors tt = {0};
    if ((st = read_token_rows(fn, pool, B, T, src, dst)) ||
        (st = ls_pool_check_distinct(fn, dst, B * T, T, work)))
        goto done;
    int64_t live = 0;
    for (int64_t b = 0; b < B; b++) slot[b] = src[b] < 0 ? -1 : live++;
    const int64_t block_rows = live ? live : 1, stride = pool->row_stride ? pool->row_stride : row;
    const int64_t floats = ls_mul_sat(block_rows, row);
    if (ls_mul_sat(floats, T + 1) > (int64_t)(SIZE_MAX / 4 / sizeof(float))) {
        st = ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW, "pool: %lld tokens of %lld states", (long long)T,
                     (long long)live);
        goto done;
    }
    block = calloc((size_t)floats, sizeof *block);
    kept = malloc((size_t)(floats * T) * sizeof *kept);
    if (!block || !kept || !list_token_tensors(op, p, out, B, T, ls_token_bytes(exec), &tt)) {
        st = ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "pool: could not allocate %lld tokens' states",
                     (long long)T);
        goto done;
    }
    for (int64_t b = 0; b < B; b++)
        if (slot[b] >= 0)
            ls_state_widen(pool->dtype, ls_pool_row(pool, src[b], stride), block + slot[b] * row,
                           row);
    if ((st = run_steps(fn, op, p, exec, &tt, out, B, T, block, block_rows, slot, kept, floats)))
        goto done;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; slot[b] >= 0 && t < T; t++)
            if (dst[b * T + t] >= 0)
                ls_state_narrow(pool->dtype, kept + t * floats + slot[b] * row,
                                ls_pool_row(pool, dst[b * T + t], stride), row);
done:
    free_token_tensors(&tt);
    free(kept);
    free(block);
    free(rows);
    return st;
}
