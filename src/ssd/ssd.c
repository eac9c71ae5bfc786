/* linseq_ssd_forward and linseq_ssd_decode: validation through the op's description (ssd_op.c),
 * then the kernels of ssd_simd.c over work items (sequence, head). Each item's arithmetic is
 * the same whichever thread runs it, so results are bitwise identical for every thread
 * count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/parallel.h"
#include "core/status.h"
#include "core/validate.h"
#include "optable/check.h"
#include "ssd/ssd.h"

/* ---- the entry points ------------------------------------------------------------------ */

/* The problem (its description's checks), its own rules and its input tensors appended to
 * `a`: run first by every entry point, so decode accepts exactly the problems the forward
 * accepts (op: ls_op_ssd, or the segment summary's description). */
linseq_status ls_ssd_check_problem(ls_args *a, const struct ls_op *op, const linseq_ssd_problem *p,
                                   const linseq_exec *exec)
{
    linseq_status st = ls_op_check_problem(a->fn, op, p, exec, false);
    if (st) return st;
    if (ls_ssd_groups(p) > p->H || p->H % ls_ssd_groups(p) != 0)
        return ls_fail(a->fn, LINSEQ_ERR_SHAPE_MISMATCH,
                       "G = %lld must divide H = %lld (each group's B and C serve H / G heads)",
                       (long long)p->G, (long long)p->H);
    if (p->dt_bias && !p->dt_softplus)
        return ls_fail(a->fn, LINSEQ_ERR_INVALID_VALUE,
                       "dt_bias is given without dt_softplus; expected NULL (the bias is added "
                       "in the kernel only before its softplus)");
    if (!(isfinite(p->dt_min) && p->dt_max >= p->dt_min && !isnan(p->dt_max) &&
          (p->dt_max > p->dt_min || (p->dt_min == 0 && p->dt_max == 0))))
        return ls_fail(a->fn, LINSEQ_ERR_INVALID_VALUE,
                       "dt_min = %g, dt_max = %g: expected dt_min < dt_max (dt_max may be "
                       "+inf), or both 0 for no clamp",
                       (double)p->dt_min, (double)p->dt_max);
    return ls_op_add_tensors(a, op, p, LS_ROLE_INPUT, p, ls_token_bytes(exec));
}

/* After the table is validated: the CPU only, cu_seqlens' offsets, every A <= 0. */
linseq_status ls_ssd_check_values(const char *fn, const struct ls_op *op,
                                  const linseq_ssd_problem *p, const linseq_exec *exec)
{
    if (ls_on_cuda(exec))
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED, "exec->device is CUDA; %s runs on the CPU only",
                       fn);
    linseq_status st;
    if (p->cu_seqlens && (st = ls_check_cu_seqlens(fn, p->cu_seqlens, p->n_seqs, p->B, p->T)))
        return st;
    return ls_op_check_values(fn, op, p, exec);
}

/* The problem's sizes, inputs and options into the plan (its buffers set by the caller). */
static void plan(ssd_plan *pl, const linseq_ssd_problem *p, const linseq_exec *exec, bool decode)
{
    pl->T = p->T, pl->H = p->H, pl->P = p->P, pl->N = p->N, pl->G = ls_ssd_groups(p);
    pl->cu = p->cu_seqlens, pl->x = p->x, pl->dt = p->dt, pl->A = p->A;
    pl->Bp = p->B_proj, pl->Cp = p->C_proj, pl->D = p->D_skip, pl->z = p->z;
    pl->dt_bias = p->dt_bias, pl->dt_softplus = p->dt_softplus;
    pl->D_per_channel = p->D_per_channel, pl->n_first = p->state_n_first;
    pl->chunked = !decode && (!exec || exec->mode != LINSEQ_MODE_RECURRENT);
    pl->chunk = exec && exec->chunk_size ? exec->chunk_size : SSD_DEFAULT_CHUNK;
    pl->dt_min = p->dt_min, pl->dt_max = p->dt_max;
}

