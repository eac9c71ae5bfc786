/* linseq_ssd_segment_forward / _backward: a segment's effect on the SSD state, for context
 * parallelism. Per (sequence, head) the map is a scalar times the state plus a constant,
 * S_end = P S_start + R, with P = exp(A[h] sum_t dt_t) (dt as the recurrence uses it: biased,
 * softplus'd and clamped where the problem asks) and R the end state from zeros.
 *
 * R is the SSD forward's final state with the outputs skipped (the kernels carry the state
 * alone when y is NULL), and its gradients the SSD backward with d_y = 0; P and its gradients
 * are computed here from the per-head sums of dt, in double, one sequence after another: the
 * same bits for any thread count. The description, shared with the SSD op, is in ssd_op.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/activation.h"
#include "core/device.h"
#include "core/parallel.h"
#include "core/status.h"
#include "core/validate.h"
#include "optable/check.h"
#include "ssd/ssd.h"

/* ---- the entry points ------------------------------------------------------------------ */

/* The forward's checks, then the summary's own: no h0, float32. */
static linseq_status check_segment(ls_args *a, const linseq_ssd_problem *p, const linseq_exec *exec)
{
    linseq_status st = ls_ssd_check_problem(a, &ls_op_ssd_segment, p, exec);
    if (st) return st;
    if (p->h0)
        return ls_fail(a->fn, LINSEQ_ERR_INVALID_VALUE,
                       "problem->h0 must be NULL: R is the end state from zeros (the end state "
                       "from a start state h0 is P * h0 + R)");
    if (exec && exec->dtype != LINSEQ_DTYPE_F32)
        return ls_fail(a->fn, LINSEQ_ERR_UNSUPPORTED,
                       "the segment summary takes float32 tensors (exec->dtype = %d)",
                       (int)exec->dtype);
    return LINSEQ_OK;
}

/* Sequence n's tokens: batch row b, first token t0, count len. */
static void seq_tokens(const linseq_ssd_problem *p, int64_t n, int64_t *b, int64_t *t0,
                       int64_t *len)
{
    *b = p->cu_seqlens ? 0 : n;
    *t0 = p->cu_seqlens ? p->cu_seqlens[n] : 0;
    *len = p->cu_seqlens ? p->cu_seqlens[n + 1] - p->cu_seqlens[n] : p->T;
}

/* dt of token (b, t) and head h as the kernels compute it (ssd_kernel.h, step_dt), and with
 * `slope` its derivative w.r.t. dt as given: 0 where the clamp holds it, softplus' slope as
 * the backward takes it. */
static float step_dt(const linseq_ssd_problem *p, int64_t b, int64_t t, int64_t h, float *slope)
{
    const float raw = p->dt[(b * p->T + t) * p->H + h];
    const float biased = raw + (p->dt_bias ? p->dt_bias[h] : 0.0f);
    float d = p->dt_softplus ? ls_softplusf(biased) : raw, s = 1.0f;
    if (p->dt_max > p->dt_min) {
        if (d < p->dt_min || d > p->dt_max) s = 0.0f;
        d = fminf(fmaxf(d, p->dt_min), p->dt_max);
    }
    if (p->dt_softplus) s *= ls_sigmoidf(biased);
    if (slope) *slope = s;
    return d;
}

/* sum_t dt_t of sequence n, head h, in double, token after token. */
static double dt_sum(const linseq_ssd_problem *p, int64_t n, int64_t h)
{
    int64_t b, t0, len;
    seq_tokens(p, n, &b, &t0, &len);
    double s = 0.0;
    for (int64_t t = t0; t < t0 + len; t++) s += step_dt(p, b, t, h, NULL);
    return s;
}

linseq_status ls_ssd_segment_forward_isa(const linseq_ssd_problem *p, const linseq_exec *exec,
                                         float *P_out, float *R, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ssd_segment_forward"};
    linseq_status st = check_segment(&a, p, exec);
    if (st) return st;
    float *const out[] = {P_out, R};
    if ((st = ls_op_add_tensors(&a, &ls_op_ssd_segment, p, LS_ROLE_OUTPUT, out, sizeof(float))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ls_args_validate(&a)) ||
        (st = ls_ssd_check_values(a.fn, &ls_op_ssd_segment, p, exec)))
        return st;
    if (R) {
        /* the state sees neither the skip nor the gate; no outputs are computed */
        linseq_ssd_problem bare = *p;
        bare.D_skip = NULL;
        bare.z = NULL;
        if ((st = ls_ssd_run_forward(a.fn, &bare, exec, isa, NULL, R))) return st;
    }
    const int64_t n_seqs = ls_ssd_state_rows(p), H = p->H;
    for (int64_t n = 0; n < n_seqs; n++)
        for (int64_t h = 0; h < H; h++)
            P_out[n * H + h] = (float)exp((double)p->A[h] * dt_sum(p, n, h));
    return LINSEQ_OK;
}

linseq_status linseq_ssd_segment_forward(const linseq_ssd_problem *p, const linseq_exec *exec,
                                         float *P_out, float *R)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssd_segment_forward", &isa);
    return st ? st : ls_ssd_segment_forward_isa(p, exec, P_out, R, isa);
}

