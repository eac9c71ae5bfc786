/* KDA entry points: validate the problem, split it into (sequence, value head) items, run
 * each item with the recurrent or chunked kernel, store the states. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/parallel.h"
#include "core/status.h"
#include "core/validate.h"
#include "kda/kda_chunk.h"
#include "cuda/cuda_entry.h"
#include "kda/kda_internal.h"
#include "kda/kda_kernels.h"
#include "kda/kda_op.h"
#include "optable/check.h"
#include "simd/state_rows.h"

/* ---------------------------------------------------------------------------------------- */
/* Per-token inputs and states, shared by both kernels                                        */
/* ---------------------------------------------------------------------------------------- */

void kda_state_load(const kda_plan *pl, const float *src, float *S)
{
    const int64_t K = pl->p->K, V = pl->p->V;
    if (!src) {
        memset(S, 0, (size_t)(K * V) * sizeof *S);
    } else if (!pl->p->state_v_first) {
        memcpy(S, src, (size_t)(K * V) * sizeof *S);
    } else {
        for (int64_t j = 0; j < V; j++)
            for (int64_t i = 0; i < K; i++) S[i * V + j] = src[j * K + i];
    }
}

void kda_state_store(const kda_plan *pl, const float *S, float *dst)
{
    const int64_t K = pl->p->K, V = pl->p->V;
    if (!pl->p->state_v_first) {
        if (dst != S) memcpy(dst, S, (size_t)(K * V) * sizeof *S);
    } else {
        for (int64_t j = 0; j < V; j++)
            for (int64_t i = 0; i < K; i++) dst[j * K + i] = S[i * V + j];
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Validation                                                                                 */
/* ---------------------------------------------------------------------------------------- */

void kda_exec_plan(kda_plan *pl, const linseq_exec *exec)
{
    const linseq_mode mode = exec ? exec->mode : LINSEQ_MODE_DEFAULT;
    const int chunk = exec && exec->chunk_size ? exec->chunk_size : 64;
    pl->chunk = mode != LINSEQ_MODE_RECURRENT ? chunk : 0;
    pl->segment = chunk;
    pl->bf16 = ls_token_bytes(exec) == 2;
}

/* Everything but the tensors' pointers: the problem as op describes it (sizes, enums, n_seqs,
 * the exec), KDA's own rules on its options, and the plan. */
linseq_status kda_positive_g_status(const char *fn, const kda_plan *pl)
{
    if (!pl->positive_g || !atomic_load(pl->positive_g)) return LINSEQ_OK;
    return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                   "'g' holds a positive log decay; expected g <= 0 (e^g a decay factor in "
                   "(0, 1], e.g. logsigmoid of the gate, or the raw gate input with "
                   "gate_in_kernel). Found while computing: the outputs hold undefined values");
}

linseq_status kda_check_problem(const char *fn, const ls_op *op, const linseq_kda_problem *p,
                                const linseq_exec *exec, bool cpu_bf16, kda_plan *pl)
{
    linseq_status st;
    if ((st = ls_op_check_problem(fn, op, p, exec, cpu_bf16))) return st;
    const int64_t HV = p->HV ? p->HV : p->H;
    if (HV % p->H != 0)
        return ls_fail(fn, LINSEQ_ERR_SHAPE_MISMATCH,
                       "HV = %lld is not a multiple of H = %lld (value head hv reads qk head "
                       "hv / (HV/H))",
                       (long long)HV, (long long)p->H);
    if (p->decay == LINSEQ_DECAY_NONE && p->g)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "'g' is given but decay is LINSEQ_DECAY_NONE; set decay to PER_HEAD "
                       "([B,T,HV]) or PER_CHANNEL ([B,T,HV,K])");
    if (p->decay == LINSEQ_DECAY_NONE && p->gate_in_kernel)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "gate_in_kernel needs a decay kind (PER_HEAD or PER_CHANNEL)");
    if (!p->gate_in_kernel && (p->A_log || p->dt_bias || p->lower_bound != 0.0f))
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "A_log, dt_bias or lower_bound is set but gate_in_kernel is false");
    if (!(p->lower_bound <= 0.0f) || isinf(p->lower_bound))
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "lower_bound = %g; expected a finite value <= 0 (0 = default gate)",
                       (double)p->lower_bound);
    if (!p->beta && op != &ls_op_kda) /* the segment summaries are the delta rule's */
        return ls_fail(fn, LINSEQ_ERR_NULL_POINTER,
                       "'beta' is NULL; the segment summaries need the delta rule's beta "
                       "[B,T,HV] (gated linear attention has no context-parallel form here)");
    if (!p->beta && ls_on_cuda(exec))
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "'beta' is NULL (gated linear attention, no delta rule): the CUDA "
                       "backend runs the delta rule only; pass beta, or run on the CPU");
    if (!(p->l2norm_eps >= 0.0f) || isinf(p->l2norm_eps))
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "l2norm_eps = %g; expected a finite value >= 0 (0 = 1e-6)",
                       (double)p->l2norm_eps);
    if (p->l2norm_eps != 0.0f && ls_on_cuda(exec))
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "l2norm_eps = %g: the CUDA backend uses the default 1e-6 only",
                       (double)p->l2norm_eps);
    if (!isfinite(p->scale))
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "scale = %g; expected a finite value (0 = K^-0.5)", (double)p->scale);
    const int64_t n_seqs = p->cu_seqlens ? p->n_seqs : p->B;
    pl->p = p;
    pl->HV = HV;
    pl->group = HV / p->H;
    pl->n_seqs = n_seqs;
    pl->gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1;
    pl->delta = p->beta != NULL;
    pl->scale = p->scale != 0.0f ? p->scale : (float)(1.0 / sqrt((double)p->K));
    pl->l2norm_eps = ls_kda_l2norm_eps(p->l2norm_eps);
    pl->chunk = 0;
    pl->segment = 64;
    pl->bf16 = false;
    pl->bf16_products = pl->bf16_grad_products = pl->bf16_dot = false;
    pl->positive_g = NULL;
    return LINSEQ_OK;
}

