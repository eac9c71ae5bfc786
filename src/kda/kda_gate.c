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
#include "kda/kda_op.h"
#include "optable/check.h"

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

/* The problem as the gate's description says (sizes, decay, exec), its own rules, then its
 * input tensors into a (shared by forward and backward, which add their own tensors before
 * validating the table). */
static linseq_status check_gate_problem(const char *fn, const linseq_kda_gate_problem *p,
                                        const linseq_exec *exec, ls_args *a)
{
    linseq_status st;
    if ((st = ls_op_check_problem(fn, &ls_op_kda_gate, p, exec, false))) return st;
    /* K is ignored per head; per channel it is the channel count */
    if (p->decay == LINSEQ_DECAY_PER_CHANNEL && (st = ls_check_min(fn, "K", p->K, 1))) return st;
    if (!(p->lower_bound <= 0.0f) || isinf(p->lower_bound))
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "lower_bound = %g; expected a finite value <= 0 (0 = default gate)",
                       (double)p->lower_bound);
    return ls_op_add_tensors(a, &ls_op_kda_gate, p, LS_ROLE_INPUT, p, ls_token_bytes(exec));
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
    float *const out[] = {g};
    if ((st = ls_op_add_tensors(&a, &ls_op_kda_gate, p, LS_ROLE_OUTPUT, out, ls_token_bytes(exec))))
        return st;
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
    const float *const up[] = {d_g};
    if ((st = ls_op_add_tensors(&a, &ls_op_kda_gate, p, LS_ROLE_UPSTREAM, up, te)) ||
        (st = ls_op_add_tensors(&a, &ls_op_kda_gate, p, LS_ROLE_GRAD, grads, te)))
        return st;
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
