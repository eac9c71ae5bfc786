/* linseq_op_forward_pool_blocks, the prefill that keeps each block boundary's state (prefix
 * caching), for every op with a decode step, from the op table alone: the state at each
 * boundary equals, bitwise once rounded to the pool's type, the final state of the op's own
 * forward over that prefix of the sequence (from the same initial state, in the recurrent
 * form where the op has modes, so the prefix forward runs the same token steps); the final
 * states and the outputs equal the whole sequences' forward. Packed sequences with an empty
 * one (a batch for an op without cu_seqlens), a first token inside a block, a final state
 * on a boundary, a boundary not kept; float32 pools with gaps between rows and int64
 * indices, bfloat16 ones with int32 indices and a padding sequence; bfloat16 tokens where
 * the op's CPU forward takes them. Every refusal leaves every byte of the pool as it was. */
#include <stdlib.h>
#include <string.h>

#include "core/half_float.h"
#include "optable/optable.h"
#include "testutil.h"

enum { N_SEQS = 3, BLOCK = 4, MAX_BLOCKS = 4, ROWS = 12, PROBLEM_BYTES = 512 };
/* 7 tokens, none, 12 tokens (packed); a batch of 7 tokens each without cu_seqlens */
static const int64_t CU[N_SEQS + 1] = {0, 7, 7, 19};
static const int64_t COMPUTED[N_SEQS] = {5, 3, 0};
static const int64_t SRC[N_SEQS] = {2, 9, 7}, DST[N_SEQS] = {3, 10, 11};
static const bool HAS_INITIAL[N_SEQS] = {true, true, false};
/* the boundaries crossed: sequence 0 (tokens 5..12) at 8, sequence 1 (batch: 3..10) at 4
 * and 8, sequence 2 at 4 and 8 (packed: 12 is its end, so row 0 stays as it was) */
static const int64_t BLOCK_ROWS[N_SEQS * MAX_BLOCKS] = {-1, 4, -1, -1, 8, 1, -1, -1, 5, -1, 0, -1};

typedef struct {
    const ls_op *op;
    linseq_exec exec;
    _Alignas(max_align_t) unsigned char p[PROBLEM_BYTES];
    int64_t row, tokens, token_floats[LS_OP_MAX_OUT]; /* per-token output floats per token */
    float *inputs[LS_OP_MAX_TENSORS];
} op_case;

/* The benchmark's options at small sizes, the sequences above, realistic inputs. */
static void case_make(op_case *c, const ls_op *op, bool bf16_tokens)
{
    memset(c, 0, sizeof *c);
    c->op = op;
    c->exec.mode = op->has_modes ? LINSEQ_MODE_RECURRENT : LINSEQ_MODE_DEFAULT;
    c->exec.dtype = bf16_tokens ? LINSEQ_DTYPE_BF16 : LINSEQ_DTYPE_F32;
    for (int i = 0; i < op->n_sizes; i++) {
        const int64_t d = op->sizes[i].bench_default;
        ls_size_set(&op->sizes[i], c->p, d > 64 ? 8 + d % 23 : d);
    }
    if (op->bench_options) op->bench_options(c->p);
    for (int i = 0; i < op->n_sizes; i++) {
        if (!strcmp(op->sizes[i].name, "B")) ls_size_set(&op->sizes[i], c->p, op->varlen ? 1 : 3);
        if (!strcmp(op->sizes[i].name, "T")) ls_size_set(&op->sizes[i], c->p, op->varlen ? 19 : 7);
    }
    if (op->varlen) ls_op_set_varlen(op, c->p, CU, N_SEQS);
    c->tokens = op->varlen ? 19 : 21;
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        int64_t dims[LS_OP_MAX_DIMS], n;
        const int nd = t->shape(c->p, dims);
        if (!ls_tensor_count(t, c->p, &n) || n == 0) continue;
        if (t->role == LS_ROLE_OUTPUT && t->token) c->token_floats[t->offset] = n / c->tokens;
        if (t->role != LS_ROLE_INPUT || !strcmp(t->name, op->decode_state)) continue;
        c->inputs[i] = tu_alloc((size_t)n);
        ls_op_fill(t, c->inputs[i], n, dims, nd, 900 + (uint64_t)i);
        for (int64_t k = 0; bf16_tokens && t->token && k < n; k++) /* in place, k < 2k */
            ((uint16_t *)c->inputs[i])[k] = ls_f32_to_bf16(c->inputs[i][k]);
        ls_tensor_set(t, c->p, c->inputs[i]);
    }
    const ls_tensor_desc *state = ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state);
    int64_t dims[LS_OP_MAX_DIMS];
    const int nd = state->shape(c->p, dims);
    c->row = 1;
    for (int d = 1; d < nd; d++) c->row *= dims[d];
}