/* Sizes of the per-thread working set, checked so that no allocation size can wrap. */
static linseq_status check_workspace(const char *fn, const kda_plan *pl, size_t *bytes)
{
    const linseq_kda_problem *p = pl->p;
    int64_t kv, rows, extra;
    int64_t c = pl->chunk ? pl->chunk : 1;
    /* this runs before the tensors bound K and V, so even their sum may overflow */
    if (!ls_mul_ok(&kv, 2, p->K, p->V) || __builtin_add_overflow(p->K, p->V, &rows) ||
        __builtin_add_overflow(rows, c, &rows) || !ls_mul_ok(&extra, 2, c, rows) ||
        kv > (int64_t)(PTRDIFF_MAX / 64) || extra > (int64_t)(PTRDIFF_MAX / 64))
        return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW,
                       "the working state K*V = %lld*%lld is too large to allocate",
                       (long long)p->K, (long long)p->V);
    size_t s = (size_t)kv * sizeof(float);
    s = (s + 63) & ~(size_t)63;
    *bytes = s + (pl->chunk ? kda_chunk_ws_layout(pl, NULL, NULL)
                            : kda_recurrent_scratch_floats(pl) * sizeof(float));
    *bytes = (*bytes + 63) & ~(size_t)63;
    return LINSEQ_OK;
}

/* About 7 K V flops per token and value head in either mode. */
static double kda_work(const kda_plan *pl, int64_t tokens)
{
    return 7.0 * (double)tokens * (double)pl->HV * (double)pl->p->K * (double)pl->p->V;
}

/* The per-thread workspace times the most threads the call may use fits the address space:
 * a size check, so it runs with the others, before the aliasing check (the allocation checks
 * the product of the threads it really uses again). */
static linseq_status check_workspace_threads(const char *fn, const kda_plan *pl,
                                             const linseq_exec *exec, int64_t tokens,
                                             size_t ws_stride)
{
    const int threads = ls_resolve_threads(exec, INT64_MAX, kda_work(pl, tokens));
    int64_t total;
    if (ws_stride > (size_t)PTRDIFF_MAX ||
        !ls_mul_ok(&total, 2, (int64_t)ws_stride, (int64_t)threads))
        return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW,
                       "the workspace (%d x %zu bytes) is larger than the address space", threads,
                       ws_stride);
    return LINSEQ_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Forward                                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    const kda_plan *pl;
    float *o, *ht;
    unsigned char *ws;
    size_t ws_stride, state_bytes;
    const kda_kernels *kern;
    float *saved;            /* training: the saved blocks (after the header), or NULL */
    const int64_t *saved_at; /* their offsets per item */
} forward_ctx;

/* Recurrent mode, keeping the state before every segment of pl->segment tokens. */
static void recurrent_item_saving(const forward_ctx *c, int64_t start, int64_t len, int64_t hv,
                                  float *S, void *scratch, float *save)
{
    const kda_plan *pl = c->pl;
    const int64_t KV = pl->p->K * pl->p->V, seg = pl->segment;
    for (int64_t t0 = 0; t0 < len; t0 += seg) {
        memcpy(save + t0 / seg * KV, S, (size_t)KV * sizeof(float));
        c->kern->recurrent_item(pl, start + t0, len - t0 < seg ? len - t0 : seg, hv, S, c->o,
                                scratch, 0, pl->p->V);
    }
}

