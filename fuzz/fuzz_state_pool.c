/* libFuzzer target: linseq_op_decode_pool, linseq_op_forward_pool and
 * linseq_op_forward_pool_blocks, the state pools of serving engines, for every op of the table
 * with a decode step.
 *
 * The input picks the op and the call (a decode step, or a prefill whose sequences start from
 * and end in pool rows), a small problem through the op table (sizes, options, packed
 * sequences; values from the table's distributions), and a linseq_state_pool whose every
 * field is fuzzed: n_rows, row_stride, dtype, index_bits, src_rows and dst_rows (int32 or
 * int64: in range, negative, the pad value, out of range, duplicates), the pad value, a
 * misaligned data pointer, and which sequences have an initial state. A prefill keeps its
 * block boundaries' states now and then: block_size, max_blocks, the block rows and the
 * tokens computed before the call fuzzed too (a boundary past the table, a row out of range or
 * written twice, a negative count: refused).
 *
 * The pool's buffer has exactly the bytes the struct describes; one too large to run fast is
 * only built when the pool must be refused, and then has no usable byte. Checks, besides
 * fuzz_util's contract (inputs never written, outputs untouched on failure): a pool that
 * breaks a documented rule is refused; a refused call leaves every byte of the pool as it
 * was; a successful one writes only the destination rows of live requests and the rows of
 * their boundaries (the other rows
 * and the gaps between rows keep their bytes), gives padding requests of a decode zero
 * outputs and never writes the state's own output slot; threads 1 and 3 give the same bits,
 * in the pool and in every output. An op with the option state_tap_major (the conv, whose
 * weight_tap_major is fuzzed with the other options) runs again in the other state layout
 * from the pool with its rows transposed: the same status and outputs, the pool transposed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/half_float.h"
#include "fuzz_util.h"
#include "optable/optable.h"

enum {
    MAX_REQUESTS = 12,
    MAX_BLOCKS = 6, /* columns of a block table */
    PROBLEM_BYTES = 512,
    POOL_MAX_BYTES = 1 << 20 /* a larger pool is skipped unless it must be refused */
};

typedef struct pool_case {
    const ls_op *op;
    bool prefill; /* linseq_op_forward_pool; else linseq_op_decode_pool */
    _Alignas(max_align_t) unsigned char problem[PROBLEM_BYTES];
    bool bad_problem; /* a size the op must refuse */
    int64_t n_req;    /* requests (decode) or sequences (prefill): the indices' count */
    int64_t row;      /* elements of one state; -1 when the sizes give none */
    const void *in[LS_OP_MAX_TENSORS + 1]; /* the inputs and cu_seqlens */
    size_t in_bytes[LS_OP_MAX_TENSORS + 1];
    int n_in;
    float *out[LS_OP_MAX_OUT];
    size_t out_bytes[LS_OP_MAX_OUT];
    int state_slot; /* the output slot of the state itself, which the call ignores */
    linseq_state_pool pool;
    size_t pool_bytes, elem;
    int64_t stride;            /* row_stride, or the state's elements for 0 */
    int64_t src[MAX_REQUESTS]; /* the indices as the library reads them (sign-extended) */
    int64_t dst[MAX_REQUESTS];
    bool *has_initial; /* [n_req], or NULL: every sequence has one */
    bool blocks;       /* linseq_op_forward_pool_blocks (a prefill) */
    int64_t block_size, max_blocks;
    const void *block_rows, *computed; /* in the pool's index type */
    int64_t block_read[MAX_REQUESTS * MAX_BLOCKS], computed_read[MAX_REQUESTS];
    bool must_fail;
    linseq_exec exec;
} pool_case;

/* An op by its index in the table (so that a seed keeps its op when ops are added), or the
 * next one after it that has a decode step. */
static const ls_op *pick_op(fz_in *in)
{
    int n_ops;
    const ls_op *const *ops = ls_ops(&n_ops);
    const unsigned first = fz_pick(in, (unsigned)n_ops);
    for (int i = 0; i < n_ops; i++)
        if (ops[(first + (unsigned)i) % (unsigned)n_ops]->decode)
            return ops[(first + (unsigned)i) % (unsigned)n_ops];
    fz_die("no op of the table has a decode step");
}

/* A size: small and valid mostly; now and then 0, negative or huge (the op must refuse it,
 * or its tensors do not fit and the input is skipped). */