static void case_free(op_case *c)
{
    for (int i = 0; i < LS_OP_MAX_TENSORS; i++) free(c->inputs[i]);
}

/* Bytes of one element of a per-token tensor. */
static size_t token_bytes(const op_case *c) { return c->exec.dtype == LINSEQ_DTYPE_BF16 ? 2 : 4; }

static void sequence_span(const op_case *c, int64_t s, int64_t *begin, int64_t *len)
{
    *begin = c->op->varlen ? CU[s] : s * 7;
    *len = c->op->varlen ? CU[s + 1] - CU[s] : 7;
}

/* The op's forward over the first len tokens of sequence s from h (updated to the final
 * state), its per-token outputs into y (the call's arrays, at the sequence's tokens). */
static void prefix_forward(const op_case *c, int64_t s, int64_t len, float *h, float *const *y)
{
    const ls_op *op = c->op;
    unsigned char q[PROBLEM_BYTES];
    memcpy(q, c->p, sizeof q);
    int64_t begin, whole;
    sequence_span(c, s, &begin, &whole);
    float *out[LS_OP_MAX_OUT] = {0};
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        int64_t n;
        if (!t->token || !ls_tensor_count(t, c->p, &n) || n == 0) continue;
        const size_t at = (size_t)(begin * (n / c->tokens)) * token_bytes(c);
        if (t->role == LS_ROLE_INPUT && c->inputs[i])
            ls_tensor_set(t, q, (unsigned char *)c->inputs[i] + at);
        if (t->role == LS_ROLE_OUTPUT)
            out[t->offset] = (float *)((unsigned char *)y[t->offset] + at);
    }
    for (int i = 0; i < op->n_sizes; i++) {
        if (!strcmp(op->sizes[i].name, "B")) ls_size_set(&op->sizes[i], q, 1);
        if (!strcmp(op->sizes[i].name, "T")) ls_size_set(&op->sizes[i], q, len);
    }
    if (op->varlen) ls_op_set_varlen(op, q, NULL, 0);
    ls_tensor_set(ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state), q, h);
    out[ls_op_tensor_named(op, LS_ROLE_OUTPUT, op->decode_state_out)->offset] = h;
    if (len > 0) CHECK_OK(op->forward(q, &c->exec, out));
}

/* A pool: its bytes, laid out as linseq_state_pool says, with every byte set. */
typedef struct {
    linseq_state_pool pool;
    size_t bytes, elem;
    int64_t stride;
    int32_t src32[N_SEQS], dst32[N_SEQS], blocks32[N_SEQS * MAX_BLOCKS], computed32[N_SEQS];
} test_pool;

static void pool_make(test_pool *t, const op_case *c, bool bf16)
{
    memset(t, 0, sizeof *t);
    t->elem = bf16 ? 2 : 4;
    t->stride = bf16 ? c->row : c->row + 3;
    t->bytes = (size_t)(ROWS * t->stride) * t->elem;
    t->pool = (linseq_state_pool){.data = malloc(t->bytes),
                                  .n_rows = ROWS,
                                  .row_stride = bf16 ? 0 : t->stride,
                                  .dtype = bf16 ? LINSEQ_POOL_BF16 : LINSEQ_POOL_F32,
                                  .src_rows = SRC,
                                  .dst_rows = DST,
                                  .index_bits = bf16 ? 32 : 64,
                                  .has_pad_value = bf16,
                                  .pad_value = SRC[0]}; /* bf16: sequence 0 is padding */
    tu_rng rng = {31};
    for (int64_t i = 0; i < ROWS * t->stride; i++) {
        const float v = (float)tu_uniform(&rng, -0.5, 0.5);
        if (bf16)
            ((uint16_t *)t->pool.data)[i] = ls_f32_to_bf16(v);
        else
            ((float *)t->pool.data)[i] = v;
    }
    for (int s = 0; s < N_SEQS; s++) {
        t->src32[s] = (int32_t)SRC[s], t->dst32[s] = (int32_t)DST[s];
        t->computed32[s] = (int32_t)COMPUTED[s];
    }
    for (int i = 0; i < N_SEQS * MAX_BLOCKS; i++) t->blocks32[i] = (int32_t)BLOCK_ROWS[i];
    if (bf16) t->pool.src_rows = t->src32, t->pool.dst_rows = t->dst32;
}