static void forward_item(void *ctx, int64_t item, int thread)
{
    const forward_ctx *c = ctx;
    const kda_plan *pl = c->pl;
    const linseq_kda_problem *p = pl->p;
    const int64_t n = item / pl->HV, hv = item % pl->HV, KV = p->K * p->V;
    int64_t start, len;
    kda_seq_range(pl, n, &start, &len);

    float *S = (float *)(void *)(c->ws + (size_t)thread * c->ws_stride);
    void *scratch = c->ws + (size_t)thread * c->ws_stride + c->state_bytes;
    kda_state_load(pl, p->h0 ? p->h0 + (n * pl->HV + hv) * KV : NULL, S);
    float *save = c->saved ? c->saved + c->saved_at[item] : NULL;
    if (pl->chunk)
        c->kern->chunk_item(pl, start, len, hv, S, c->o, scratch, save);
    else if (save)
        recurrent_item_saving(c, start, len, hv, S, scratch, save);
    else
        c->kern->recurrent_item(pl, start, len, hv, S, c->o, scratch, 0, p->V);
    if (c->ht) kda_state_store(pl, S, c->ht + (n * pl->HV + hv) * KV);
}

/* Fewer items than threads (one long sequence): the threads share each item. The columns of
 * the state are independent in every step that touches it, so they split the columns; the
 * chunk-local matrices, which do not depend on the state, are built for a window of chunks
 * in parallel first. Every column sees the arithmetic of the one-thread path: same bits. */
typedef struct {
    const kda_plan *pl;
    const kda_kernels *kern;
    int64_t tok0, len, hv;
    float *S, *o;
    int64_t col_width;       /* columns per range */
    unsigned char *chunk_ws; /* window of chunk workspaces */
    size_t chunk_ws_bytes;
    int64_t window_first; /* first chunk of the window */
    int64_t chunk;        /* the chunk the column ranges work on */
    float *scratch;       /* recurrent: one scratch per column range */
    size_t scratch_floats;
    float *save; /* training: this item's saved block, or NULL */
} split_ctx;

static void split_range(const split_ctx *c, int64_t r, int64_t *j0, int64_t *j1)
{
    *j0 = r * c->col_width;
    *j1 = *j0 + c->col_width < c->pl->p->V ? *j0 + c->col_width : c->pl->p->V;
}

/* The columns [j0, j1) of the state into the saved state s of the current item. */
static void save_columns(const split_ctx *c, int64_t s, int64_t j0, int64_t j1)
{
    const int64_t K = c->pl->p->K, V = c->pl->p->V;
    float *dst = c->save + s * K * V;
    for (int64_t i = 0; i < K; i++)
        memcpy(dst + i * V + j0, c->S + i * V + j0, (size_t)(j1 - j0) * sizeof(float));
}

static void split_recurrent_range(void *ctx, int64_t r, int thread)
{
    (void)thread;
    const split_ctx *c = ctx;
    int64_t j0, j1;
    split_range(c, r, &j0, &j1);
    float *scratch = c->scratch + r * (int64_t)c->scratch_floats;
    const int64_t seg = c->save ? c->pl->segment : c->len;
    for (int64_t t0 = 0; t0 < c->len; t0 += seg) {
        if (c->save) save_columns(c, t0 / seg, j0, j1);
        c->kern->recurrent_item(c->pl, c->tok0 + t0, c->len - t0 < seg ? c->len - t0 : seg, c->hv,
                                c->S, c->o, scratch, j0, j1);
    }
}

static void split_prepare_chunk(void *ctx, int64_t k, int thread)
{
    (void)thread;
    const split_ctx *c = ctx;
    const int64_t C = c->pl->chunk, c0 = (c->window_first + k) * C;
    kda_chunk_ws w = {0};
    kda_chunk_ws_layout(c->pl, c->chunk_ws + (size_t)k * c->chunk_ws_bytes, &w);
    c->kern->chunk_prepare(c->pl, &w, c->tok0 + c0, c->len - c0 < C ? c->len - c0 : C, c->hv);
}

static void split_state_range(void *ctx, int64_t r, int thread)
{
    (void)thread;
    const split_ctx *c = ctx;
    const int64_t C = c->pl->chunk, c0 = c->chunk * C, Lc = c->len - c0 < C ? c->len - c0 : C;
    kda_chunk_ws w = {0};
    kda_chunk_ws_layout(c->pl,
                        c->chunk_ws + (size_t)(c->chunk - c->window_first) * c->chunk_ws_bytes, &w);
    int64_t j0, j1;
    split_range(c, r, &j0, &j1);
    const int64_t first = c->tok0 + c0;
    if (c->save) {
        const int64_t KV = c->pl->p->K * c->pl->p->V;
        save_columns(c, c->chunk, j0, j1);
        w.vnew = c->save + (c->len + C - 1) / C * KV + c0 * c->pl->p->V;
    }
    c->kern->chunk_solve(c->pl, &w, c->S, first, Lc, c->hv, j0, j1);
    if (c->o) c->kern->chunk_output(c->pl, &w, c->S, first, Lc, c->hv, c->o, j0, j1);
    c->kern->chunk_advance(c->pl, &w, c->S, Lc, j0, j1);
}