static int64_t pick_size(fz_in *in, const ls_size_desc *s)
{
    static const int64_t small[] = {1, 2, 3, 4, 5, 8, 2, 1};
    const uint8_t b = fz_u8(in);
    if (b >= 250) return fz_size(in, 4);
    if (!s->required && b < 160) return 0; /* the default (HV = H, G = 1) */
    return small[b % 8];
}

static void pick_options(fz_in *in, const ls_op *op, void *p)
{
    if (op->bench_options) op->bench_options(p);
    if (fz_pick(in, 4) < 3) return; /* the benchmark's options */
    for (int i = 0; i < op->n_options; i++) {
        const ls_option_desc *o = &op->options[i];
        unsigned char *field = (unsigned char *)p + o->offset;
        if (o->type == LS_CTYPE_BOOL) {
            const bool b = fz_bit(in);
            memcpy(field, &b, sizeof b);
        } else if (o->type == LS_CTYPE_ENUM && o->names[0].name) {
            int n = 0;
            while (o->names[n].name) n++;
            const int v = o->names[fz_pick(in, (unsigned)n)].value;
            memcpy(field, &v, sizeof v);
        }
    }
}

/* Packed sequences for a prefill of an op that has them: B = 1, a valid partition. */
static void pick_varlen(fz_in *in, pool_case *c, const ls_size_desc *B, int64_t T)
{
    if (!c->prefill || !c->op->varlen || T < 1 || T > 64 || fz_pick(in, 4)) return;
    const int64_t n = 1 + fz_pick(in, 4);
    int64_t *cu = fz_alloc_bytes((size_t)(n + 1) * sizeof *cu);
    fz_cu_seqlens(in, cu, n, T, 0);
    ls_size_set(B, c->problem, 1);
    ls_op_set_varlen(c->op, c->problem, cu, n);
    c->in[c->n_in] = cu;
    c->in_bytes[c->n_in++] = (size_t)(n + 1) * sizeof *cu;
}

static void make_problem(fz_in *in, pool_case *c)
{
    const ls_op *op = c->op;
    if (op->problem_size > PROBLEM_BYTES) fz_die("%s: problem struct too large", op->name);
    const ls_size_desc *B = NULL, *T = NULL;
    for (int i = 0; i < op->n_sizes; i++) {
        const ls_size_desc *s = &op->sizes[i];
        ls_size_set(s, c->problem, pick_size(in, s));
        if (!strcmp(s->name, "B")) B = s;
        if (!strcmp(s->name, "T")) T = s;
    }
    if (!B || !T) fz_die("%s: a decode op without sizes B and T", op->name);
    const int64_t t = c->prefill ? 1 + (int64_t)fz_pick(in, 24) : 1;
    ls_size_set(T, c->problem, t);
    pick_options(in, op, c->problem);
    pick_varlen(in, c, B, t);
    for (int i = 0; i < op->n_sizes; i++) { /* as T and B are now */
        const int64_t v = ls_size_get(&op->sizes[i], c->problem);
        if (v < 0 || (op->sizes[i].required && v < 1)) c->bad_problem = true;
    }
}

/* The state's shape: its rows (n_req) and the elements of one row. */
static void state_shape(pool_case *c)
{
    const ls_tensor_desc *t = ls_op_tensor_named(c->op, LS_ROLE_INPUT, c->op->decode_state);
    int64_t d[LS_OP_MAX_DIMS];
    const int nd = t->shape(c->problem, d);
    if (nd < 1) fz_die("%s: no decode state", c->op->name);
    c->n_req = d[0];
    c->row = 1;
    for (int i = 1; i < nd && c->row >= 0; i++)
        if (d[i] < 0 || __builtin_mul_overflow(c->row, d[i], &c->row)) c->row = -1;
    if (c->row < 0) c->bad_problem = true;
}

/* Floats of a buffer for count elements: exact when small, none otherwise. */
static size_t floats_for(int64_t count)
{
    return count > 0 && count <= FZ_MAX_FLOATS ? (size_t)count : 0;
}

/* Every input but the state, values from the table (an optional one sometimes left out),
 * and every output. False: a tensor too large to run whose problem need not be refused. */
