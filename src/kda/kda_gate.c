/* The standalone KDA gate: decay from raw gate input, A_log and dt_bias, forward (the rows in
 * kda_gate_simd.c, shared with the in-kernel gate) and backward. */
#include <math.h>

#include "core/device.h"
#include "core/parallel.h"
#include "core/status.h"
#include "core/validate.h"
#include "cuda/cuda_entry.h"
#include "kda/kda_internal.h"
#include "kda/kda_kernels.h"

typedef struct {
    const linseq_kda_gate_problem *p;
    int64_t gK, rows_per_item, rows;
    float *g;
    const kda_kernels *kern;
} gate_ctx;

static void gate_item(void *ctx, int64_t item, int thread)
{
    (void)thread;
    const gate_ctx *c = ctx;
    const linseq_kda_gate_problem *p = c->p;
    const int64_t r0 = item * c->rows_per_item;
    const int64_t r1 = r0 + c->rows_per_item < c->rows ? r0 + c->rows_per_item : c->rows;
    c->kern->gate_rows(p, c->gK, r0, r1, c->g);
}

/* Sizes, enums and options, then the gate's input tensors into a (shared by forward and
 * backward, which add their own tensors before validating the table). */
static linseq_status check_gate_problem(const char *fn, const linseq_kda_gate_problem *p,
                                        const linseq_exec *exec, ls_args *a)
{
    linseq_status st;
    if (!p) return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "argument 'problem' is NULL");
    if (p->decay != LINSEQ_DECAY_PER_HEAD && p->decay != LINSEQ_DECAY_PER_CHANNEL)
        return ls_fail(fn, LINSEQ_ERR_INVALID_ENUM,
                       "decay = %d; expected LINSEQ_DECAY_PER_HEAD or LINSEQ_DECAY_PER_CHANNEL",
                       (int)p->decay);
    const bool per_channel = p->decay == LINSEQ_DECAY_PER_CHANNEL;
    if ((st = ls_check_min(fn, "B", p->B, 1)) || (st = ls_check_min(fn, "T", p->T, 1)) ||
        (st = ls_check_min(fn, "H", p->H, 1)) ||
        (per_channel && (st = ls_check_min(fn, "K", p->K, 1))))
        return st;
    if ((st = ls_check_exec(fn, exec))) return st;
    if (!(p->lower_bound <= 0.0f) || isinf(p->lower_bound))
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "lower_bound = %g; expected a finite value <= 0 (0 = default gate)",
                       (double)p->lower_bound);
    const size_t te = ls_token_bytes(exec);
    if (per_channel) {
        ls_arg(a, "g_raw", "B,T,H,K", p->g_raw, true, LS_IN, te, 4, p->B, p->T, p->H, p->K);
        ls_arg(a, "dt_bias", "H*K", p->dt_bias, false, LS_IN, 4, 1, ls_mul_sat(p->H, p->K));
    } else {
        ls_arg(a, "g_raw", "B,T,H", p->g_raw, true, LS_IN, te, 3, p->B, p->T, p->H);
        ls_arg(a, "dt_bias", "H", p->dt_bias, false, LS_IN, 4, 1, p->H);
    }
    ls_arg(a, "A_log", "H", p->A_log, false, LS_IN, 4, 1, p->H);
    return LINSEQ_OK;
}

linseq_status ls_kda_gate_forward_isa(const linseq_kda_gate_problem *p, const linseq_exec *exec,
                                      float *g, ls_isa isa)
{
    static const char fn[] = "linseq_kda_gate_forward";
    ls_clear_error();
    linseq_status st;
    ls_args a = {.fn = fn};
    if ((st = check_gate_problem(fn, p, exec, &a))) return st;
    const int64_t gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1;
    const size_t te = ls_token_bytes(exec);
    if (gK == 1)
        ls_arg(&a, "g", "B,T,H", g, true, LS_OUT, te, 3, p->B, p->T, p->H);
    else
        ls_arg(&a, "g", "B,T,H,K", g, true, LS_OUT, te, 4, p->B, p->T, p->H, p->K);
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ls_args_validate(&a))) return st;
    if (ls_on_cuda(exec)) return ls_cuda_entry_kda_gate_forward(fn, p, exec, g);

    gate_ctx c = {
        .p = p, .gK = gK, .rows = p->B * p->T * p->H, .g = g, .kern = ls_kda_kernels(isa)};
    /* Items of ~16K values: enough work per item to amortise the dispatch. */
    c.rows_per_item = 1 + (16384 - 1) / gK;
    const int64_t n_items = (c.rows + c.rows_per_item - 1) / c.rows_per_item;
    ls_parallel_for(n_items, ls_resolve_threads(exec, n_items, 20.0 * (double)c.rows * (double)gK),
                    gate_item, &c);
    return LINSEQ_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Backward                                                                                   */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    const linseq_kda_gate_problem *p;
    const float *d_g;
    const linseq_kda_gate_grads *gr;
    int64_t gK;
} gate_bwd_ctx;