/* Runs every item with all threads; fails (nothing written) when the workspace cannot be
 * allocated. */
static linseq_status forward_split(const char *fn, const kda_plan *pl, const kda_kernels *kern,
                                   int threads, float *o, float *ht, float *saved,
                                   const int64_t *saved_at)
{
    const linseq_kda_problem *p = pl->p;
    const int64_t KV = p->K * p->V;
    /* column ranges of whole 32-float panels, at most one per thread */
    int64_t width = (p->V + threads - 1) / threads;
    width = (width + 31) / 32 * 32;
    const int64_t n_ranges = (p->V + width - 1) / width;
    /* two chunks per thread, but no more than the longest sequence has: a large thread
     * count must not allocate workspaces for chunks that do not exist */
    const int64_t longest = ls_longest_sequence(p->cu_seqlens, pl->n_seqs, p->T);
    const int64_t max_chunks = pl->chunk ? (longest + pl->chunk - 1) / pl->chunk : 0;
    const int64_t window = 2 * (int64_t)threads < max_chunks ? 2 * (int64_t)threads : max_chunks;
    split_ctx c = {.pl = pl, .kern = kern, .o = o, .col_width = width};
    c.chunk_ws_bytes = pl->chunk ? (kda_chunk_ws_layout(pl, NULL, NULL) + 63) & ~(size_t)63 : 0;
    c.scratch_floats = (kda_recurrent_scratch_floats(pl) + 15) & ~(size_t)15;
    float *state = NULL, *scratch = NULL;
    unsigned char *chunk_ws = NULL;
    linseq_status st;
    if ((st = ls_alloc_blocks(fn, (size_t)KV * sizeof(float), 1, (void **)&state)) ||
        (window && (st = ls_alloc_blocks(fn, c.chunk_ws_bytes, window, (void **)&chunk_ws))) ||
        (st = ls_alloc_blocks(fn, c.scratch_floats * sizeof(float), n_ranges, (void **)&scratch))) {
        free(state);
        free(chunk_ws);
        return st;
    }
    c.S = state;
    c.chunk_ws = chunk_ws;
    c.scratch = scratch;
    for (int64_t item = 0; item < pl->n_seqs * pl->HV; item++) {
        const int64_t n = item / pl->HV;
        c.hv = item % pl->HV;
        kda_seq_range(pl, n, &c.tok0, &c.len);
        kda_state_load(pl, p->h0 ? p->h0 + (n * pl->HV + c.hv) * KV : NULL, state);
        c.save = saved ? saved + saved_at[item] : NULL;
        if (!pl->chunk) {
            ls_parallel_for(n_ranges, threads, split_recurrent_range, &c);
        } else {
            const int64_t n_chunks = (c.len + pl->chunk - 1) / pl->chunk;
            for (c.window_first = 0; c.window_first < n_chunks; c.window_first += window) {
                const int64_t in_window =
                    n_chunks - c.window_first < window ? n_chunks - c.window_first : window;
                ls_parallel_for(in_window, threads, split_prepare_chunk, &c);
                for (c.chunk = c.window_first; c.chunk < c.window_first + in_window; c.chunk++)
                    ls_parallel_for(n_ranges, threads, split_state_range, &c);
            }
        }
        if (ht) kda_state_store(pl, state, ht + (n * pl->HV + c.hv) * KV);
    }
    free(state);
    free(chunk_ws);
    free(scratch);
    return LINSEQ_OK;
}

/* The forward, and with saved != NULL the training forward that also fills saved. */
static bool forward_is_one_step(const kda_plan *pl, const float *ht, const void *saved);
static linseq_status forward_one_step(const char *fn, const kda_plan *pl, const linseq_exec *exec,
                                      float *o, float *ht, ls_isa isa);