static bool make_tensors(fz_in *in, pool_case *c, uint64_t seed)
{
    const ls_op *op = c->op;
    const uint32_t drop = fz_u32(in);
    bool too_large = false;
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        if (t->role != LS_ROLE_INPUT && t->role != LS_ROLE_OUTPUT) continue;
        if (t->role == LS_ROLE_INPUT && !strcmp(t->name, op->decode_state)) continue;
        int64_t dims[LS_OP_MAX_DIMS], count;
        const int nd = t->shape(c->problem, dims);
        if (!nd) continue;
        if (!ls_tensor_count(t, c->problem, &count) || count > (int64_t)(PTRDIFF_MAX / 8))
            c->bad_problem = true;
        else if (count > FZ_MAX_FLOATS)
            too_large = true;
        const size_t n = floats_for(count);
        if (t->role == LS_ROLE_OUTPUT) {
            c->out[t->offset] = fz_alloc(n);
            c->out_bytes[t->offset] = n * sizeof(float);
            if (!strcmp(t->name, op->decode_state_out)) c->state_slot = (int)t->offset;
            continue;
        }
        if (!t->required && (drop >> (i % 32) & 1) && (drop & 0x7) == 0x7) continue;
        float *x = fz_alloc(n);
        if (n) ls_op_fill(t, x, (int64_t)n, dims, nd, seed + (uint64_t)i);
        ls_tensor_set(t, c->problem, x);
        c->in[c->n_in] = x;
        c->in_bytes[c->n_in++] = n * sizeof(float);
    }
    return !too_large || c->bad_problem;
}

/* ---------------------------------------------------------------------------------- */
/* The pool                                                                           */
/* ---------------------------------------------------------------------------------- */

static const int64_t huge[] = {(int64_t)1 << 40, INT64_MAX / 2, INT64_MAX, (int64_t)1 << 32 | 1};

static int64_t pick_n_rows(fz_in *in, int64_t n_req)
{
    const int64_t base = n_req >= 1 && n_req <= MAX_REQUESTS ? n_req : 1;
    const unsigned k = fz_pick(in, 16);
    if (k < 12) return 1 + (int64_t)fz_pick(in, (unsigned)base + 3);
    if (k == 12) return 0;
    if (k == 13) return -1 - (int64_t)fz_pick(in, 2) * (INT64_MAX - 1);
    return huge[fz_pick(in, 4)];
}

static int64_t pick_stride(fz_in *in, int64_t row)
{
    switch (fz_pick(in, 8)) {
    case 3: return row;
    case 4: return row < INT64_MAX - 8 ? row + 1 + (int64_t)fz_pick(in, 7) : row;
    case 5: return row - 1 - (int64_t)fz_pick(in, 2); /* rows overlapping, or negative */
    case 6: return huge[fz_pick(in, 4)];
    case 7: return fz_bit(in) ? -1 : INT64_MIN;
    default: return 0; /* the state's own size */
    }
}

/* One index: in range mostly; negative, the pad value, out of range or a repeat of an
 * earlier one now and then. */
static int64_t pick_index(fz_in *in, const pool_case *c, const int64_t *earlier, int64_t b)
{
    const int64_t n_rows = c->pool.n_rows;
    const unsigned k = fz_pick(in, 16);
    if (k < 9)
        return n_rows >= 1 ? (int64_t)(fz_u8(in) % (uint64_t)(n_rows < 256 ? n_rows : 256)) : 0;
    if (k == 9) return -1;
    if (k == 10) return fz_bit(in) ? -2 - (int64_t)fz_pick(in, 100) : INT64_MIN;
    if (k == 11) return c->pool.pad_value;
    if (k == 12) return n_rows;
    if (k == 13) return huge[fz_pick(in, 4)];
    return b ? earlier[fz_pick(in, (unsigned)b)] : 0;
}

/* An index array in the pool's index type; out receives what the library reads from it. */
static const void *make_indices(fz_in *in, pool_case *c, int64_t *out)
{
    if (c->n_req < 1 || c->n_req > MAX_REQUESTS || !fz_pick(in, 3)) return NULL;
    const bool narrow = c->pool.index_bits == 32;
    void *rows = fz_alloc_bytes((size_t)c->n_req * (narrow ? 4 : 8));
    for (int64_t b = 0; b < c->n_req; b++) {
        const int64_t v = pick_index(in, c, out, b);
        if (narrow) {
            ((int32_t *)rows)[b] = (int32_t)v;
            out[b] = (int32_t)v;
        } else {
            ((int64_t *)rows)[b] = v;
            out[b] = v;
        }
    }
    c->in[c->n_in] = rows;
    c->in_bytes[c->n_in++] = (size_t)c->n_req * (narrow ? 4 : 8);
    return rows;
}