static const void *blocks_of(const test_pool *t)
{
    return t->elem == 2 ? (const void *)t->blocks32 : BLOCK_ROWS;
}
static const void *computed_of(const test_pool *t)
{
    return t->elem == 2 ? (const void *)t->computed32 : COMPUTED;
}

/* A state rounded to the pool's type into row r of `bytes` (a copy of the pool). */
static void put_row(const test_pool *t, unsigned char *bytes, int64_t r, const float *h, int64_t n)
{
    unsigned char *at = bytes + (size_t)(r * t->stride) * t->elem;
    for (int64_t i = 0; i < n; i++) {
        if (t->elem == 2) {
            const uint16_t b = ls_f32_to_bf16(h[i]);
            memcpy(at + 2 * i, &b, 2);
        } else {
            memcpy(at + 4 * i, &h[i], 4);
        }
    }
}

/* Sequence s's initial state widened to float32: its source row, or zeros (no initial
 * state, or padding). */
static void initial_state(const test_pool *t, int64_t s, int64_t n, float *h)
{
    const bool pad = t->pool.has_pad_value && SRC[s] == t->pool.pad_value;
    const unsigned char *at =
        (const unsigned char *)t->pool.data + (size_t)(SRC[s] * t->stride) * t->elem;
    for (int64_t i = 0; i < n; i++) {
        if (pad || !HAS_INITIAL[s]) {
            h[i] = 0;
        } else if (t->elem == 2) {
            uint16_t b;
            memcpy(&b, at + 2 * i, 2);
            h[i] = ls_bf16_to_f32(b);
        } else {
            memcpy(&h[i], at + 4 * i, 4);
        }
    }
}

/* The pool and outputs the call must leave, from forwards over each prefix. */
static void expected(const op_case *c, const test_pool *t, unsigned char *want, float *const *y)
{
    memcpy(want, t->pool.data, t->bytes);
    float *h = tu_alloc((size_t)c->row);
    for (int64_t s = 0; s < N_SEQS; s++) {
        const bool pad = t->pool.has_pad_value && SRC[s] == t->pool.pad_value;
        int64_t begin, len;
        sequence_span(c, s, &begin, &len);
        for (int64_t P = (COMPUTED[s] / BLOCK + 1) * BLOCK; !pad && P < COMPUTED[s] + len;
             P += BLOCK) {
            const int64_t r = BLOCK_ROWS[s * MAX_BLOCKS + P / BLOCK - 1];
            if (r < 0) continue;
            initial_state(t, s, c->row, h);
            prefix_forward(c, s, P - COMPUTED[s], h, y);
            put_row(t, want, r, h, c->row);
        }
        initial_state(t, s, c->row, h);
        prefix_forward(c, s, len, h, y);
        if (!pad) put_row(t, want, DST[s], h, c->row);
    }
    free(h);
}

static void outputs_make(const op_case *c, float **y)
{
    for (int k = 0; k < LS_OP_MAX_OUT; k++)
        y[k] =
            c->token_floats[k] ? tu_alloc_poisoned((size_t)(c->token_floats[k] * c->tokens)) : NULL;
}

static void outputs_free(float **y)
{
    for (int k = 0; k < LS_OP_MAX_OUT; k++) free(y[k]);
}

static linseq_status call(const op_case *c, const test_pool *t, int64_t block_size,
                          int64_t max_blocks, float *const *y)
{
    return linseq_op_forward_pool_blocks(c->op->name, c->p, &c->exec, &t->pool, HAS_INITIAL,
                                         block_size, blocks_of(t), max_blocks, computed_of(t), y);
}

