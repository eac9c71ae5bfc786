/* The KDA specification in code: the recurrence token by token, in double, each option
 * applied literally, and its reverse-mode derivative. Slow and allocation-happy on purpose
 * (the backward keeps every state); the fast kernels are tested against it, and the tests
 * check it against finite differences of the forward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/activation.h"
#include "core/kda_math.h"
#include "core/validate.h"
#include "kda/kda_internal.h"

/* ---------------------------------------------------------------------------------------- */
/* Gate                                                                                       */
/* ---------------------------------------------------------------------------------------- */

void ls_kda_gate_reference_f64(const linseq_kda_gate_problem *p, double *g)
{
    const int64_t gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1;
    for (int64_t bt = 0; bt < p->B * p->T; bt++)
        for (int64_t h = 0; h < p->H; h++)
            for (int64_t i = 0; i < gK; i++) {
                const int64_t idx = (bt * p->H + h) * gK + i;
                const double bias = p->dt_bias ? p->dt_bias[h * gK + i] : 0.0;
                const double a_log = p->A_log ? p->A_log[h] : 0.0;
                g[idx] = ls_kda_gate(p->g_raw[idx], bias, a_log, p->lower_bound);
            }
}

void ls_kda_gate_reference(const linseq_kda_gate_problem *p, float *g)
{
    const int64_t gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1;
    const int64_t n = p->B * p->T * p->H * gK;
    for (int64_t idx = 0; idx < n; idx++) {
        const int64_t h = (idx / gK) % p->H, i = idx % gK;
        const double bias = p->dt_bias ? p->dt_bias[h * gK + i] : 0.0;
        const double a_log = p->A_log ? p->A_log[h] : 0.0;
        g[idx] = (float)ls_kda_gate(p->g_raw[idx], bias, a_log, p->lower_bound);
    }
}

void ls_kda_gate_reference_backward(const linseq_kda_gate_problem *p, const float *d_g,
                                    double *dg_raw, double *dA_log, double *ddt_bias)
{
    const int64_t gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1;
    memset(dA_log, 0, sizeof(double) * (size_t)p->H);
    memset(ddt_bias, 0, sizeof(double) * (size_t)(p->H * gK));
    for (int64_t bt = 0; bt < p->B * p->T; bt++)
        for (int64_t h = 0; h < p->H; h++)
            for (int64_t i = 0; i < gK; i++) {
                const int64_t idx = (bt * p->H + h) * gK + i;
                const double bias = p->dt_bias ? p->dt_bias[h * gK + i] : 0.0;
                const double a_log = p->A_log ? p->A_log[h] : 0.0;
                double d_raw, d_alog;
                ls_kda_gate_grad(p->g_raw[idx], bias, a_log, p->lower_bound, &d_raw, &d_alog);
                dg_raw[idx] = d_g[idx] * d_raw;
                dA_log[h] += d_g[idx] * d_alog;
                ddt_bias[h * gK + i] += d_g[idx] * d_raw;
            }
}

/* ---------------------------------------------------------------------------------------- */
/* KDA                                                                                        */
/* ---------------------------------------------------------------------------------------- */

/* Sizes and buffers of one (sequence, value head) walk. */
typedef struct ref_walk {
    const linseq_kda_problem *p;
    int64_t H, HV, K, V, G, n_seqs;
    double scale;
    double *q, *k, *g, *u, *S; /* one token: normalised q (unscaled) and k, decay, delta */
    double rq, rk, beta;       /* 1/sqrt(|q|^2 + eps), likewise k (1 without l2norm) */
} ref_walk;

static bool walk_init(ref_walk *w, const linseq_kda_problem *p)
{
    memset(w, 0, sizeof *w);
    w->p = p;
    w->H = p->H;
    w->HV = p->HV ? p->HV : p->H;
    w->K = p->K;
    w->V = p->V;
    w->G = w->HV / w->H;
    w->n_seqs = p->cu_seqlens ? p->n_seqs : p->B;
    w->scale = p->scale != 0.0f ? p->scale : 1.0 / sqrt((double)p->K);
    w->q = malloc(sizeof(double) * (size_t)w->K);
    w->k = malloc(sizeof(double) * (size_t)w->K);
    w->g = malloc(sizeof(double) * (size_t)w->K);
    w->u = malloc(sizeof(double) * (size_t)w->V);
    w->S = malloc(sizeof(double) * (size_t)(w->K * w->V));
    return w->q && w->k && w->g && w->u && w->S;
}

static void walk_free(ref_walk *w)
{
    free(w->q);
    free(w->k);
    free(w->g);
    free(w->u);
    free(w->S);
}