static void pick_pool(fz_in *in, pool_case *c)
{
    static const int bits[] = {0, 64, 32, 32, 0, 64, 16, 1};
    linseq_state_pool *pl = &c->pool;
    pl->n_rows = pick_n_rows(in, c->n_req);
    pl->row_stride = pick_stride(in, c->row);
    const unsigned dt = fz_pick(in, 8);
    pl->dtype = dt < 6 ? (linseq_pool_dtype)(dt % 3) : (linseq_pool_dtype)(dt == 6 ? 3 : -1);
    pl->index_bits = bits[fz_pick(in, 8)];
    pl->has_pad_value = fz_bit(in);
    const unsigned pv = fz_pick(in, 4);
    pl->pad_value = pv == 0 ? fz_pick(in, 4) : pv == 1 ? -1 : pv == 2 ? INT64_MIN : huge[3];
    int64_t sources[MAX_REQUESTS];
    pl->src_rows = make_indices(in, c, sources);
    pl->dst_rows = make_indices(in, c, c->dst);
    for (int64_t b = 0; b < c->n_req && b < MAX_REQUESTS; b++) {
        c->src[b] = pl->src_rows ? sources[b] : b;
        const bool pad = c->src[b] < 0 || (pl->has_pad_value && c->src[b] == pl->pad_value);
        if (pad) c->src[b] = -1;
        c->dst[b] = pad ? -1 : pl->dst_rows ? c->dst[b] : c->src[b];
    }
    if (c->prefill && c->n_req >= 1 && c->n_req <= MAX_REQUESTS && fz_bit(in)) {
        c->has_initial = fz_alloc_bytes((size_t)c->n_req * sizeof(bool));
        for (int64_t b = 0; b < c->n_req; b++) c->has_initial[b] = fz_bit(in);
    }
    c->elem = pl->dtype == LINSEQ_POOL_F32 ? 4 : 2;
    c->stride = pl->row_stride ? pl->row_stride : c->row;
}

/* The block table and the tokens computed before the call, now and then for a prefill. */
static void pick_blocks(fz_in *in, pool_case *c)
{
    if (!c->prefill || c->n_req < 1 || c->n_req > MAX_REQUESTS || fz_pick(in, 3)) return;
    static const int64_t sizes[] = {1, 2, 3, 4, 8, 4, 0, -3};
    c->blocks = true;
    c->block_size = sizes[fz_pick(in, 8)];
    c->max_blocks = fz_pick(in, 8) == 7 ? -1 : (int64_t)fz_pick(in, MAX_BLOCKS + 1);
    const bool narrow = c->pool.index_bits == 32;
    const size_t elem = narrow ? 4 : 8,
                 n = (size_t)(c->n_req * (c->max_blocks > 0 ? c->max_blocks : 0));
    if (n) {
        void *rows = fz_alloc_bytes(n * elem);
        for (size_t i = 0; i < n; i++) {
            int64_t v = fz_pick(in, 3) ? -1 : pick_index(in, c, c->block_read, (int64_t)i);
            v = narrow ? (int32_t)v : v;
            c->block_read[i] = v;
            memcpy((char *)rows + i * elem, narrow ? (void *)&(int32_t){(int32_t)v} : (void *)&v,
                   elem);
        }
        c->block_rows = rows;
        c->in[c->n_in] = rows;
        c->in_bytes[c->n_in++] = n * elem;
    }
    if (!fz_bit(in)) return;
    void *computed = fz_alloc_bytes((size_t)c->n_req * elem);
    for (int64_t s = 0; s < c->n_req; s++) {
        const int64_t v = fz_pick(in, 16) == 15 ? -1 : (int64_t)fz_pick(in, 13);
        c->computed_read[s] = v;
        memcpy((char *)computed + (size_t)s * elem,
               narrow ? (void *)&(int32_t){(int32_t)v} : (void *)&v, elem);
    }
    c->computed = computed;
    c->in[c->n_in] = computed;
    c->in_bytes[c->n_in++] = (size_t)c->n_req * elem;
}