static linseq_status run(const char *fn, ssd_plan *pl, const linseq_ssd_problem *p,
                         const linseq_exec *exec, ls_isa isa, bool decode)
{
    plan(pl, p, exec, decode);
    const int64_t n_items = ls_ssd_state_rows(p) * p->H;
    const int n_threads = ls_resolve_threads(exec, n_items, ls_ssd_flops(p, exec));
    /* bf16 products in the chunked forward with outputs only: decode and the recurrent mode
     * have no such products, and the segment summary (no y) none that only y reads */
    pl->bf16_products =
        !decode && pl->chunked && pl->y && exec && exec->products == LINSEQ_PRODUCTS_BF16;
    pl->bf16_dot = pl->bf16_products && isa == LS_ISA_AVX512 && ls_cpu_has_bf16_dot();
    pl->round_by_instruction = decode && isa == LS_ISA_AVX512 && ls_cpu_has_bf16_dot();
    pl->scratch_floats = ssd_scratch_floats(p->P, p->N, pl->chunked, pl->chunk) +
                         (pl->bf16_products ? ssd_bf16_words(p->P, p->N, pl->chunk) : 0);
    linseq_status st = ls_alloc_blocks(fn, (size_t)pl->scratch_floats * sizeof(float), n_threads,
                                       (void **)&pl->scratch);
    if (st) return st;
    ls_item_fn item = LS_ISA_PICK(isa, ls_ssd_item);
    /* decode's items cost the same, and a thread keeps its pool rows in its cache */
    if (decode)
        ls_parallel_for_static(n_items, n_threads, item, pl);
    else
        ls_parallel_for(n_items, n_threads, item, pl);
    free(pl->scratch);
    return LINSEQ_OK;
}

linseq_status ls_ssd_forward_isa(const linseq_ssd_problem *p, const linseq_exec *exec, float *y,
                                 float *hT, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ssd_forward"};
    linseq_status st = ls_ssd_check_problem(&a, &ls_op_ssd, p, exec);
    if (st) return st;
    float *const out[] = {y, hT};
    if ((st = ls_op_add_tensors(&a, &ls_op_ssd, p, LS_ROLE_OUTPUT, out, ls_token_bytes(exec))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ls_args_validate(&a)) || (st = ls_ssd_check_values(a.fn, &ls_op_ssd, p, exec)))
        return st;
    return ls_ssd_run_forward(a.fn, p, exec, isa, y, hT);
}

linseq_status ls_ssd_run_forward(const char *fn, const linseq_ssd_problem *p,
                                 const linseq_exec *exec, ls_isa isa, float *y, float *hT)
{
    ssd_plan pl = {.y = y, .s0 = p->h0, .sT = hT};
    return run(fn, &pl, p, exec, isa, false);
}

/* A decode step's checks: the problem, then the states as a float32 pool of n_rows rows
 * (state, rows) or a serving engine's rows (by_row), the output, the values. */
static linseq_status check_decode(ls_args *a, const linseq_ssd_problem *p, const linseq_exec *exec,
                                  float *state, int64_t n_rows, const int64_t *rows,
                                  const ls_state_rows *by_row, float *y)
{
    linseq_status st = ls_ssd_check_problem(a, &ls_op_ssd, p, exec);
    if (st) return st;
    float *const out[] = {y, NULL}; /* the states are the pool's */
    const size_t te = ls_token_bytes(exec);
    if ((st = by_row ? ls_op_add_decode_rows(a, &ls_op_ssd, p, by_row, n_rows, out, te)
                     : ls_op_add_decode(a, &ls_op_ssd, p, state, n_rows, rows, out, te)))
        return st;
    ls_arg_structs(a, p, sizeof *p, NULL, 0, exec);
    if ((st = ls_args_validate(a)) || (st = ls_ssd_check_values(a->fn, &ls_op_ssd, p, exec)))
        return st;
    return by_row ? LINSEQ_OK : ls_op_check_decode_rows(a->fn, &ls_op_ssd, p, n_rows, rows);
}

linseq_status ls_ssd_decode_isa(const linseq_ssd_problem *p, const linseq_exec *exec, float *state,
                                int64_t n_state_rows, const int64_t *state_rows, float *y,
                                ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ssd_decode"};
    linseq_status st = check_decode(&a, p, exec, state, n_state_rows, state_rows, NULL, y);
    if (st) return st;
    ssd_plan pl = {.y = y, .s0 = state, .sT = state, .rows = state_rows};
    return run(a.fn, &pl, p, exec, isa, true);
}

