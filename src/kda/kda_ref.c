/* The KDA specification in code: the recurrence token by token, in double, each option
 * applied literally. Slow and allocation-happy on purpose; the fast kernels are tested
 * against it. */
#include <math.h>
#include <stdlib.h>

#include "core/activation.h"
#include "kda/kda_internal.h"

static double gate_ref(double raw, double bias, double a_log, double lower_bound)
{
    if (lower_bound == 0.0) return -exp(a_log) * ls_softplus(raw + bias);
    return lower_bound * ls_sigmoid(exp(a_log) * (raw + bias));
}

void ls_kda_gate_reference(const linseq_kda_gate_problem *p, float *g)
{
    const int64_t gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1;
    for (int64_t bt = 0; bt < p->B * p->T; bt++)
        for (int64_t h = 0; h < p->H; h++)
            for (int64_t i = 0; i < gK; i++) {
                const int64_t idx = (bt * p->H + h) * gK + i;
                const double bias = p->dt_bias ? p->dt_bias[h * gK + i] : 0.0;
                const double a_log = p->A_log ? p->A_log[h] : 0.0;
                g[idx] = (float)gate_ref(p->g_raw[idx], bias, a_log, p->lower_bound);
            }
}

linseq_status ls_kda_reference(const linseq_kda_problem *p, float *o, float *ht)
{
    const int64_t H = p->H, HV = p->HV ? p->HV : p->H, K = p->K, V = p->V;
    const int64_t G = HV / H;
    const int64_t n_seqs = p->cu_seqlens ? p->n_seqs : p->B;
    const double scale = p->scale != 0.0f ? p->scale : 1.0 / sqrt((double)K);
    double *S = malloc(sizeof(double) * (size_t)(K * V));
    double *q = malloc(sizeof(double) * (size_t)K), *k = malloc(sizeof(double) * (size_t)K);
    double *g = malloc(sizeof(double) * (size_t)K), *u = malloc(sizeof(double) * (size_t)V);
    if (!S || !q || !k || !g || !u) {
        free(S);
        free(q);
        free(k);
        free(g);
        free(u);
        return LINSEQ_ERR_OUT_OF_MEMORY;
    }

    for (int64_t n = 0; n < n_seqs; n++) {
        const int64_t start = p->cu_seqlens ? p->cu_seqlens[n] : n * p->T;
        const int64_t end = p->cu_seqlens ? p->cu_seqlens[n + 1] : start + p->T;
        for (int64_t hv = 0; hv < HV; hv++) {
            const int64_t h = hv / G;
            const int64_t srow = (n * HV + hv) * K * V;
            /* S[i][j], i over K, j over V, whatever the stored layout */
            for (int64_t i = 0; i < K; i++)
                for (int64_t j = 0; j < V; j++) {
                    const int64_t at = p->state_v_first ? j * K + i : i * V + j;
                    S[i * V + j] = p->h0 ? p->h0[srow + at] : 0.0;
                }

            for (int64_t t = start; t < end; t++) {
                const float *qt = p->q + (t * H + h) * K, *kt = p->k + (t * H + h) * K;
                double qn = 0.0, kn = 0.0;
                for (int64_t i = 0; i < K; i++) {
                    q[i] = qt[i];
                    k[i] = kt[i];
                    qn += q[i] * q[i];
                    kn += k[i] * k[i];
                }
                if (p->qk_l2norm)
                    for (int64_t i = 0; i < K; i++) {
                        q[i] /= sqrt(qn + 1e-6);
                        k[i] /= sqrt(kn + 1e-6);
                    }
                for (int64_t i = 0; i < K; i++) q[i] *= scale;

                double beta = p->beta[t * HV + hv];
                if (p->beta_is_logit) beta = ls_sigmoid(beta);

                for (int64_t i = 0; i < K; i++) {
                    if (p->decay == LINSEQ_DECAY_NONE) {
                        g[i] = 0.0;
                        continue;
                    }
                    const int64_t gi = p->decay == LINSEQ_DECAY_PER_CHANNEL ? i : 0;
                    const int64_t gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? K : 1;
                    const double raw = p->g[(t * HV + hv) * gK + gi];
                    if (!p->gate_in_kernel) {
                        g[i] = raw;
                    } else {
                        const double bias = p->dt_bias ? p->dt_bias[hv * gK + gi] : 0.0;
                        const double a_log = p->A_log ? p->A_log[hv] : 0.0;
                        g[i] = gate_ref(raw, bias, a_log, p->lower_bound);
                    }
                }

                /* (1) decay first */
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < V; j++) S[i * V + j] *= exp(g[i]);
                /* (2) delta against the decayed state */
                for (int64_t j = 0; j < V; j++) {
                    double pred = 0.0;
                    for (int64_t i = 0; i < K; i++) pred += S[i * V + j] * k[i];
                    u[j] = beta * (p->v[(t * HV + hv) * V + j] - pred);
                }
                /* (3) rank-1 write */
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < V; j++) S[i * V + j] += k[i] * u[j];
                /* (4) read the updated state */
                for (int64_t j = 0; j < V; j++) {
                    double acc = 0.0;
                    for (int64_t i = 0; i < K; i++) acc += S[i * V + j] * q[i];
                    o[(t * HV + hv) * V + j] = (float)acc;
                }
            }
            if (ht)
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < V; j++) {
                        const int64_t at = p->state_v_first ? j * K + i : i * V + j;
                        ht[srow + at] = (float)S[i * V + j];
                    }
        }
    }
    free(S);
    free(q);
    free(k);
    free(g);
    free(u);
    return LINSEQ_OK;
}
