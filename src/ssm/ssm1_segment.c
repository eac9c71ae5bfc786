/* linseq_ssm1_segment_forward / _backward: a segment's effect on the SSM1 state, h_end =
 * P * h_start + R elementwise, for context parallelism. The map is diagonal: per sequence,
 * channel d and state n, P = exp(A[d,n] * sum_t dt_t[d]) (dt after softplus and dt_bias where
 * the problem applies them) and R is the end state from zeros.
 *
 * R is the scan's own final state (its y, with the gate and skip dropped, goes to scratch),
 * and its gradients the scan's backward with d_y = 0; P and its gradients are computed here
 * from the per-channel sums of dt, in double, one sequence after another: the same bits for
 * any thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/activation.h"
#include "core/parallel.h"
#include "optable/check.h"
#include "ssm/ssm1_op.h"
#include "ssm/ssm_internal.h"
#include "ssm/ssm_kernels.h"

/* The forward's checks, then the summary's own: no h0, float32 on the CPU. */
static linseq_status check_segment(ls_args *a, const linseq_ssm1_problem *p,
                                   const linseq_exec *exec)
{
    linseq_status st = ssm1_check_problem(a, &ls_op_ssm1_segment, p, exec);
    if (st) return st;
    if (p->h0)
        return ls_fail(a->fn, LINSEQ_ERR_INVALID_VALUE,
                       "problem->h0 must be NULL: R is the end state from zeros (the end state "
                       "from a start state h0 is P * h0 + R)");
    if (exec && exec->dtype != LINSEQ_DTYPE_F32)
        return ls_fail(a->fn, LINSEQ_ERR_UNSUPPORTED,
                       "the segment summary takes float32 tensors (exec->dtype = %d)",
                       (int)exec->dtype);
    if (ls_on_cuda(exec))
        return ls_fail(a->fn, LINSEQ_ERR_UNSUPPORTED,
                       "the segment summary runs on the CPU only (exec->device = "
                       "LINSEQ_DEVICE_CUDA)");
    return LINSEQ_OK;
}

/* Sequence n's tokens as (batch row, first token, count) of the problem's indexing. */
static void seq_tokens(const linseq_ssm1_problem *p, int64_t n, int64_t *b, int64_t *t0,
                       int64_t *len)
{
    int64_t start;
    ssm_seq_range(p->cu_seqlens, p->T, n, &start, len);
    *b = p->cu_seqlens ? 0 : n;
    *t0 = p->cu_seqlens ? start : 0;
}

/* Row x[d] = dt_t[d] (+ dt_bias[d] under softplus) of token (b, t), as the scan reads it. */
static void dt_row(const linseq_ssm1_problem *p, const ssm_view *dt, int64_t b, int64_t t, float *x)
{
    const float *row = dt->base + b * dt->batch + t * dt->token;
    for (int64_t d = 0; d < p->D; d++)
        x[d] = row[d * dt->channel] + (p->dt_softplus && p->dt_bias ? p->dt_bias[d] : 0.0f);
}

/* s[d] = sum_t dt_t[d] over sequence n (after softplus where it applies: the kernels' vector
 * softplus), in double, token after token; row: D floats of scratch. */
static void dt_sums(const linseq_ssm1_problem *p, const ssm_view *dt, const ssm_kernels *kern,
                    int64_t n, double *s, float *row)
{
    int64_t b, t0, len;
    seq_tokens(p, n, &b, &t0, &len);
    for (int64_t d = 0; d < p->D; d++) s[d] = 0.0;
    for (int64_t t = t0; t < t0 + len; t++) {
        dt_row(p, dt, b, t, row);
        if (p->dt_softplus) kern->vmath_n(LS_SSM_VSOFTPLUS, LINSEQ_ACT_DEFAULT, p->D, row, row);
        for (int64_t d = 0; d < p->D; d++) s[d] += row[d];
    }
}

