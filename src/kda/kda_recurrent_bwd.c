/* KDA recurrent backward: the reverse of kda_recurrent.c, token by token.
 *
 * Memory: the state is checkpointed every `segment` tokens in a forward pass; walking the
 * segments in reverse, the states inside one segment are recomputed into a segment-deep
 * buffer, so a thread holds (ceil(len/segment) + segment) states, never one per token. Each
 * token then needs only S_{t-1}: the decayed state S', the prediction S'^T k, the delta u and
 * S_t are recomputed from it. */
#include <math.h>
#include <string.h>

#include "core/matmul.h"
#include "kda/kda_backward.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

typedef struct {
    float *ckpt, *seg;        /* [n_ckpt,K,V], [segment,K,V]                               */
    float *dS, *Sd;           /* [K,V]: dL/dS_t running backwards, the decayed state S'     */
    float *qs, *ks, *g, *a;   /* [K] loaded token, decay factors                            */
    float *dqs, *dks, *dg;    /* [K]                                                        */
    float *pred, *u, *du, *dv;/* [V]                                                        */
    float *step;              /* the forward step's scratch                                 */
} rec_ws;

static size_t carve(const kda_bwd *b, unsigned char *base, rec_ws *w)
{
    const size_t K = (size_t)b->pl->p->K, V = (size_t)b->pl->p->V, KV = K * V;
    const size_t seg = (size_t)b->segment;
    const size_t n_ckpt = ((size_t)b->max_len + seg - 1) / seg;
    size_t off = 0;
#define TAKE(field, count)                                                               \
    do {                                                                                 \
        if (base) w->field = (float *)(void *)(base + off);                              \
        off += align64((count) * sizeof(float));                                         \
    } while (0)
    TAKE(ckpt, (n_ckpt ? n_ckpt : 1) * KV);
    TAKE(seg, seg * KV);
    TAKE(dS, KV);
    TAKE(Sd, KV);
    TAKE(qs, K);
    TAKE(ks, K);
    TAKE(g, K);
    TAKE(a, K);
    TAKE(dqs, K);
    TAKE(dks, K);
    TAKE(dg, K);
    TAKE(pred, V);
    TAKE(u, V);
    TAKE(du, V);
    TAKE(dv, V);
    TAKE(step, kda_recurrent_scratch_floats(b->pl));
#undef TAKE
    return off;
}

size_t kda_recurrent_bwd_ws_bytes(const kda_bwd *b) { return carve(b, NULL, NULL); }

