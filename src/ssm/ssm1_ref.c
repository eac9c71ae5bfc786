/* The SSM1 reference: the recurrence of linseq.h, token by token, in double.
 *
 * Written for reading, not for speed: one (sequence, channel) at a time, every option applied
 * exactly where the header formula puts it. The tests hold the fast scan against it. */
#include <math.h>
#include <stdlib.h>

#include "core/activation.h"
#include "ssm/ssm_internal.h"

linseq_status ls_ssm1_reference(const linseq_ssm1_problem *p, float *y, float *hT)
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
                double dt = p->dt[t * D + d];
                if (p->dt_softplus) dt = ls_softplus(dt + (p->dt_bias ? p->dt_bias[d] : 0.0));
                const float *B_t = p->B_proj + (t * G + g) * N;
                const float *C_t = p->C_proj + (t * G + g) * N;

                double out = 0.0;
                for (int64_t n = 0; n < N; n++) {
                    h[n] = exp(p->A[d * N + n] * dt) * h[n] + (dt * B_t[n]) * x;
                    out += h[n] * C_t[n];
                }
                if (p->D_skip) out += p->D_skip[d] * x;
                if (p->gate) out *= ls_activate_ref(gate_act, p->gate[t * D + d]);
                y[t * D + d] = (float)out;
            }
            if (hT)
                for (int64_t n = 0; n < N; n++) hT[state_row + n] = (float)h[n];
        }
    }
    free(h);
    return LINSEQ_OK;
}
