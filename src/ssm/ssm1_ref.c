/* The SSM1 references: the recurrence of linseq.h token by token in double, and its reverse
 * mode.
 *
 * Written for reading, not for speed: one (sequence, channel) at a time, every option applied
 * exactly where the header formula puts it. The tests hold the fast scan and its backward
 * against them, and the backward reference against finite differences of the forward one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/activation.h"
#include "ssm/ssm_internal.h"

/* The outputs of one forward: either float (rounded on store) or double, each may be NULL. */
typedef struct ref_outputs {
    float *y, *hT;
    double *y64, *hT64;
} ref_outputs;

/* dt_t[d] of the header: after softplus(dt + dt_bias) when dt_softplus. */
static double step_size(const linseq_ssm1_problem *p, int64_t t, int64_t d)
{
    const double dt = p->dt[t * p->D + d];
    if (!p->dt_softplus) return dt;
    return ls_softplus(dt + (p->dt_bias ? p->dt_bias[d] : 0.0));
}

static linseq_status reference_forward(const linseq_ssm1_problem *p, const ref_outputs *out)
{
    const int64_t D = p->D, N = p->N, G = p->G ? p->G : 1;
    const int64_t channels_per_group = D / G;
    const linseq_activation gate_act = ssm1_gate_activation(p);
    double *h = malloc((size_t)N * sizeof *h);
    if (!h) return LINSEQ_ERR_OUT_OF_MEMORY;

    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    for (int64_t s = 0; s < n_seqs; s++) {
        int64_t start, len;
        ssm_seq_range(p->cu_seqlens, p->T, s, &start, &len);
        for (int64_t d = 0; d < D; d++) {
            const int64_t g = d / channels_per_group;
            const int64_t state_row = (s * D + d) * N;
            for (int64_t n = 0; n < N; n++) h[n] = p->h0 ? p->h0[state_row + n] : 0.0;

            for (int64_t t = start; t < start + len; t++) {
                const double x = p->x[t * D + d];
                const double dt = step_size(p, t, d);
                const float *B_t = p->B_proj + (t * G + g) * N;
                const float *C_t = p->C_proj + (t * G + g) * N;

                double y = 0.0;
                for (int64_t n = 0; n < N; n++) {
                    h[n] = exp(p->A[d * N + n] * dt) * h[n] + (dt * B_t[n]) * x;
                    y += h[n] * C_t[n];
                }
                if (p->D_skip) y += p->D_skip[d] * x;
                if (p->gate) y *= ls_activate_ref(gate_act, p->gate[t * D + d]);
                if (out->y64) out->y64[t * D + d] = y;
                if (out->y) out->y[t * D + d] = (float)y;
            }
            for (int64_t n = 0; n < N; n++) {
                if (out->hT64) out->hT64[state_row + n] = h[n];
                if (out->hT) out->hT[state_row + n] = (float)h[n];
            }
        }
    }
    free(h);
    return LINSEQ_OK;
}

linseq_status ls_ssm1_reference(const linseq_ssm1_problem *p, float *y, float *hT)
{
    const ref_outputs out = {.y = y, .hT = hT};
    return reference_forward(p, &out);
}

linseq_status ls_ssm1_reference_f64(const linseq_ssm1_problem *p, double *y, double *hT)
{
    const ref_outputs out = {.y64 = y, .hT64 = hT};
    return reference_forward(p, &out);
}

static void zero_if_given(double *x, int64_t n)
{
    if (x) memset(x, 0, (size_t)n * sizeof *x);
}