/* The call against the prefix forwards: every byte of the pool and every output bitwise. */
static void check_states(const op_case *c, bool bf16)
{
    test_pool t;
    pool_make(&t, c, bf16);
    unsigned char *want = malloc(t.bytes);
    float *y[LS_OP_MAX_OUT], *y_want[LS_OP_MAX_OUT];
    outputs_make(c, y);
    outputs_make(c, y_want);
    expected(c, &t, want, y_want);
    CHECK_OK(call(c, &t, BLOCK, MAX_BLOCKS, y));
    CHECK(memcmp(want, t.pool.data, t.bytes) == 0,
          "%s, %s pool%s: a block state, a final state or an untouched row differs from the "
          "prefix forwards",
          c->op->name, bf16 ? "bf16" : "f32", token_bytes(c) == 2 ? ", bf16 tokens" : "");
    for (int k = 0; k < LS_OP_MAX_OUT; k++)
        CHECK(!y[k] || !memcmp(y[k], y_want[k],
                               (size_t)(c->token_floats[k] * c->tokens) * token_bytes(c)),
              "%s, %s pool%s: output %d differs from the whole sequences' forward", c->op->name,
              bf16 ? "bf16" : "f32", token_bytes(c) == 2 ? ", bf16 tokens" : "", k);
    outputs_free(y);
    outputs_free(y_want);
    free(want);
    free(t.pool.data);
}

/* Each refusal names what it refuses and leaves every byte of the pool. */
static void check_refusals(const op_case *c)
{
    test_pool t;
    pool_make(&t, c, false);
    unsigned char *before = malloc(t.bytes);
    memcpy(before, t.pool.data, t.bytes);
    float *y[LS_OP_MAX_OUT];
    outputs_make(c, y);
    CHECK_FAILS(call(c, &t, 0, MAX_BLOCKS, y), LINSEQ_ERR_INVALID_VALUE, "block_size = 0");
    CHECK_FAILS(call(c, &t, BLOCK, 1, y), LINSEQ_ERR_INVALID_VALUE, "expected max_blocks > 1");
    CHECK_FAILS(call(c, &t, BLOCK, -1, y), LINSEQ_ERR_INVALID_SIZE, "max_blocks = -1");
    int64_t blocks[N_SEQS * MAX_BLOCKS];
    memcpy(blocks, BLOCK_ROWS, sizeof blocks);
    blocks[1] = ROWS; /* sequence 0's boundary at token 8 */
    CHECK_FAILS(linseq_op_forward_pool_blocks(c->op->name, c->p, &c->exec, &t.pool, HAS_INITIAL,
                                              BLOCK, blocks, MAX_BLOCKS, COMPUTED, y),
                LINSEQ_ERR_INVALID_VALUE, "block_rows[0][1] = 12");
    blocks[1] = DST[2];
    CHECK_FAILS(linseq_op_forward_pool_blocks(c->op->name, c->p, &c->exec, &t.pool, HAS_INITIAL,
                                              BLOCK, blocks, MAX_BLOCKS, COMPUTED, y),
                LINSEQ_ERR_INVALID_VALUE, "both go to pool row 11");
    const int64_t negative[N_SEQS] = {5, -1, 0};
    CHECK_FAILS(linseq_op_forward_pool_blocks(c->op->name, c->p, &c->exec, &t.pool, HAS_INITIAL,
                                              BLOCK, BLOCK_ROWS, MAX_BLOCKS, negative, y),
                LINSEQ_ERR_INVALID_VALUE, "computed_tokens[1] = -1");
    CHECK(memcmp(before, t.pool.data, t.bytes) == 0, "%s: a refused call wrote the pool",
          c->op->name);
    outputs_free(y);
    free(before);
    free(t.pool.data);
}

int main(void)
{
    int n, tested = 0, bf16_tested = 0;
    const ls_op *const *ops = ls_ops(&n);
    for (int i = 0; i < n; i++) {
        if (!ops[i]->decode) continue;
        op_case c;
        case_make(&c, ops[i], false);
        check_states(&c, false);
        check_states(&c, true);
        check_refusals(&c);
        case_free(&c);
        tested++;
        /* bf16 tokens where the op's CPU forward takes them (KDA, the conv) */
        case_make(&c, ops[i], true);
        float *y[LS_OP_MAX_OUT];
        test_pool t;
        pool_make(&t, &c, false);
        outputs_make(&c, y);
        if (call(&c, &t, BLOCK, MAX_BLOCKS, y) != LINSEQ_ERR_UNSUPPORTED) {
            check_states(&c, false);
            bf16_tested++;
        }
        outputs_free(y);
        free(t.pool.data);
        case_free(&c);
    }
    CHECK(bf16_tested >= 2, "bf16 tokens tested for %d ops (KDA and the conv expected)",
          bf16_tested);
    CHECK(tested >= 5, "only %d ops with a decode step (kda, ssm1, ssd, conv, ema expected)",
          tested);
    return tu_finish("test_state_pool_blocks");
}