linseq_status ls_ssd_decode_rows_isa(const linseq_ssd_problem *p, const linseq_exec *exec,
                                     const ls_state_rows *rows, int64_t n_rows, float *y,
                                     ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_op_decode_pool"};
    linseq_status st = check_decode(&a, p, exec, NULL, n_rows, NULL, rows, y);
    if (st) return st;
    ssd_plan pl = {.y = y, .s0 = rows->from, .sT = rows->to, .by_row = rows};
    return run(a.fn, &pl, p, exec, isa, true);
}

/* ---- the backward ----------------------------------------------------------------------- */

/* The per-head sums over the sequences, in order: dA, ddt_bias and dD from the items' slots. */
static void sum_heads(const ssd_plan *pl, int64_t n_seqs, const linseq_ssd_grads *g)
{
    const int64_t H = pl->H, nd = pl->D_per_channel ? pl->P : 1;
    for (int64_t h = 0; h < H; h++) {
        float dA = 0.0f, dbias = 0.0f;
        for (int64_t s = 0; s < n_seqs; s++) {
            dA += pl->item_dA[s * H + h];
            dbias += pl->item_dbias[s * H + h];
        }
        if (g->dA) g->dA[h] = dA;
        if (g->ddt_bias) g->ddt_bias[h] = dbias;
        for (int64_t k = 0; g->dD_skip && k < nd; k++) {
            float dD = 0.0f;
            for (int64_t s = 0; s < n_seqs; s++) dD += pl->item_dD[(s * H + h) * nd + k];
            g->dD_skip[h * nd + k] = dD;
        }
    }
}

/* dB_proj and dC_proj of a block of SSD_SUM_TOKENS tokens: each group's heads' shares added
 * in head order. */
#define SSD_SUM_TOKENS 64
static void sum_group_item(void *ctx, int64_t item, int thread)
{
    (void)thread;
    const ssd_plan *pl = ctx;
    const int64_t H = pl->H, n_groups = pl->G, N = pl->N, per = H / n_groups;
    const int64_t t0 = item * SSD_SUM_TOKENS, t1 = t0 + SSD_SUM_TOKENS;
    for (int64_t t = t0; t < t1 && t < pl->n_tokens; t++)
        for (int64_t g = 0; g < n_groups; g++)
            for (int k = 0; k < 2; k++) {
                float *out = k ? pl->dC : pl->dB;
                const float *in = k ? pl->dCh : pl->dBh;
                if (!out) continue;
                float *o = out + (t * n_groups + g) * N;
                memcpy(o, in + (t * H + g * per) * N, (size_t)N * sizeof(float));
                for (int64_t h = 1; h < per; h++)
                    for (int64_t n = 0; n < N; n++) o[n] += in[(t * H + g * per + h) * N + n];
            }
}

/* The workspace a backward call needs besides its threads' scratch: the per-item slots and,
 * when groups have several heads, each head's dB and dC. */
static linseq_status alloc_backward(const char *fn, ssd_plan *pl, int64_t n_items, bool shares)
{
    const int64_t nd = pl->D_per_channel ? pl->P : 1;
    linseq_status st =
        ls_alloc_blocks(fn, sizeof(float), n_items * (2 + nd), (void **)&pl->item_dA);
    if (st) return st;
    pl->item_dbias = pl->item_dA + n_items;
    pl->item_dD = pl->D ? pl->item_dbias + n_items : NULL;
    if (shares && (st = ls_alloc_blocks(fn, (size_t)pl->H * (size_t)pl->N * 2 * sizeof(float),
                                        pl->n_tokens, (void **)&pl->dBh)))
        return st;
    if (shares) pl->dCh = pl->dBh + pl->n_tokens * pl->H * pl->N;
    return LINSEQ_OK;
}