/* The tokens of sequence s in the call. */
static int64_t sequence_length(const pool_case *c, int64_t s)
{
    const int64_t *cu = c->op->varlen ? ls_op_cu_seqlens(c->op, c->problem) : NULL;
    int64_t T = 0;
    for (int i = 0; i < c->op->n_sizes; i++)
        if (!strcmp(c->op->sizes[i].name, "T")) T = ls_size_get(&c->op->sizes[i], c->problem);
    return cu ? cu[s + 1] - cu[s] : T;
}

/* Calls f(c, s, row) for each kept boundary of each live sequence (row -1: a boundary not
 * kept); false when a boundary or its row breaks the rules (linseq.h). */
static bool each_block_write(const pool_case *c, void (*f)(const pool_case *, int64_t, void *),
                             void *arg)
{
    if (!c->blocks) return true;
    if (c->block_size < 1 || c->max_blocks < 0) return false;
    for (int64_t s = 0; s < c->n_req; s++) {
        const int64_t computed = c->computed ? c->computed_read[s] : 0;
        if (computed < 0) return false;
        if (c->src[s] < 0) continue;
        const int64_t len = sequence_length(c, s);
        for (int64_t P = (computed / c->block_size + 1) * c->block_size; P < computed + len;
             P += c->block_size) {
            const int64_t j = P / c->block_size - 1;
            if (j >= c->max_blocks) return false;
            const int64_t r = c->block_read[s * c->max_blocks + j];
            if (r < 0 || (c->pool.has_pad_value && r == c->pool.pad_value)) continue;
            if (r >= c->pool.n_rows) return false;
            f(c, r, arg);
        }
    }
    return true;
}

typedef struct {
    int64_t rows[MAX_REQUESTS * 64];
    int n;
} row_list;

static void add_row(const pool_case *c, int64_t r, void *arg)
{
    (void)c;
    row_list *l = arg;
    if (l->n < (int)(sizeof l->rows / sizeof l->rows[0])) l->rows[l->n++] = r;
}

/* Every row the call writes (final states and boundaries); false when the blocks break a
 * rule. */
static bool rows_written(const pool_case *c, row_list *l)
{
    l->n = 0;
    for (int64_t b = 0; b < c->n_req && b < MAX_REQUESTS; b++)
        if (c->src[b] >= 0) add_row(c, c->dst[b], l);
    return each_block_write(c, add_row, l);
}

/* The problem's channel_first option, which a prefill with block states refuses. */
static bool channel_first(const pool_case *c)
{
    for (int i = 0; i < c->op->n_options; i++)
        if (!strcmp(c->op->options[i].field, "channel_first"))
            return *(const bool *)(c->problem + c->op->options[i].offset);
    return false;
}

/* The documented rules of the pool (linseq.h): breaking any must be refused. */
static bool pool_breaks_rules(const pool_case *c)
{
    const linseq_state_pool *pl = &c->pool;
    if ((unsigned)pl->dtype > LINSEQ_POOL_F16) return true;
    if (pl->index_bits != 0 && pl->index_bits != 32 && pl->index_bits != 64) return true;
    if (pl->n_rows < 1 || c->row < 0 || c->stride < c->row) return true;
    if (c->n_req < 1 || c->n_req > MAX_REQUESTS) return false; /* no indices to judge */
    for (int64_t b = 0; b < c->n_req; b++) {
        if (c->src[b] < 0) continue;
        if (c->src[b] >= pl->n_rows || c->dst[b] < 0 || c->dst[b] >= pl->n_rows) return true;
    }
    static row_list l;
    if (!rows_written(c, &l)) return true;
    for (int i = 0; i < l.n; i++)
        for (int e = 0; e < i; e++)
            if (l.rows[e] == l.rows[i]) return true;
    return c->blocks && channel_first(c);
}

/* The bytes of the pool as described, or -1 when that is not a sane size. */
static int64_t described_bytes(const pool_case *c)
{
    const linseq_state_pool *pl = &c->pool;
    int64_t n;
    if (pl->n_rows < 1 || c->row < 0 || c->stride < c->row ||
        __builtin_mul_overflow(pl->n_rows - 1, c->stride, &n) ||
        __builtin_add_overflow(n, c->row, &n) || __builtin_mul_overflow(n, (int64_t)c->elem, &n))
        return -1;
    return n;
}

