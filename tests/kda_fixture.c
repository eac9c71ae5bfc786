/* Random KDA problems drawn the way the reference cases are (see refdata README section 5). */
#include "kda_fixture.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kda_fixture_make(kda_fixture *f, const kda_spec *s)
{
    memset(f, 0, sizeof *f);
    f->s = *s;
    const int64_t HV = s->HV ? s->HV : s->H;
    const int64_t BT = s->B * s->T;
    tu_rng r = {s->seed};
    f->n_qk = (size_t)(BT * s->H * s->K);
    f->n_v = (size_t)(BT * HV * s->V);
    f->n_beta = (size_t)(BT * HV);
    f->n_g = s->decay == LINSEQ_DECAY_PER_CHANNEL ? (size_t)(BT * HV * s->K)
             : s->decay == LINSEQ_DECAY_PER_HEAD  ? (size_t)(BT * HV)
                                                  : 0;
    f->n_rows = s->n_seqs ? s->n_seqs : s->B;
    f->n_state = (size_t)(f->n_rows * HV * s->K * s->V);

    f->q = tu_alloc(f->n_qk);
    f->k = tu_alloc(f->n_qk);
    f->v = tu_alloc(f->n_v);
    f->beta = tu_alloc(f->n_beta);
    tu_fill_normal(&r, f->q, f->n_qk, 1.0);
    tu_fill_normal(&r, f->v, f->n_v, 1.0);
    tu_fill_uniform(&r, f->beta, f->n_beta, 0.05, 0.95);
    tu_fill_normal(&r, f->k, f->n_qk, 1.0);
    if (!s->l2norm) {
        /* unnormalised keys with |k| in U(0.6,1.2): beta |k|^2 < 2 keeps the rule stable */
        for (size_t row = 0; row < f->n_qk / (size_t)s->K; row++) {
            float *k = f->k + row * (size_t)s->K;
            double nn = 0.0;
            for (int64_t i = 0; i < s->K; i++) nn += (double)k[i] * k[i];
            const double want = tu_uniform(&r, 0.6, 1.2) / sqrt(nn + 1e-30);
            for (int64_t i = 0; i < s->K; i++) k[i] = (float)(k[i] * want);
        }
    }
    if (f->n_g) {
        f->g = tu_alloc(f->n_g);
        for (size_t i = 0; i < f->n_g; i++) {
            double x = 0.0;
            if (s->regime != GATE_ZERO) x = -s->gmag * tu_uniform(&r, 0.0, 2.0);
            if (s->regime == GATE_EXTREME) {
                const double u = tu_uniform(&r, 0.0, 1.0);
                if (u < 0.04)
                    x = -1000.0;
                else if (u < 0.05)
                    x = -INFINITY;
                else if (u < 0.10)
                    x = 0.0;
                else if (u < 0.15)
                    x = -60.0;
            }
            f->g[i] = (float)x;
        }
    }
    if (s->with_h0) {
        f->h0 = tu_alloc(f->n_state);
        tu_fill_normal(&r, f->h0, f->n_state, 0.5);
    }
    if (s->n_seqs) {
        f->cu = malloc(sizeof(int64_t) * (size_t)(s->n_seqs + 1));
        memcpy(f->cu, s->cu, sizeof(int64_t) * (size_t)(s->n_seqs + 1));
    }
    linseq_kda_problem p = {
        .B = s->B,
        .T = s->T,
        .H = s->H,
        .HV = s->HV,
        .K = s->K,
        .V = s->V,
        .cu_seqlens = f->cu,
        .n_seqs = s->n_seqs,
        .q = f->q,
        .k = f->k,
        .v = f->v,
        .beta = s->no_delta ? NULL : f->beta,
        .g = f->g,
        .h0 = f->h0,
        .decay = s->decay,
        .qk_l2norm = s->l2norm,
        .state_v_first = s->v_first,
    };
    f->p = p;
}

void kda_fixture_free(kda_fixture *f)
{
    free(f->q);
    free(f->k);
    free(f->v);
    free(f->beta);
    free(f->g);
    free(f->h0);
    free(f->cu);
    memset(f, 0, sizeof *f);
}