static linseq_status run_backward(const char *fn, ssd_plan *pl, const linseq_ssd_problem *p,
                                  const linseq_exec *exec, ls_isa isa, const linseq_ssd_grads *g)
{
    const int64_t n_seqs = ls_ssd_state_rows(p), n_items = n_seqs * p->H;
    const bool shares = ls_ssd_groups(p) < p->H && (g->dB_proj || g->dC_proj);
    pl->n_tokens = p->B * p->T;
    const int64_t longest = ls_longest_sequence(p->cu_seqlens, p->n_seqs, p->T);
    pl->scratch_floats = ssd_bwd_scratch_floats(p->P, p->N, pl->chunk, longest) +
                         (pl->bf16_products ? ssd_bwd_bf16_words(p->P, p->N, pl->chunk) : 0);
    const int n_threads = ls_resolve_threads(exec, n_items, 3.5 * ls_ssd_flops(p, exec));
    linseq_status st = alloc_backward(fn, pl, n_items, shares);
    if (!st)
        st = ls_alloc_blocks(fn, (size_t)pl->scratch_floats * sizeof(float), n_threads,
                             (void **)&pl->scratch);
    if (!st) {
        ls_parallel_for(n_items, n_threads, LS_ISA_PICK(isa, ls_ssd_bwd_item), pl);
        if (shares) {
            const int64_t blocks = (pl->n_tokens + SSD_SUM_TOKENS - 1) / SSD_SUM_TOKENS;
            ls_parallel_for(
                blocks,
                ls_resolve_threads(exec, blocks, (double)pl->n_tokens * (double)(p->H * p->N)),
                sum_group_item, pl);
        }
        sum_heads(pl, n_seqs, g);
    }
    free(pl->scratch);
    free(pl->item_dA);
    free(pl->dBh);
    return st;
}

linseq_status ls_ssd_backward_isa(const linseq_ssd_problem *p, const linseq_exec *exec,
                                  const float *d_y, const float *d_hT, const linseq_ssd_grads *g,
                                  ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ssd_backward"};
    linseq_status st = ls_ssd_check_problem(&a, &ls_op_ssd, p, exec);
    if (st) return st;
    if (!g)
        return ls_fail(a.fn, LINSEQ_ERR_NULL_POINTER,
                       "argument 'grads' is NULL; expected a linseq_ssd_grads");
    const float *const up[] = {d_y, d_hT};
    if ((st = ls_op_add_tensors(&a, &ls_op_ssd, p, LS_ROLE_UPSTREAM, up, ls_token_bytes(exec))) ||
        (st = ls_op_add_tensors(&a, &ls_op_ssd, p, LS_ROLE_GRAD, g, ls_token_bytes(exec))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, g, sizeof *g, exec);
    if ((st = ls_args_validate(&a)) || (st = ls_ssd_check_values(a.fn, &ls_op_ssd, p, exec)))
        return st;
    return ls_ssd_run_backward(a.fn, p, exec, isa, d_y, d_hT, g, true);
}

linseq_status ls_ssd_run_backward(const char *fn, const linseq_ssd_problem *p,
                                  const linseq_exec *exec, ls_isa isa, const float *d_y,
                                  const float *d_hT, const linseq_ssd_grads *g, bool products)
{
    ssd_plan pl = {.s0 = p->h0,
                   .d_y = d_y,
                   .d_hT = d_hT,
                   .dx = g->dx,
                   .ddt = g->ddt,
                   .dB = g->dB_proj,
                   .dC = g->dC_proj,
                   .dz = g->dz,
                   .dh0 = g->dh0};
    plan(&pl, p, exec, false);
    /* bf16 products where the forward takes them (the chunked or default mode); the backward
     * itself always runs chunked */
    pl.bf16_products = products && pl.chunked && exec && exec->products == LINSEQ_PRODUCTS_BF16;
    pl.bf16_dot = pl.bf16_products && isa == LS_ISA_AVX512 && ls_cpu_has_bf16_dot();
    pl.chunked = true;
    return run_backward(fn, &pl, p, exec, isa, g);
}

linseq_status linseq_ssd_backward(const linseq_ssd_problem *p, const linseq_exec *exec,
                                  const float *d_y, const float *d_hT, const linseq_ssd_grads *g)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssd_backward", &isa);
    return st ? st : ls_ssd_backward_isa(p, exec, d_y, d_hT, g, isa);
}

linseq_status linseq_ssd_forward(const linseq_ssd_problem *p, const linseq_exec *exec, float *y,
                                 float *hT)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssd_forward", &isa);
    return st ? st : ls_ssd_forward_isa(p, exec, y, hT, isa);
}

linseq_status linseq_ssd_decode(const linseq_ssd_problem *p, const linseq_exec *exec, float *state,
                                int64_t n_state_rows, const int64_t *state_rows, float *y)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssd_decode", &isa);
    return st ? st : ls_ssd_decode_isa(p, exec, state, n_state_rows, state_rows, y, isa);
}