/* A pool no address range holds (its bytes overflow int64 or come near): refused too. */
static bool pool_overflows(const pool_case *c)
{
    const linseq_state_pool *pl = &c->pool;
    if (pl->n_rows < 1 || c->row < 0 || c->stride < c->row) return false; /* refused anyway */
    const int64_t bytes = described_bytes(c);
    return bytes < 0 || bytes > INT64_MAX / 2;
}

/* The pool's buffer: exactly its bytes, every element a value in [-1, 1] in the pool's type
 * (the gaps between rows included); a misaligned one now and then. False: too large to run,
 * and the pool need not be refused. */
static bool make_pool_data(fz_in *in, pool_case *c)
{
    const int64_t bytes = described_bytes(c);
    const bool fits = bytes >= 0 && bytes <= POOL_MAX_BYTES;
    if (!fits && !c->must_fail) return false;
    c->pool_bytes = fits ? (size_t)bytes : 0;
    const bool misaligned = fz_pick(in, 16) == 15; /* 0 (the input used up): aligned */
    if (misaligned) c->must_fail = true;
    unsigned char *data = (unsigned char *)fz_alloc_bytes(c->pool_bytes + misaligned) + misaligned;
    const size_t n = c->pool_bytes / c->elem;
    float *f = fz_alloc(n);
    bool nice = true;
    fz_fill(in, f, n, FZ_SMALL, &nice);
    for (size_t i = 0; i < n; i++) {
        const uint16_t h =
            c->pool.dtype == LINSEQ_POOL_BF16 ? ls_f32_to_bf16(f[i]) : ls_f32_to_f16(f[i]);
        if (c->elem == 4)
            memcpy(data + 4 * i, &f[i], 4);
        else
            memcpy(data + 2 * i, &h, 2);
    }
    c->pool.data = data;
    return true;
}

/* ---------------------------------------------------------------------------------- */
/* The calls and their checks                                                         */
/* ---------------------------------------------------------------------------------- */

static linseq_status call(const pool_case *c, int threads, const linseq_state_pool *pool,
                          float *const *out)
{
    linseq_exec ex = c->exec;
    ex.threads = threads;
    if (c->blocks)
        return linseq_op_forward_pool_blocks(c->op->name, c->problem, &ex, pool, c->has_initial,
                                             c->block_size, c->block_rows, c->max_blocks,
                                             c->computed, out);
    if (c->prefill)
        return linseq_op_forward_pool(c->op->name, c->problem, &ex, pool, c->has_initial, out);
    return linseq_op_decode_pool(c->op->name, c->problem, &ex, pool, out);
}

static bool row_written(const pool_case *c, int64_t r)
{
    static row_list l;
    rows_written(c, &l);
    for (int i = 0; i < l.n; i++)
        if (l.rows[i] == r) return true;
    return false;
}

/* Refused: every byte as it was. Succeeded: only the live requests' destination rows may
 * differ; the other rows and the gaps past each row keep their bytes. */
static void check_pool_bytes(const pool_case *c, const unsigned char *now,
                             const unsigned char *before, linseq_status st)
{
    if (st != LINSEQ_OK) {
        if (memcmp(now, before, c->pool_bytes) != 0)
            fz_die("a refused call (status %d) wrote the pool", (int)st);
        return;
    }
    const size_t row_bytes = (size_t)c->row * c->elem, stride_bytes = (size_t)c->stride * c->elem;
    if (stride_bytes == 0) { /* states of no element (a conv of width 1): nothing to write */
        if (memcmp(now, before, c->pool_bytes) != 0) fz_die("a pool of empty rows was written");
        return;
    }
    for (int64_t r = 0; r < c->pool.n_rows; r++) {
        const size_t at = (size_t)r * stride_bytes;
        const size_t gap = r + 1 < c->pool.n_rows ? stride_bytes - row_bytes : 0;
        if (!row_written(c, r) && memcmp(now + at, before + at, row_bytes) != 0)
            fz_die("pool row %lld, which no request writes, was written", (long long)r);
        if (memcmp(now + at + row_bytes, before + at + row_bytes, gap) != 0)
            fz_die("the gap past pool row %lld was written", (long long)r);
    }
}