/* Undoes token tok given S_prev = S_{t-1}; dS holds dL/dS_t and becomes dL/dS_{t-1}. */
static void token_backward(const kda_bwd *b, const rec_ws *w, int64_t tok, int64_t hv,
                           const float *S_prev, double *item_partials)
{
    const kda_plan *pl = b->pl;
    const linseq_kda_problem *p = pl->p;
    const int64_t K = p->K, V = p->V, HV = pl->HV;
    const bool per_channel = p->decay == LINSEQ_DECAY_PER_CHANNEL;
    const bool has_decay = p->decay != LINSEQ_DECAY_NONE;
    float beta;
    kda_load_token(pl, tok, hv, w->qs, w->ks, &beta, w->g);
    for (int64_t i = 0; i < K; i++)
        w->a[i] = !has_decay ? 1.0f : expf(per_channel ? w->g[i] : w->g[0]);
    const float *v = p->v + (tok * HV + hv) * V;
    const float *dout = b->d_o + (tok * HV + hv) * V;

    /* S' = diag(a) S_prev and the prediction S'^T k, as in the forward. */
    memset(w->pred, 0, (size_t)V * sizeof(float));
    for (int64_t i = 0; i < K; i++) {
        const float *src = S_prev + i * V;
        float *sd = w->Sd + i * V;
        const float ai = w->a[i], ki = w->ks[i];
        for (int64_t j = 0; j < V; j++) {
            sd[j] = ai * src[j];
            w->pred[j] += ki * sd[j];
        }
    }
    for (int64_t j = 0; j < V; j++) w->u[j] = beta * (v[j] - w->pred[j]);

    /* o = S_t^T qs with S_t = S' + k u^T: dqs = S_t do, dS_t += qs do^T. Then through the
     * write: du = dS_t^T k, dks = dS_t u. */
    memset(w->du, 0, (size_t)V * sizeof(float));
    for (int64_t i = 0; i < K; i++) {
        const float *sd = w->Sd + i * V;
        float *ds = w->dS + i * V;
        const float ki = w->ks[i], qi = w->qs[i];
        float acc_q = 0.0f;
        for (int64_t j = 0; j < V; j++) {
            acc_q += (sd[j] + ki * w->u[j]) * dout[j];
            ds[j] += qi * dout[j];
            w->du[j] += ki * ds[j];
        }
        w->dqs[i] = acc_q;
        w->dks[i] = ls_dot(V, ds, w->u);
    }
    /* u = beta (v - pred) */
    float dbeta = 0.0f;
    for (int64_t j = 0; j < V; j++) {
        dbeta += w->du[j] * (v[j] - w->pred[j]);
        w->dv[j] = beta * w->du[j];
        w->du[j] *= -beta; /* now dL/dpred */
    }
    /* pred = S'^T k: dS' = dS_t + k dpred^T, dks += S' dpred; then the decay. */
    for (int64_t i = 0; i < K; i++) {
        const float *sd = w->Sd + i * V;
        float *ds = w->dS + i * V;
        const float ki = w->ks[i];
        for (int64_t j = 0; j < V; j++) ds[j] += ki * w->du[j];
        w->dks[i] += ls_dot(V, sd, w->du);
        w->dg[i] = ls_dot(V, sd, ds);
        const float ai = w->a[i];
        if (has_decay)
            for (int64_t j = 0; j < V; j++) ds[j] *= ai;
    }
    if (has_decay && !per_channel) {
        float sum = 0.0f;
        for (int64_t i = 0; i < K; i++) sum += w->dg[i];
        w->dg[0] = sum;
    }
    kda_bwd_emit(b, tok, hv, w->dqs, w->dks, w->dv, dbeta, w->dg, item_partials);
}

void kda_recurrent_bwd_item(const kda_bwd *b, int64_t n, int64_t hv, int64_t tok0, int64_t len,
                            void *ws, double *item_partials)
{
    const kda_plan *pl = b->pl;
    const linseq_kda_problem *p = pl->p;
    const int64_t KV = p->K * p->V, seg = b->segment;
    rec_ws w = {0};
    carve(b, ws, &w);
    float *scratch = w.step;

    /* Checkpoints: the state before each segment. */
    const int64_t n_seg = (len + seg - 1) / seg;
    kda_state_load(pl, p->h0 ? p->h0 + (n * pl->HV + hv) * KV : NULL, w.seg);
    for (int64_t s = 0; s < n_seg; s++) {
        memcpy(w.ckpt + s * KV, w.seg, (size_t)KV * sizeof(float));
        const int64_t t0 = s * seg, cnt = len - t0 < seg ? len - t0 : seg;
        if (s + 1 < n_seg) kda_recurrent_item(pl, tok0 + t0, cnt, hv, w.seg, NULL, scratch);
    }

    kda_bwd_load_dht(b, n, hv, w.dS);
    for (int64_t s = n_seg - 1; s >= 0; s--) {
        const int64_t t0 = s * seg, cnt = len - t0 < seg ? len - t0 : seg;
        /* seg[i] = S_{t0+i-1}, the state before token t0 + i */
        memcpy(w.seg, w.ckpt + s * KV, (size_t)KV * sizeof(float));
        for (int64_t i = 1; i < cnt; i++) {
            memcpy(w.seg + i * KV, w.seg + (i - 1) * KV, (size_t)KV * sizeof(float));
            kda_recurrent_item(pl, tok0 + t0 + i - 1, 1, hv, w.seg + i * KV, NULL, scratch);
        }
        for (int64_t i = cnt - 1; i >= 0; i--)
            token_backward(b, &w, tok0 + t0 + i, hv, w.seg + i * KV, item_partials);
    }
    kda_bwd_store_dh0(b, n, hv, w.dS);
}