static linseq_status forward_impl(const char *fn, const linseq_kda_problem *problem,
                                  const linseq_exec *exec, float *o, float *ht, void *saved,
                                  size_t saved_bytes, const kda_kernels *kern)
{
    ls_clear_error();
    kda_plan pl;
    linseq_status st;
    /* the CPU kernels read and write bf16 per-token tensors, but the training forward's
     * saved block feeds a backward that takes float32 */
    if ((st = kda_check_problem(fn, &ls_op_kda, problem, exec, !saved, &pl))) return st;
    const linseq_kda_problem *p = problem;

    if (saved && ls_on_cuda(exec))
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "the saved training block is CPU-only; on CUDA call linseq_kda_forward "
                       "and linseq_kda_backward");
    const size_t te = ls_token_bytes(exec);
    ls_args a = {.fn = fn};
    float *const out[] = {o, ht};
    if ((st = ls_op_add_tensors(&a, &ls_op_kda, p, LS_ROLE_INPUT, p, te)) ||
        (st = ls_op_add_tensors(&a, &ls_op_kda, p, LS_ROLE_OUTPUT, out, te)))
        return st;
    /* a byte buffer that holds floats after its header */
    if (saved)
        ls_arg(&a, "saved", "saved_bytes", saved, true, LS_OUT, 1, 1, (int64_t)saved_bytes)->align =
            sizeof(float);
    kda_exec_plan(&pl, exec);
    /* bf16 products in the chunked forward, the training forward's too: what it saves (the
     * chunk-start states and the deltas) is state-side, float32 products either way */
    pl.bf16_products = exec && exec->products == LINSEQ_PRODUCTS_BF16 && pl.chunk;
    pl.bf16_dot = pl.bf16_products && kern->isa == LS_ISA_AVX512 && ls_cpu_has_bf16_dot();
    size_t ws_stride;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = check_workspace(fn, &pl, &ws_stride)) ||
        (st = check_workspace_threads(fn, &pl, exec, ls_mul_sat(p->B, p->T), ws_stride)) ||
        (st = ls_args_validate(&a)))
        return st;
    if (ls_on_cuda(exec)) {
        const ls_cuda_kda_args dev = {.p = p, .HV = pl.HV, .scale = pl.scale, .chunk = pl.chunk};
        return ls_cuda_entry_kda_forward(fn, &dev, exec, o, ht);
    }
    if (p->cu_seqlens && (st = ls_check_cu_seqlens(fn, p->cu_seqlens, p->n_seqs, p->B, p->T)))
        return st;
    if (forward_is_one_step(&pl, ht, saved))
        return forward_one_step(fn, &pl, exec, o, ht, kern->isa);
    const int64_t n_items = pl.n_seqs * pl.HV;
    int64_t *saved_at = NULL;
    if (saved && (st = kda_saved_offsets(fn, &pl, saved_bytes, &saved_at))) return st;
    float *saved_data =
        saved ? (float *)(void *)((unsigned char *)saved + KDA_SAVED_HEADER_BYTES) : NULL;
    atomic_int positive_g = 0; /* the kernels' pass over g (kda_decay_row) */
    pl.positive_g = &positive_g;
    const int all_threads = ls_resolve_threads(exec, INT64_MAX, kda_work(&pl, p->B * p->T));
    if (n_items < all_threads && p->V > 32) {
        st = forward_split(fn, &pl, kern, all_threads, o, ht, saved_data, saved_at);
        if (!st) st = kda_positive_g_status(fn, &pl);
        if (!st && saved) kda_saved_write_header(&pl, saved);
        free(saved_at);
        return st;
    }
    const int threads = ls_resolve_threads(exec, n_items, kda_work(&pl, p->B * p->T));
    unsigned char *ws;
    if ((st = ls_alloc_blocks(fn, ws_stride, threads, (void **)&ws))) {
        free(saved_at);
        return st;
    }
    forward_ctx c = {.pl = &pl,
                     .o = o,
                     .ht = ht,
                     .ws = ws,
                     .ws_stride = ws_stride,
                     .state_bytes = ((size_t)(p->K * p->V) * sizeof(float) + 63) & ~(size_t)63,
                     .kern = kern,
                     .saved = saved_data,
                     .saved_at = saved_at};
    ls_parallel_for(n_items, threads, forward_item, &c);
    /* a saved block of a refused call keeps no header: a backward refuses it */
    st = kda_positive_g_status(fn, &pl);
    if (!st && saved) kda_saved_write_header(&pl, saved);
    free(ws);
    free(saved_at);
    return st;
}

linseq_status ls_kda_forward_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                 float *o, float *ht, ls_isa isa)
{
    return forward_impl("linseq_kda_forward", problem, exec, o, ht, NULL, 0, ls_kda_kernels(isa));
}

linseq_status linseq_kda_forward(const linseq_kda_problem *problem, const linseq_exec *exec,
                                 float *o, float *ht)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_kda_forward", &isa);
    return st ? st : ls_kda_forward_isa(problem, exec, o, ht, isa);
}

linseq_status linseq_kda_forward_train(const linseq_kda_problem *problem, const linseq_exec *exec,
                                       float *o, float *ht, void *saved, size_t saved_bytes)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_kda_forward_train", &isa);
    return st ? st : ls_kda_forward_train_isa(problem, exec, o, ht, saved, saved_bytes, isa);
}