/* A decode's padding request has outputs 0. */
static void check_padding_outputs(const pool_case *c, float *const *out)
{
    for (int k = 0; !c->prefill && k < LS_OP_MAX_OUT; k++) {
        if (!out[k] || k == c->state_slot) continue;
        const size_t per = c->out_bytes[k] / sizeof(float) / (size_t)c->n_req;
        for (int64_t b = 0; b < c->n_req; b++)
            for (size_t i = 0; c->src[b] < 0 && i < per; i++)
                if (out[k][(size_t)b * per + i] != 0.0f)
                    fz_die("padding request %lld has output %d = %g", (long long)b, k,
                           (double)out[k][(size_t)b * per + i]);
    }
}

/* FUZZ_TRACE=1: the pool as decoded, to see what a seed or a crash input holds. */
static void trace_pool(const pool_case *c)
{
    if (!getenv("FUZZ_TRACE")) return;
    const linseq_state_pool *pl = &c->pool;
    fprintf(stderr,
            "%s %s: %lld requests, state %lld; pool rows %lld stride %lld dtype %d bits %d "
            "pad %d:%lld%s%s%s must_fail %d\n",
            c->op->name, c->prefill ? "prefill" : "decode", (long long)c->n_req, (long long)c->row,
            (long long)pl->n_rows, (long long)pl->row_stride, (int)pl->dtype, pl->index_bits,
            (int)pl->has_pad_value, (long long)pl->pad_value, pl->src_rows ? " src_rows" : "",
            pl->dst_rows ? " dst_rows" : "", c->has_initial ? " has_initial" : "",
            (int)c->must_fail);
    for (int64_t b = 0; b < c->n_req && b < MAX_REQUESTS; b++)
        fprintf(stderr, "  request %lld: row %lld -> %lld\n", (long long)b, (long long)c->src[b],
                (long long)c->dst[b]);
}

/* The call with one thread under fuzz_util's contract, and the pool's own checks. */
static linseq_status run_checked(const pool_case *c, const unsigned char *before)
{
    trace_pool(c);
    fz_call_begin(c->blocks    ? "linseq_op_forward_pool_blocks"
                  : c->prefill ? "linseq_op_forward_pool"
                               : "linseq_op_decode_pool");
    for (int i = 0; i < c->n_in; i++) fz_arg_in(c->in[i], c->in_bytes[i]);
    if (c->has_initial) fz_arg_in(c->has_initial, (size_t)c->n_req * sizeof(bool));
    for (int k = 0; k < LS_OP_MAX_OUT; k++) {
        if (k == c->state_slot) /* ignored: never written */
            fz_arg_in(c->out[k], c->out_bytes[k]);
        else
            fz_arg_out(c->out[k], c->out_bytes[k]);
    }
    const linseq_status st = fz_call_end(call(c, 1, &c->pool, c->out), true, c->must_fail);
    check_pool_bytes(c, c->pool.data, before, st);
    if (st == LINSEQ_OK) check_padding_outputs(c, c->out);
    return st;
}

/* The same call with three threads, from the same pool: the same status, pool and outputs. */
static void check_threads(const pool_case *c, const unsigned char *before, linseq_status st)
{
    const size_t skew = (uintptr_t)c->pool.data % 2; /* misaligned as the first */
    unsigned char *data = (unsigned char *)fz_alloc_bytes(c->pool_bytes + skew) + skew;
    memcpy(data, before, c->pool_bytes);
    linseq_state_pool pool = c->pool;
    pool.data = data;
    float *out[LS_OP_MAX_OUT] = {0};
    for (int k = 0; k < LS_OP_MAX_OUT; k++)
        if (c->out[k]) out[k] = fz_alloc(c->out_bytes[k] / sizeof(float));
    const linseq_status st3 = call(c, 3, &pool, out);
    if (st3 != st) fz_die("status %d with one thread, %d with three", (int)st, (int)st3);
    check_pool_bytes(c, data, before, st3);
    if (st != LINSEQ_OK) return;
    if (memcmp(data, c->pool.data, c->pool_bytes) != 0)
        fz_die("the pool differs between one thread and three");
    for (int k = 0; k < LS_OP_MAX_OUT; k++)
        if (c->out[k] && k != c->state_slot)
            fz_expect_same(c->out[k], out[k], c->out_bytes[k] / sizeof(float),
                           "outputs for one thread and three");
}