linseq_status ls_ssm1_backward_reference(const linseq_ssm1_problem *p, const float *d_y,
                                         const float *d_hT, const ls_ssm1_grads_f64 *grads)
{
    const int64_t D = p->D, N = p->N, G = p->G ? p->G : 1;
    const int64_t channels_per_group = D / G;
    const linseq_activation gate_act = ssm1_gate_activation(p);
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    const int64_t longest = ls_longest_sequence(p->cu_seqlens, n_seqs, p->T);

    /* h[i*N + n] = the state after i tokens of the sequence (h[0] = h0); dh the gradient
     * reaching the current state from later tokens. */
    double *h = malloc((size_t)(longest + 1) * (size_t)N * sizeof *h);
    double *dh = malloc((size_t)N * sizeof *dh);
    if (!h || !dh) {
        free(h);
        free(dh);
        return LINSEQ_ERR_OUT_OF_MEMORY;
    }
    /* The gradients summed over channels or sequences start from zero. */
    zero_if_given(grads->dA, D * N);
    zero_if_given(grads->dB_proj, p->B * p->T * G * N);
    zero_if_given(grads->dC_proj, p->B * p->T * G * N);
    zero_if_given(grads->dD_skip, D);
    zero_if_given(grads->ddt_bias, D);

    for (int64_t s = 0; s < n_seqs; s++) {
        int64_t start, len;
        ssm_seq_range(p->cu_seqlens, p->T, s, &start, &len);
        for (int64_t d = 0; d < D; d++) {
            const int64_t g = d / channels_per_group;
            const int64_t state_row = (s * D + d) * N;
            const float *A = p->A + d * N;

            for (int64_t n = 0; n < N; n++) h[n] = p->h0 ? p->h0[state_row + n] : 0.0;
            for (int64_t i = 0; i < len; i++) {
                const int64_t t = start + i;
                const double x = p->x[t * D + d], dt = step_size(p, t, d);
                const float *B_t = p->B_proj + (t * G + g) * N;
                for (int64_t n = 0; n < N; n++)
                    h[(i + 1) * N + n] = exp(A[n] * dt) * h[i * N + n] + dt * B_t[n] * x;
            }

            for (int64_t n = 0; n < N; n++) dh[n] = d_hT ? d_hT[state_row + n] : 0.0;
            for (int64_t i = len - 1; i >= 0; i--) {
                const int64_t t = start + i, td = t * D + d;
                const double x = p->x[td], dt = step_size(p, t, d), dy = d_y[td];
                const double *h_prev = h + i * N, *h_t = h + (i + 1) * N;
                const float *B_t = p->B_proj + (t * G + g) * N;
                const float *C_t = p->C_proj + (t * G + g) * N;

                /* y_t = pre * act(gate) with pre = sum_n h_t C_t + D x. */
                double pre = 0.0;
                for (int64_t n = 0; n < N; n++) pre += h_t[n] * C_t[n];
                if (p->D_skip) pre += p->D_skip[d] * x;
                double d_pre = dy;
                if (p->gate) {
                    const double z = p->gate[td];
                    d_pre = dy * ls_activate_ref(gate_act, z);
                    if (grads->dgate)
                        grads->dgate[td] = dy * pre * ls_activate_grad_ref(gate_act, z);
                }

                double dx = p->D_skip ? p->D_skip[d] * d_pre : 0.0, d_dt = 0.0;
                for (int64_t n = 0; n < N; n++) {
                    const double decay = exp(A[n] * dt);
                    const double d_h = dh[n] + C_t[n] * d_pre; /* all of dL/dh_t */
                    if (grads->dC_proj) grads->dC_proj[(t * G + g) * N + n] += d_pre * h_t[n];
                    /* h_t = decay h_{t-1} + dt B x, decay = exp(A dt) */
                    dx += d_h * dt * B_t[n];
                    d_dt += d_h * (A[n] * decay * h_prev[n] + B_t[n] * x);
                    if (grads->dA) grads->dA[d * N + n] += d_h * dt * decay * h_prev[n];
                    if (grads->dB_proj) grads->dB_proj[(t * G + g) * N + n] += d_h * dt * x;
                    dh[n] = d_h * decay;
                }
                if (p->dt_softplus)
                    d_dt *= ls_softplus_grad(p->dt[td] + (p->dt_bias ? p->dt_bias[d] : 0.0));
                if (grads->dx) grads->dx[td] = dx;
                if (grads->ddt) grads->ddt[td] = d_dt;
                if (grads->ddt_bias) grads->ddt_bias[d] += d_dt;
                if (grads->dD_skip) grads->dD_skip[d] += d_pre * x;
            }
            if (grads->dh0)
                for (int64_t n = 0; n < N; n++) grads->dh0[state_row + n] = dh[n];
        }
    }
    free(h);
    free(dh);
    return LINSEQ_OK;
}