static void seq_range(const ref_walk *w, int64_t n, int64_t *start, int64_t *end)
{
    const linseq_kda_problem *p = w->p;
    *start = p->cu_seqlens ? p->cu_seqlens[n] : n * p->T;
    *end = p->cu_seqlens ? p->cu_seqlens[n + 1] : *start + p->T;
}

/* The token's inputs after every in-kernel option, into w->q, w->k, w->g, w->beta. */
static void load_token(ref_walk *w, int64_t t, int64_t hv)
{
    const linseq_kda_problem *p = w->p;
    const int64_t K = w->K, h = hv / w->G;
    double qn = 0.0, kn = 0.0;
    for (int64_t i = 0; i < K; i++) {
        w->q[i] = p->q[(t * w->H + h) * K + i];
        w->k[i] = p->k[(t * w->H + h) * K + i];
        qn += w->q[i] * w->q[i];
        kn += w->k[i] * w->k[i];
    }
    const double eps = ls_kda_l2norm_eps(p->l2norm_eps);
    w->rq = p->qk_l2norm ? ls_kda_l2norm_rsqrt(qn, eps) : 1.0;
    w->rk = p->qk_l2norm ? ls_kda_l2norm_rsqrt(kn, eps) : 1.0;
    for (int64_t i = 0; i < K; i++) {
        w->q[i] *= w->rq;
        w->k[i] *= w->rk;
    }
    w->beta = p->beta ? p->beta[t * w->HV + hv] : 1.0; /* no beta: no delta rule */
    if (p->beta_is_logit) w->beta = ls_sigmoid(w->beta);
    const int64_t gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? K : 1;
    for (int64_t i = 0; i < K; i++) {
        if (p->decay == LINSEQ_DECAY_NONE) {
            w->g[i] = 0.0;
            continue;
        }
        const int64_t gi = gK == K ? i : 0;
        const double raw = p->g[(t * w->HV + hv) * gK + gi];
        const double bias = p->dt_bias ? p->dt_bias[hv * gK + gi] : 0.0;
        const double a_log = p->A_log ? p->A_log[hv] : 0.0;
        w->g[i] = p->gate_in_kernel ? ls_kda_gate(raw, bias, a_log, p->lower_bound) : raw;
    }
}

/* Index of S[i][j] (i over K, j over V) in a stored state row. */
static int64_t state_at(const ref_walk *w, int64_t i, int64_t j)
{
    return w->p->state_v_first ? j * w->K + i : i * w->V + j;
}

/* One step of the recurrence on S; returns the pre-write prediction in pred (V). */
static void step(const ref_walk *w, const float *v, double *S, double *pred)
{
    const int64_t K = w->K, V = w->V;
    /* (1) decay first */
    for (int64_t i = 0; i < K; i++)
        for (int64_t j = 0; j < V; j++) S[i * V + j] *= exp(w->g[i]);
    /* (2) delta against the decayed state */
    for (int64_t j = 0; j < V; j++) {
        double acc = 0.0;
        for (int64_t i = 0; i < K; i++) acc += S[i * V + j] * w->k[i];
        pred[j] = w->p->beta ? acc : 0.0; /* without the delta rule nothing is predicted */
        w->u[j] = w->beta * (v[j] - pred[j]);
    }
    /* (3) rank-1 write */
    for (int64_t i = 0; i < K; i++)
        for (int64_t j = 0; j < V; j++) S[i * V + j] += w->k[i] * w->u[j];
}

linseq_status ls_kda_reference_f64(const linseq_kda_problem *p, double *o, double *ht)
{
    ref_walk w;
    double *pred = malloc(sizeof(double) * (size_t)p->V);
    if (!walk_init(&w, p) || !pred) {
        walk_free(&w);
        free(pred);
        return LINSEQ_ERR_OUT_OF_MEMORY;
    }
    const int64_t K = w.K, V = w.V, HV = w.HV;
    for (int64_t n = 0; n < w.n_seqs; n++) {
        int64_t start, end;
        seq_range(&w, n, &start, &end);
        for (int64_t hv = 0; hv < HV; hv++) {
            const int64_t srow = (n * HV + hv) * K * V;
            for (int64_t i = 0; i < K; i++)
                for (int64_t j = 0; j < V; j++)
                    w.S[i * V + j] = p->h0 ? p->h0[srow + state_at(&w, i, j)] : 0.0;
            for (int64_t t = start; t < end; t++) {
                load_token(&w, t, hv);
                step(&w, p->v + (t * HV + hv) * V, w.S, pred);
                /* (4) read the updated state with the scaled q */
                for (int64_t j = 0; j < V; j++) {
                    double acc = 0.0;
                    for (int64_t i = 0; i < K; i++) acc += w.S[i * V + j] * w.q[i] * w.scale;
                    o[(t * HV + hv) * V + j] = acc;
                }
            }
            if (ht)
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < V; j++) ht[srow + state_at(&w, i, j)] = w.S[i * V + j];
        }
    }
    walk_free(&w);
    free(pred);
    return LINSEQ_OK;
}