linseq_status ls_kda_forward_train_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                       float *o, float *ht, void *saved, size_t saved_bytes,
                                       ls_isa isa)
{
    static const char fn[] = "linseq_kda_forward_train";
    if (!saved) {
        ls_clear_error();
        return ls_fail(fn, LINSEQ_ERR_NULL_POINTER,
                       "argument 'saved' is NULL; expected linseq_kda_saved_size bytes");
    }
    return forward_impl(fn, problem, exec, o, ht, saved, saved_bytes, ls_kda_kernels(isa));
}

linseq_status linseq_kda_saved_size(const linseq_kda_problem *problem, const linseq_exec *exec,
                                    size_t *bytes)
{
    static const char fn[] = "linseq_kda_saved_size";
    ls_clear_error();
    kda_plan pl;
    ls_isa isa; /* the size does not depend on it, but a bad LINSEQ_ISA is refused everywhere */
    linseq_status st;
    if ((st = ls_isa_resolve(fn, &isa))) return st;
    if ((st = kda_check_problem(fn, &ls_op_kda, problem, exec, false, &pl))) return st;
    if (!bytes) return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "argument 'bytes' is NULL");
    /* only the sizes and the sequence offsets matter: the tensors may not exist yet */
    ls_args a = {.fn = fn};
    ls_op_add_cu_seqlens(&a, &ls_op_kda, problem);
    if ((st = ls_args_validate(&a))) return st;
    if (problem->cu_seqlens && (st = ls_check_cu_seqlens(fn, problem->cu_seqlens, problem->n_seqs,
                                                         problem->B, problem->T)))
        return st;
    kda_exec_plan(&pl, exec);
    return kda_saved_layout(fn, &pl, NULL, bytes);
}

/* ---------------------------------------------------------------------------------------- */
/* Decode: one token per request against a pool of states, updated in place                   */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    const kda_plan *pl;
    float *state, *o;
    const int64_t *rows;
    const ls_state_rows *by_row; /* a serving engine's rows (decode_rows), or NULL */
    ls_state_widen_fn widen;
    ls_state_narrow_fn narrow;
    /* kern->decode_rows_item, or its AVX512-BF16 form where the CPU has the instruction */
    void (*rows_item)(const kda_plan *pl, int64_t tok, int64_t hv, const void *from, void *to,
                      bool half, float *o, float *scratch);
    unsigned char *ws;
    size_t ws_stride, token_floats;
    const kda_kernels *kern;
} decode_ctx;

/* One head's state advanced by one token where it lies, in either layout. */
static void advance_head(const decode_ctx *c, int64_t b, int64_t hv, float *head, float *scratch)
{
    if (c->pl->p->state_v_first)
        c->kern->decode_v_first(c->pl, b, hv, head, c->o, scratch);
    else
        c->kern->recurrent_item(c->pl, b, 1, hv, head, c->o, scratch, 0, c->pl->p->V);
}

static void decode_item(void *ctx, int64_t item, int thread)
{
    const decode_ctx *c = ctx;
    const kda_plan *pl = c->pl;
    const linseq_kda_problem *p = pl->p;
    const int64_t b = item / pl->HV, hv = item % pl->HV, KV = p->K * p->V;
    const ls_state_rows *by_row = c->by_row;
    const int64_t row = by_row ? by_row->src[b] : c->rows ? c->rows[b] : b;
    if (row < 0) { /* zero bits are +0 in float32 and in bf16 */
        const size_t te = kda_token_bytes(pl);
        memset((unsigned char *)c->o + (size_t)((b * pl->HV + hv) * p->V) * te, 0,
               (size_t)p->V * te);
        return;
    }
    float *scratch = (float *)(void *)(c->ws + (size_t)thread * c->ws_stride);
    if (!by_row) {
        advance_head(c, b, hv, c->state + (row * pl->HV + hv) * KV, scratch);
    } else if (!p->state_v_first && by_row->dtype != LINSEQ_POOL_F16) {
        /* [K,V]-first float32 or bf16: read from the source row, written to the destination */
        c->rows_item(pl, b, hv, ls_state_row_at(by_row->from, by_row, row, hv * KV),
                     ls_state_row_at(by_row->to, by_row, by_row->dst[b], hv * KV),
                     by_row->dtype == LINSEQ_POOL_BF16, c->o, scratch);
    } else if (ls_state_rows_in_place(by_row, b)) {
        advance_head(c, b, hv, ls_state_row_at(by_row->to, by_row, row, hv * KV), scratch);
    } else { /* another type or destination: the head goes through the thread's scratch */
        float *head = scratch + c->token_floats;
        c->widen(by_row->dtype, ls_state_row_at(by_row->from, by_row, row, hv * KV), head, KV);
        advance_head(c, b, hv, head, scratch);
        c->narrow(by_row->dtype, head, ls_state_row_at(by_row->to, by_row, by_row->dst[b], hv * KV),
                  KV);
    }
}

