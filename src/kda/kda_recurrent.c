/* KDA recurrent mode: the state is advanced once per token (prefill, decode, reference-like
 * order of operations), in two passes over S per token. */
#include <math.h>
#include <string.h>

#include "kda/kda_internal.h"

size_t kda_recurrent_scratch_floats(const kda_plan *pl)
{
    /* qs, ks, g: K each; kS: V */
    return (size_t)(3 * pl->p->K + pl->p->V);
}

void kda_recurrent_item(const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv, float *S,
                        float *o, float *scratch)
{
    const linseq_kda_problem *p = pl->p;
    const int64_t K = p->K, V = p->V, HV = pl->HV;
    float *qs = scratch, *ks = qs + K, *g = ks + K, *kS = g + K;
    const bool per_channel = p->decay == LINSEQ_DECAY_PER_CHANNEL;
    const bool has_decay = p->decay != LINSEQ_DECAY_NONE;

    for (int64_t tok = tok0; tok < tok0 + len; tok++) {
        float beta;
        kda_load_token(pl, tok, hv, qs, ks, &beta, g);
        const float *v = p->v + (tok * HV + hv) * V;
        float *out = o ? o + (tok * HV + hv) * V : NULL;

        /* Pass 1: decay the state, then measure what it predicts for k. */
        const float head_decay = has_decay && !per_channel ? expf(g[0]) : 1.0f;
        memset(kS, 0, (size_t)V * sizeof *kS);
        for (int64_t i = 0; i < K; i++) {
            float *row = S + i * V;
            const float a = per_channel ? expf(g[i]) : head_decay;
            const float ki = ks[i];
            if (has_decay)
                for (int64_t j = 0; j < V; j++) row[j] *= a;
            for (int64_t j = 0; j < V; j++) kS[j] += ki * row[j];
        }
        /* The delta against the decayed state; kS now holds u = beta (v - S^T k). */
        for (int64_t j = 0; j < V; j++) kS[j] = beta * (v[j] - kS[j]);

        /* Pass 2: the rank-1 write, then read the updated state. */
        if (!out) {
            for (int64_t i = 0; i < K; i++) {
                float *row = S + i * V;
                const float ki = ks[i];
                for (int64_t j = 0; j < V; j++) row[j] += ki * kS[j];
            }
            continue;
        }
        memset(out, 0, (size_t)V * sizeof *out);
        for (int64_t i = 0; i < K; i++) {
            float *row = S + i * V;
            const float ki = ks[i], qi = qs[i];
            for (int64_t j = 0; j < V; j++) {
                row[j] += ki * kS[j];
                out[j] += qi * row[j];
            }
        }
    }
}