static ssm_view dt_view(const linseq_ssm1_problem *p)
{
    return ssm_view_of(p->dt, p->dt_strides, p->channel_first, p->T, p->D, 1);
}

linseq_status ls_ssm1_segment_forward_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                          float *P, float *R, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ssm1_segment_forward"};
    linseq_status st = check_segment(&a, p, exec);
    if (st) return st;
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B), D = p->D, N = p->N;
    float *const out[] = {P, R};
    if ((st = ls_op_add_tensors(&a, &ls_op_ssm1_segment, p, LS_ROLE_OUTPUT, out, sizeof(float))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ssm_check_table(&a, exec, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;
    /* per sequence: the D sums in double, and one row of D steps */
    double *sums;
    if ((st = ls_alloc_blocks(a.fn, (size_t)D * (sizeof(double) + sizeof(float)), 1,
                              (void **)&sums)))
        return st;
    float *row = (float *)(void *)(sums + D);
    const ssm_kernels *kern = ls_ssm_kernels(isa);
    if (R) {
        /* the state does not see the gate or the skip term: the scratch output skips them */
        linseq_ssm1_problem bare = *p;
        bare.gate = NULL;
        bare.D_skip = NULL;
        float *y;
        if ((st = ls_alloc_blocks(a.fn, (size_t)D * sizeof(float), p->B * p->T, (void **)&y))) {
            free(sums);
            return st;
        }
        st = ls_ssm1_scan(&bare, exec, kern, y, R);
        free(y);
        if (st) {
            free(sums);
            return ls_fail(a.fn, st, "could not allocate the scan workspace");
        }
    }
    const ssm_view dt = dt_view(p);
    for (int64_t n = 0; n < n_seqs; n++) {
        dt_sums(p, &dt, kern, n, sums, row);
        for (int64_t d = 0; d < D; d++)
            for (int64_t j = 0; j < N; j++)
                P[(n * D + d) * N + j] = (float)exp((double)p->A[d * N + j] * sums[d]);
    }
    free(sums);
    return LINSEQ_OK;
}

linseq_status linseq_ssm1_segment_forward(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                          float *P, float *R)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssm1_segment_forward", &isa);
    return st ? st : ls_ssm1_segment_forward_isa(p, exec, P, R, isa);
}

/* ---------------------------------------------------------------------------------------- */
/* Backward                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* The backward's rules for the grads of optional inputs, and no dh0. */
static linseq_status check_grads(const char *fn, const linseq_ssm1_problem *p,
                                 const linseq_ssm1_grads *g)
{
    if (!g)
        return ls_fail(fn, LINSEQ_ERR_NULL_POINTER,
                       "grads is NULL; expected a linseq_ssm1_grads (NULL members are skipped)");
    if (g->dh0)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "grads->dh0 must be NULL: the summary does not depend on a start state");
    return ssm1_check_option_grads(fn, p, g);
}

/* P's share of the gradients, added to what the scan's backward wrote (or to zeros): with
 * s = sum_t dt_t and c = sum_n d_P P A, dA += d_P P s and each dt_t of the sequence gets c
 * (times softplus' where it applies). ws: 3 D doubles, then D floats. */