/* Decode on CUDA: state_rows is device memory, so a host copy of it is checked here with the
 * CPU path's rules before the backend touches the pool. */
static linseq_status decode_on_cuda(const char *fn, const kda_plan *pl, const linseq_exec *exec,
                                    float *state, int64_t n_state_rows, const int64_t *state_rows,
                                    float *o)
{
    const int64_t B = pl->p->B;
    if (state_rows) {
        int64_t *rows = NULL;
        linseq_status st = ls_cuda_entry_copy_i64(fn, exec, "state_rows", state_rows, B, &rows);
        if (!st) st = ls_check_state_rows(fn, rows, B, n_state_rows);
        free(rows);
        if (st) return st;
    }
    const ls_cuda_kda_args dev = {.p = pl->p, .HV = pl->HV, .scale = pl->scale, .chunk = 0};
    return ls_cuda_entry_kda_decode(fn, &dev, exec, state, n_state_rows, state_rows, o);
}

/* g[at] of a decode step, float32 or bfloat16 storage (a bf16 is a float32's upper half). */
static float decode_g_at(const kda_plan *pl, int64_t at)
{
    if (!pl->bf16) return pl->p->g[at];
    const uint32_t bits = (uint32_t)((const uint16_t *)(const void *)pl->p->g)[at] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* A decode step's log decays, before anything is written: a positive one (a raw gate where
 * g <= 0 belongs) would otherwise be found by the kernels after they had updated the pool's
 * rows, and a serving engine's states must not change on a refused call. One token per
 * request: g is 1/V of the state the step reads and writes, so this pass costs little (the
 * forward finds it in the kernels' own pass over g instead). With gate_in_kernel the decay
 * is computed, and never positive; padding requests are not read. */
static linseq_status decode_check_g(const char *fn, const kda_plan *pl, const int64_t *rows)
{
    const linseq_kda_problem *p = pl->p;
    if (p->decay == LINSEQ_DECAY_NONE || p->gate_in_kernel) return LINSEQ_OK;
    const int64_t per_request = pl->HV * (p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1);
    for (int64_t b = 0; b < p->B; b++) {
        if (rows && rows[b] < 0) continue;
        for (int64_t i = 0; i < per_request; i++) {
            const float g = decode_g_at(pl, b * per_request + i);
            if (g > 0.0f)
                return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                               "'g'[%lld] = %g of request %lld is a positive log decay; "
                               "expected g <= 0 (e^g a decay factor in (0, 1], e.g. "
                               "logsigmoid of the gate, or the raw gate input with "
                               "gate_in_kernel); nothing was written",
                               (long long)(b * per_request + i), (double)g, (long long)b);
        }
    }
    return LINSEQ_OK;
}

/* Where a decode step's states are: a float32 pool of n_rows rows (rows: the row of each
 * request, NULL: row b), or a serving engine's rows (by_row, n_rows of them). */
typedef struct {
    float *state;
    int64_t n_rows;
    const int64_t *rows;
    const ls_state_rows *by_row;
} decode_states;

static linseq_status decode_checks(const char *fn, const linseq_kda_problem *p,
                                   const linseq_exec *exec, const decode_states *at, float *o,
                                   kda_plan *pl)
{
    linseq_status st;
    if ((st = kda_check_problem(fn, &ls_op_kda, p, exec, true, pl))) return st;
    pl->bf16 = ls_token_bytes(exec) == 2; /* decode is recurrent: only the dtype of exec applies */
    const size_t te = ls_token_bytes(exec);
    ls_args a = {.fn = fn};
    float *const out[] = {o, NULL}; /* the state is the pool's */
    if ((st = ls_op_add_tensors(&a, &ls_op_kda, p, LS_ROLE_INPUT, p, te)) ||
        (st = at->by_row
                  ? ls_op_add_decode_rows(&a, &ls_op_kda, p, at->by_row, at->n_rows, out, te)
                  : ls_op_add_decode(&a, &ls_op_kda, p, at->state, at->n_rows, at->rows, out, te)))
        return st;
    size_t ws_stride;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    return (st = check_workspace(fn, pl, &ws_stride)) ||
                   (st = check_workspace_threads(fn, pl, exec, p->B, ws_stride))
               ? st
               : ls_args_validate(&a);
}