/* ---- the backward ------------------------------------------------------------------------ */

/* P's share of the gradients, added to what the SSD backward wrote: with s = sum_t dt_t and
 * c = d_P P A, dA += d_P P s and each dt_t of the sequence gets c times its slope (ddt, and
 * ddt_bias with the softplus). sums: 2 H doubles. */
static void add_transition_grads(const linseq_ssd_problem *p, const float *d_P,
                                 const linseq_ssd_grads *g, double *sums)
{
    const int64_t n_seqs = ls_ssd_state_rows(p), H = p->H;
    double *dA = sums, *dbias = sums + H;
    for (int64_t h = 0; h < 2 * H; h++) sums[h] = 0.0;
    for (int64_t n = 0; n < n_seqs; n++) {
        int64_t b, t0, len;
        seq_tokens(p, n, &b, &t0, &len);
        for (int64_t h = 0; h < H; h++) {
            const double A = p->A[h], s = dt_sum(p, n, h);
            const double dPP = (double)d_P[n * H + h] * exp(A * s), c = dPP * A;
            dA[h] += dPP * s;
            for (int64_t t = t0; t < t0 + len; t++) {
                float slope;
                step_dt(p, b, t, h, &slope);
                const double share = c * (double)slope;
                dbias[h] += share;
                if (g->ddt) g->ddt[(b * p->T + t) * H + h] += (float)share;
            }
        }
    }
    for (int64_t h = 0; h < H; h++) {
        if (g->dA) g->dA[h] += (float)dA[h];
        if (g->ddt_bias) g->ddt_bias[h] += (float)dbias[h];
    }
}

/* The gradients of what the summary does not read: zeros. */
static void zero_unused_grads(const linseq_ssd_problem *p, const linseq_ssd_grads *g)
{
    const int64_t BT = p->B * p->T, n_groups = ls_ssd_groups(p);
    if (g->dC_proj) memset(g->dC_proj, 0, (size_t)(BT * n_groups * p->N) * sizeof(float));
    if (g->dD_skip)
        memset(g->dD_skip, 0, (size_t)(p->D_per_channel ? p->H * p->P : p->H) * sizeof(float));
    if (g->dz) memset(g->dz, 0, (size_t)(BT * p->H * p->P) * sizeof(float));
}

linseq_status ls_ssd_segment_backward_isa(const linseq_ssd_problem *p, const linseq_exec *exec,
                                          const float *d_P, const float *d_R,
                                          const linseq_ssd_grads *grads, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ssd_segment_backward"};
    linseq_status st = check_segment(&a, p, exec);
    if (st) return st;
    if (!grads)
        return ls_fail(a.fn, LINSEQ_ERR_NULL_POINTER,
                       "grads is NULL; expected a linseq_ssd_grads (NULL members are skipped)");
    if (grads->dh0)
        return ls_fail(a.fn, LINSEQ_ERR_INVALID_VALUE,
                       "grads->dh0 must be NULL: the summary does not depend on a start state");
    const float *const up[] = {d_P, d_R};
    if ((st = ls_op_add_tensors(&a, &ls_op_ssd_segment, p, LS_ROLE_UPSTREAM, up, sizeof(float))) ||
        (st = ls_op_add_tensors(&a, &ls_op_ssd_segment, p, LS_ROLE_GRAD, grads, sizeof(float))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, grads, sizeof *grads, exec);
    if ((st = ls_args_validate(&a)) ||
        (st = ls_ssd_check_values(a.fn, &ls_op_ssd_segment, p, exec)))
        return st;
    /* R's share: the SSD backward with no gradient on y, so without the skip and the gate */
    const int64_t BT = p->B * p->T;
    float *d_y;
    double *sums;
    if ((st = ls_alloc_blocks(a.fn, (size_t)(p->H * p->P) * sizeof(float), BT, (void **)&d_y)))
        return st;
    if ((st = ls_alloc_blocks(a.fn, 2 * sizeof(double), p->H, (void **)&sums))) {
        free(d_y);
        return st;
    }
    memset(d_y, 0, (size_t)(BT * p->H * p->P) * sizeof(float));
    linseq_ssd_problem bare = *p;
    bare.D_skip = NULL;
    bare.z = NULL;
    linseq_ssd_grads g = *grads;
    g.dC_proj = g.dD_skip = g.dz = NULL;
    st = ls_ssd_run_backward(a.fn, &bare, exec, isa, d_y, d_R, &g, false);
    free(d_y);
    if (!st) {
        zero_unused_grads(p, grads);
        if (d_P) add_transition_grads(p, d_P, grads, sums);
    }
    free(sums);
    return st;
}

linseq_status linseq_ssd_segment_backward(const linseq_ssd_problem *p, const linseq_exec *exec,
                                          const float *d_P, const float *d_R,
                                          const linseq_ssd_grads *grads)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssd_segment_backward", &isa);
    return st ? st : ls_ssd_segment_backward_isa(p, exec, d_P, d_R, grads, isa);
}