linseq_status ls_kda_reference(const linseq_kda_problem *p, float *o, float *ht)
{
    const int64_t HV = p->HV ? p->HV : p->H;
    const int64_t n_seqs = p->cu_seqlens ? p->n_seqs : p->B;
    const size_t no = (size_t)(p->B * p->T * HV * p->V), ns = (size_t)(n_seqs * HV * p->K * p->V);
    double *od = malloc(sizeof(double) * no), *hd = ht ? malloc(sizeof(double) * ns) : NULL;
    linseq_status st = LINSEQ_ERR_OUT_OF_MEMORY;
    if (od && (!ht || hd)) st = ls_kda_reference_f64(p, od, hd);
    if (st == LINSEQ_OK) {
        for (size_t i = 0; i < no; i++) o[i] = (float)od[i];
        for (size_t i = 0; ht && i < ns; i++) ht[i] = (float)hd[i];
    }
    free(od);
    free(hd);
    return st;
}

/* Reverse mode, literally: every state of the walk is stored, then each token is undone in
 * reverse order with the chain rule through (4), (3), (2), (1) and the in-kernel options. */
linseq_status ls_kda_reference_backward(const linseq_kda_problem *p, const float *d_o,
                                        const float *d_ht, const ls_kda_ref_grads *gr)
{
    ref_walk w;
    if (!walk_init(&w, p)) {
        walk_free(&w);
        return LINSEQ_ERR_OUT_OF_MEMORY;
    }
    const int64_t K = w.K, V = w.V, H = w.H, HV = w.HV, KV = K * V;
    const int64_t gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? K : 1;
    const int64_t max_len = ls_longest_sequence(p->cu_seqlens, w.n_seqs, p->T);
    double *states = malloc(sizeof(double) * (size_t)((max_len + 1) * KV));
    double *dS = malloc(sizeof(double) * (size_t)KV), *Sd = malloc(sizeof(double) * (size_t)KV);
    double *pred = malloc(sizeof(double) * (size_t)V), *du = malloc(sizeof(double) * (size_t)V);
    double *dq = malloc(sizeof(double) * (size_t)K), *dk = malloc(sizeof(double) * (size_t)K);
    double *dgv = malloc(sizeof(double) * (size_t)K);
    if (!states || !dS || !Sd || !pred || !du || !dq || !dk || !dgv) {
        free(states), free(dS), free(Sd), free(pred), free(du), free(dq), free(dk), free(dgv);
        walk_free(&w);
        return LINSEQ_ERR_OUT_OF_MEMORY;
    }
    const size_t n_qk = (size_t)(p->B * p->T * H * K);
    memset(gr->dq, 0, sizeof(double) * n_qk);
    memset(gr->dk, 0, sizeof(double) * n_qk);
    if (p->gate_in_kernel) {
        memset(gr->dA_log, 0, sizeof(double) * (size_t)HV);
        memset(gr->ddt_bias, 0, sizeof(double) * (size_t)(HV * gK));
    }

    for (int64_t n = 0; n < w.n_seqs; n++) {
        int64_t start, end;
        seq_range(&w, n, &start, &end);
        for (int64_t hv = 0; hv < HV; hv++) {
            const int64_t h = hv / w.G, srow = (n * HV + hv) * KV;
            for (int64_t i = 0; i < K; i++)
                for (int64_t j = 0; j < V; j++) {
                    states[i * V + j] = p->h0 ? p->h0[srow + state_at(&w, i, j)] : 0.0;
                    dS[i * V + j] = d_ht ? d_ht[srow + state_at(&w, i, j)] : 0.0;
                }
            for (int64_t t = start; t < end; t++) {
                load_token(&w, t, hv);
                double *S = states + (t - start + 1) * KV;
                memcpy(S, S - KV, sizeof(double) * (size_t)KV);
                step(&w, p->v + (t * HV + hv) * V, S, pred);
            }
            for (int64_t t = end - 1; t >= start; t--) {
                load_token(&w, t, hv);
                const double *S_prev = states + (t - start) * KV, *S_t = S_prev + KV;
                const float *v = p->v + (t * HV + hv) * V, *dot = d_o + (t * HV + hv) * V;
                /* recompute the decayed state S' and the prediction S'^T k */
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < V; j++) Sd[i * V + j] = exp(w.g[i]) * S_prev[i * V + j];
                for (int64_t j = 0; j < V; j++) {
                    double acc = 0.0;
                    for (int64_t i = 0; i < K; i++) acc += Sd[i * V + j] * w.k[i];
                    pred[j] = p->beta ? acc : 0.0;
                    w.u[j] = w.beta * (v[j] - pred[j]);
                }
                /* (4) o = S_t^T (scale q) */
                for (int64_t i = 0; i < K; i++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < V; j++) {
                        acc += S_t[i * V + j] * dot[j];
                        dS[i * V + j] += w.scale * w.q[i] * dot[j];
                    }
                    dq[i] = w.scale * acc; /* w.r.t. the normalised q */
                }
                /* (3) S_t = S' + k u^T */
                for (int64_t j = 0; j < V; j++) {
                    double acc = 0.0;
                    for (int64_t i = 0; i < K; i++) acc += dS[i * V + j] * w.k[i];
                    du[j] = acc;
                }
                for (int64_t i = 0; i < K; i++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < V; j++) acc += dS[i * V + j] * w.u[j];
                    dk[i] = acc;
                }
                /* (2) u = beta (v - S'^T k) */
                double dbeta = 0.0;
                for (int64_t j = 0; j < V; j++) {
                    dbeta += du[j] * (v[j] - pred[j]);
                    gr->dv[(t * HV + hv) * V + j] = w.beta * du[j];
                    du[j] *= p->beta ? -w.beta : 0.0; /* now d pred */
                }
                for (int64_t i = 0; i < K; i++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < V; j++) {
                        dS[i * V + j] += w.k[i] * du[j]; /* now dS' */
                        acc += Sd[i * V + j] * du[j];
                    }
                    dk[i] += acc;
                }
                /* (1) S' = diag(exp(g)) S_prev */
                for (int64_t i = 0; i < K; i++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < V; j++) {
                        acc += Sd[i * V + j] * dS[i * V + j];
                        dS[i * V + j] *= exp(w.g[i]);
                    }
                    dgv[i] = acc;
                }
                /* the in-kernel options */
                if (p->beta_is_logit) dbeta *= w.beta * (1.0 - w.beta);
                if (gr->dbeta) gr->dbeta[t * HV + hv] = dbeta;
                for (int64_t gi = 0; gi < gK && p->decay != LINSEQ_DECAY_NONE; gi++) {
                    double d = 0.0;
                    if (gK == K) {
                        d = dgv[gi];
                    } else {
                        for (int64_t i = 0; i < K; i++) d += dgv[i];
                    }
                    const int64_t at = (t * HV + hv) * gK + gi;
                    if (p->gate_in_kernel) {
                        const double bias = p->dt_bias ? p->dt_bias[hv * gK + gi] : 0.0;
                        const double a_log = p->A_log ? p->A_log[hv] : 0.0;
                        double d_raw, d_alog;
                        ls_kda_gate_grad(p->g[at], bias, a_log, p->lower_bound, &d_raw, &d_alog);
                        gr->dA_log[hv] += d * d_alog;
                        gr->ddt_bias[hv * gK + gi] += d * d_raw;
                        d *= d_raw;
                    }
                    gr->dg[at] = d;
                }
                /* l2norm: x_hat = x r, dx = r (dx_hat - x_hat (x_hat . dx_hat)) */
                double qdq = 0.0, kdk = 0.0;
                for (int64_t i = 0; i < K; i++) {
                    qdq += w.q[i] * dq[i];
                    kdk += w.k[i] * dk[i];
                }
                for (int64_t i = 0; i < K; i++) {
                    const int64_t at = (t * H + h) * K + i;
                    gr->dq[at] += p->qk_l2norm ? w.rq * (dq[i] - w.q[i] * qdq) : dq[i];
                    gr->dk[at] += p->qk_l2norm ? w.rk * (dk[i] - w.k[i] * kdk) : dk[i];
                }
            }
            if (gr->dh0)
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < V; j++)
                        gr->dh0[srow + state_at(&w, i, j)] = dS[i * V + j];
        }
    }
    free(states), free(dS), free(Sd), free(pred), free(du), free(dq), free(dk), free(dgv);
    walk_free(&w);
    return LINSEQ_OK;
}