static linseq_status kda_decode(const char *fn, const linseq_kda_problem *p,
                                const linseq_exec *exec, const decode_states *at, float *o,
                                ls_isa isa)
{
    ls_clear_error();
    kda_plan pl;
    linseq_status st;
    if ((st = decode_checks(fn, p, exec, at, o, &pl))) return st;
    if (ls_on_cuda(exec)) {
        if (at->by_row)
            return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED, "a state pool's rows are on the CPU only");
        return decode_on_cuda(fn, &pl, exec, at->state, at->n_rows, at->rows, o);
    }
    const int64_t *rows = at->by_row ? at->by_row->src : at->rows;
    if ((!at->by_row && (st = ls_op_check_decode_rows(fn, &ls_op_kda, p, at->n_rows, rows))) ||
        (st = decode_check_g(fn, &pl, rows)))
        return st;
    /* Both layouts are advanced where they live, so a thread needs only the per-token
     * scratch (a few KB, which malloc serves from its arena rather than a fresh mapping),
     * and a head's state where the pool's row is not float32 or not its own destination. */
    const size_t token_floats = (kda_recurrent_scratch_floats(&pl) + 15) & ~(size_t)15;
    const size_t head_floats = at->by_row ? (size_t)(p->K * p->V) : 0;
    const size_t ws_stride = ((token_floats + head_floats) * sizeof(float) + 63) & ~(size_t)63;
    const int64_t n_items = p->B * pl.HV;
    const int threads = ls_resolve_threads(exec, n_items, kda_work(&pl, p->B));
    unsigned char *ws;
    if ((st = ls_alloc_blocks(fn, ws_stride, threads, (void **)&ws))) return st;

    atomic_int positive_g = 0; /* the kernels' pass over g (kda_decay_row) */
    pl.positive_g = &positive_g;
    decode_ctx c = {.pl = &pl,
                    .state = at->state,
                    .o = o,
                    .rows = at->rows,
                    .by_row = at->by_row,
                    .ws = ws,
                    .ws_stride = ws_stride,
                    .token_floats = token_floats,
                    .widen = LS_ISA_PICK(isa, ls_state_widen_isa),
                    .narrow = LS_ISA_PICK(isa, ls_state_narrow_isa),
                    .kern = ls_kda_kernels(isa)};
    c.rows_item = isa == LS_ISA_AVX512 && ls_cpu_has_bf16_dot() ? c.kern->decode_rows_item_bf16_dot
                                                                : c.kern->decode_rows_item;
    ls_parallel_for_static(n_items, threads, decode_item, &c);
    free(ws);
    return kda_positive_g_status(fn, &pl);
}

/* A recurrent forward of one token per sequence from h0 into ht ([K,V]-first, float32 tokens)
 * is a decode step reading h0's rows and writing ht's: run as one, it advances each head from
 * where it lies into its destination with the recurrent forward's arithmetic (the same bits),
 * without the forward's copy of each head into its workspace and back. A decode step from
 * PyTorch with fla's contract (h0 kept, a new final state) is such a call. */
static bool forward_is_one_step(const kda_plan *pl, const float *ht, const void *saved)
{
    const linseq_kda_problem *p = pl->p;
    return p->T == 1 && !p->cu_seqlens && p->h0 && ht && !p->state_v_first && !pl->chunk &&
           !pl->bf16 && !saved;
}

static linseq_status forward_one_step(const char *fn, const kda_plan *pl, const linseq_exec *exec,
                                      float *o, float *ht, ls_isa isa)
{
    const linseq_kda_problem *p = pl->p;
    int64_t *rows = malloc((size_t)p->B * sizeof *rows);
    if (!rows)
        return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "could not allocate %lld row indices",
                       (long long)p->B);
    for (int64_t b = 0; b < p->B; b++) rows[b] = b;
    const ls_state_rows by_row = {.from = p->h0,
                                  .to = ht,
                                  .dtype = LINSEQ_POOL_F32,
                                  .stride = pl->HV * p->K * p->V,
                                  .src = rows,
                                  .dst = rows};
    const decode_states at = {.n_rows = p->B, .by_row = &by_row};
    linseq_kda_problem step = *p; /* decode reads its states from the rows, not h0 */
    step.h0 = NULL;
    const linseq_status st = kda_decode(fn, &step, exec, &at, o, isa);
    free(rows);
    return st;
}

linseq_status ls_kda_decode_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                float *state, int64_t n_state_rows, const int64_t *state_rows,
                                float *o, ls_isa isa)
{
    const decode_states at = {.state = state, .n_rows = n_state_rows, .rows = state_rows};
    return kda_decode("linseq_kda_decode", problem, exec, &at, o, isa);
}

linseq_status ls_kda_decode_rows_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                     const ls_state_rows *rows, int64_t n_rows, float *o,
                                     ls_isa isa)
{
    const decode_states at = {.n_rows = n_rows, .by_row = rows};
    return kda_decode("linseq_op_decode_pool", problem, exec, &at, o, isa);
}

linseq_status linseq_kda_decode(const linseq_kda_problem *problem, const linseq_exec *exec,
                                float *state, int64_t n_state_rows, const int64_t *state_rows,
                                float *o)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_kda_decode", &isa);
    return st ? st : ls_kda_decode_isa(problem, exec, state, n_state_rows, state_rows, o, isa);
}