/* The option "state_tap_major" of an op that has it (the conv: states [N,D,L] or [N,L,D]). */
static const ls_option_desc *tap_major_option(const ls_op *op)
{
    for (int i = 0; i < op->n_options; i++)
        if (!strcmp(op->options[i].key, "state_tap_major")) return &op->options[i];
    return NULL;
}

/* Each row's [a][b] elements of `from` as [b][a] in `to` (the bytes past the rows copied). */
static void transpose_rows(const pool_case *c, unsigned char *to, const unsigned char *from,
                           int64_t a, int64_t b)
{
    memcpy(to, from, c->pool_bytes);
    for (int64_t r = 0; r < c->pool.n_rows; r++) {
        const size_t at = (size_t)(r * c->stride) * c->elem;
        for (int64_t i = 0; i < a; i++)
            for (int64_t j = 0; j < b; j++)
                memcpy(to + at + (size_t)(j * a + i) * c->elem,
                       from + at + (size_t)(i * b + j) * c->elem, c->elem);
    }
}

/* The same call with the state layout flipped (an op with state_tap_major) from the pool with
 * every row transposed: the same status and outputs, and the pool after it transposed. */
static void check_other_layout(const pool_case *c, const unsigned char *before, linseq_status st)
{
    const ls_option_desc *o = tap_major_option(c->op);
    const ls_tensor_desc *t = ls_op_tensor_named(c->op, LS_ROLE_INPUT, c->op->decode_state);
    int64_t d[LS_OP_MAX_DIMS];
    if (!o || c->row < 1 || t->shape(c->problem, d) != 3 ||
        described_bytes(c) != (int64_t)c->pool_bytes) /* a refused pool without its bytes */
        return;
    pool_case flipped = *c;
    bool tap_major;
    memcpy(&tap_major, c->problem + o->offset, sizeof tap_major);
    tap_major = !tap_major;
    memcpy(flipped.problem + o->offset, &tap_major, sizeof tap_major);
    const size_t skew = (uintptr_t)c->pool.data % 2;
    unsigned char *data = (unsigned char *)fz_alloc_bytes(c->pool_bytes + skew) + skew;
    transpose_rows(c, data, before, d[1], d[2]);
    flipped.pool.data = data;
    float *out[LS_OP_MAX_OUT] = {0};
    for (int k = 0; k < LS_OP_MAX_OUT; k++)
        if (c->out[k]) out[k] = fz_alloc(c->out_bytes[k] / sizeof(float));
    const linseq_status st2 = call(&flipped, 1, &flipped.pool, out);
    if (st2 != st) fz_die("status %d in one state layout, %d in the other", (int)st, (int)st2);
    if (st != LINSEQ_OK) return;
    unsigned char *back = fz_alloc_bytes(c->pool_bytes);
    transpose_rows(c, back, data, d[2], d[1]);
    if (memcmp(back, c->pool.data, c->pool_bytes) != 0)
        fz_die("the pool differs between the state layouts (rows transposed)");
    for (int k = 0; k < LS_OP_MAX_OUT; k++)
        if (c->out[k] && k != c->state_slot)
            fz_expect_same(c->out[k], out[k], c->out_bytes[k] / sizeof(float),
                           "outputs in one state layout and the other");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const int chunks[] = {0, 16, 32, 64, 128};
    static pool_case c;
    memset(&c, 0, sizeof c);
    c.state_slot = -1;
    fz_in in;
    fz_init(&in, data, size);
    c.op = pick_op(&in);
    c.prefill = fz_bit(&in);
    make_problem(&in, &c);
    state_shape(&c);
    c.exec.mode = (linseq_mode)fz_pick(&in, 3);
    c.exec.chunk_size = chunks[fz_pick(&in, 5)];
    bool run = make_tensors(&in, &c, in.rng) && (c.n_req <= MAX_REQUESTS || c.bad_problem);
    if (run) {
        pick_pool(&in, &c);
        pick_blocks(&in, &c);
        c.must_fail = c.bad_problem || pool_breaks_rules(&c) || pool_overflows(&c);
        run = make_pool_data(&in, &c);
    }
    if (run) {
        unsigned char *before = fz_alloc_bytes(c.pool_bytes);
        memcpy(before, c.pool.data, c.pool_bytes);
        const linseq_status st = run_checked(&c, before);
        check_threads(&c, before, st);
        check_other_layout(&c, before, st);
    }
    fz_free_all();
    return 0;
}