/* One head over every (b, t): its dA_log and ddt_bias sums run in a fixed order. */
static void gate_bwd_head(void *ctx, int64_t h, int thread)
{
    (void)thread;
    const gate_bwd_ctx *c = ctx;
    const linseq_kda_gate_problem *p = c->p;
    const int64_t gK = c->gK, rows = p->B * p->T;
    const float a_log = p->A_log ? p->A_log[h] : 0.0f;
    double d_alog_sum = 0.0;
    for (int64_t i = 0; i < gK; i++) {
        const float bias = p->dt_bias ? p->dt_bias[h * gK + i] : 0.0f;
        double d_bias_sum = 0.0;
        for (int64_t bt = 0; bt < rows; bt++) {
            const int64_t at = (bt * p->H + h) * gK + i;
            float d_raw, d_alog;
            ls_kda_gate_gradf(p->g_raw[at], bias, a_log, p->lower_bound, &d_raw, &d_alog);
            const float d = c->d_g[at] * d_raw;
            if (c->gr->dg_raw) c->gr->dg_raw[at] = d;
            d_bias_sum += d;
            d_alog_sum += (double)(c->d_g[at] * d_alog);
        }
        if (c->gr->ddt_bias) c->gr->ddt_bias[h * gK + i] = (float)d_bias_sum;
    }
    if (c->gr->dA_log) c->gr->dA_log[h] = (float)d_alog_sum;
}

/* Plain C, the same on every ISA: it checks LINSEQ_ISA like every entry point but takes no
 * kernel table. */
linseq_status linseq_kda_gate_backward(const linseq_kda_gate_problem *p, const linseq_exec *exec,
                                       const float *d_g, const linseq_kda_gate_grads *grads)
{
    static const char fn[] = "linseq_kda_gate_backward";
    ls_isa isa;
    linseq_status st = ls_isa_resolve(fn, &isa);
    if (st) return st;
    ls_clear_error();
    ls_args a = {.fn = fn};
    if ((st = check_gate_problem(fn, p, exec, &a))) return st;
    if (!grads) return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "argument 'grads' is NULL");
    const bool per_channel = p->decay == LINSEQ_DECAY_PER_CHANNEL;
    const int64_t gK = per_channel ? p->K : 1;
    const size_t te = ls_token_bytes(exec);
    if (per_channel) {
        ls_arg(&a, "d_g", "B,T,H,K", d_g, true, LS_IN, te, 4, p->B, p->T, p->H, p->K);
        ls_arg(&a, "dg_raw", "B,T,H,K", grads->dg_raw, false, LS_OUT, te, 4, p->B, p->T, p->H,
               p->K);
        ls_arg(&a, "ddt_bias", "H*K", grads->ddt_bias, false, LS_OUT, 4, 1, ls_mul_sat(p->H, p->K));
    } else {
        ls_arg(&a, "d_g", "B,T,H", d_g, true, LS_IN, te, 3, p->B, p->T, p->H);
        ls_arg(&a, "dg_raw", "B,T,H", grads->dg_raw, false, LS_OUT, te, 3, p->B, p->T, p->H);
        ls_arg(&a, "ddt_bias", "H", grads->ddt_bias, false, LS_OUT, 4, 1, p->H);
    }
    ls_arg(&a, "dA_log", "H", grads->dA_log, false, LS_OUT, 4, 1, p->H);
    ls_arg_structs(&a, p, sizeof *p, grads, sizeof *grads, exec);
    if ((st = ls_args_validate(&a))) return st;
    if (ls_on_cuda(exec)) return ls_cuda_entry_kda_gate_backward(fn, p, exec, d_g, grads);

    gate_bwd_ctx c = {.p = p, .d_g = d_g, .gr = grads, .gK = gK};
    ls_parallel_for(p->H,
                    ls_resolve_threads(
                        exec, p->H, 30.0 * (double)p->B * (double)p->T * (double)p->H * (double)gK),
                    gate_bwd_head, &c);
    return LINSEQ_OK;
}

linseq_status linseq_kda_gate_forward(const linseq_kda_gate_problem *p, const linseq_exec *exec,
                                      float *g)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_kda_gate_forward", &isa);
    return st ? st : ls_kda_gate_forward_isa(p, exec, g, isa);
}