static void add_transition_grads(const linseq_ssm1_problem *p, const ssm_kernels *kern,
                                 const float *d_P, const linseq_ssm1_grads *g, double *ws)
{
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B), D = p->D, N = p->N;
    const ssm_view dt = dt_view(p);
    double *s = ws, *c = ws + D, *bias_sum = ws + 2 * D;
    float *row = (float *)(void *)(ws + 3 * D);
    for (int64_t d = 0; d < D; d++) bias_sum[d] = 0.0;
    for (int64_t n = 0; n < n_seqs; n++) {
        dt_sums(p, &dt, kern, n, s, row);
        for (int64_t d = 0; d < D; d++) {
            c[d] = 0.0;
            for (int64_t j = 0; j < N; j++) {
                const double A = p->A[d * N + j], dPP = d_P[(n * D + d) * N + j] * exp(A * s[d]);
                c[d] += dPP * A;
                if (g->dA) g->dA[d * N + j] += (float)(dPP * s[d]);
            }
        }
        int64_t b, t0, len;
        seq_tokens(p, n, &b, &t0, &len);
        for (int64_t t = t0; t < t0 + len; t++) {
            dt_row(p, &dt, b, t, row);
            if (p->dt_softplus)
                kern->vmath_n(LS_SSM_VSOFTPLUS_GRAD, LINSEQ_ACT_DEFAULT, D, row, row);
            for (int64_t d = 0; d < D; d++) {
                const double share = c[d] * (p->dt_softplus ? (double)row[d] : 1.0);
                bias_sum[d] += share;
                const int64_t at =
                    p->channel_first ? (b * D + d) * p->T + t : (b * p->T + t) * D + d;
                if (g->ddt) g->ddt[at] += (float)share;
            }
        }
    }
    for (int64_t d = 0; g->ddt_bias && d < D; d++) g->ddt_bias[d] += (float)bias_sum[d];
}

/* The gradients nothing of the summary depends on: zeros. */
static void zero_unused_grads(const linseq_ssm1_problem *p, const linseq_ssm1_grads *g)
{
    const int64_t BT = p->B * p->T, G = p->G ? p->G : 1;
    if (g->dC_proj) memset(g->dC_proj, 0, (size_t)(BT * G * p->N) * sizeof(float));
    if (g->dD_skip) memset(g->dD_skip, 0, (size_t)p->D * sizeof(float));
    if (g->dgate) memset(g->dgate, 0, (size_t)(BT * p->D) * sizeof(float));
}

linseq_status ls_ssm1_segment_backward_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                           const float *d_P, const float *d_R,
                                           const linseq_ssm1_grads *grads, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ssm1_segment_backward"};
    linseq_status st = check_segment(&a, p, exec);
    if (st || (st = check_grads(a.fn, p, grads))) return st;
    const int64_t D = p->D;
    const float *const up[] = {d_P, d_R};
    if ((st = ls_op_add_tensors(&a, &ls_op_ssm1_segment, p, LS_ROLE_UPSTREAM, up, sizeof(float))) ||
        (st = ls_op_add_tensors(&a, &ls_op_ssm1_segment, p, LS_ROLE_GRAD, grads, sizeof(float))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, grads, sizeof *grads, exec);
    if ((st = ssm_check_table(&a, exec, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;
    /* R's share: the scan's backward with no gradient on y, so without gate and skip */
    linseq_ssm1_problem bare = *p;
    bare.gate = NULL;
    bare.D_skip = NULL;
    linseq_ssm1_grads g = *grads;
    g.dC_proj = g.dD_skip = g.dgate = NULL;
    float *d_y;
    double *ws;
    if ((st = ls_alloc_blocks(a.fn, (size_t)D * sizeof(float), p->B * p->T, (void **)&d_y)))
        return st;
    if ((st = ls_alloc_blocks(a.fn, (size_t)D * (3 * sizeof(double) + sizeof(float)), 1,
                              (void **)&ws))) {
        free(d_y);
        return st;
    }
    memset(d_y, 0, (size_t)(p->B * p->T * D) * sizeof(float));
    st = ls_ssm1_scan_backward(&bare, exec, ls_ssm_kernels(isa), d_y, d_R, &g);
    free(d_y);
    if (st) {
        free(ws);
        return ls_fail(a.fn, st, "could not allocate the backward workspace");
    }
    zero_unused_grads(p, grads);
    if (d_P) add_transition_grads(p, ls_ssm_kernels(isa), d_P, grads, ws);
    free(ws);
    return LINSEQ_OK;
}

linseq_status linseq_ssm1_segment_backward(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                           const float *d_P, const float *d_R,
                                           const linseq_ssm1_grads *grads)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssm1_segment_backward", &isa);
    return st ? st : ls_ssm1_segment_backward_isa(p, exec, d_P, d_R, grads, isa);
}
