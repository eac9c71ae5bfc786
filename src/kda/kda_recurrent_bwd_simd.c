/* KDA recurrent backward: the reverse of kda_recurrent_simd.c, token by token; compiled once
 * per ISA.
 *
 * Memory: the state is checkpointed every `segment` tokens in a forward pass; walking the
 * segments in reverse, the states inside one segment are recomputed into a segment-deep
 * buffer, so a thread holds (ceil(len/segment) + segment) states, never one per token.
 *
 * One token, with S = S_{t-1}, a the decays, S' = diag(a) S, pred = S'^T k, u = beta (v -
 * pred), S_t = S' + k u^T, o = S_t^T qs, and dS = dL/dS_t on entry (o's share not yet in):
 *     du     = dS^T k + (k . qs) do             dpred = -beta du
 *     dqs_i  = a_i (S_i . do) + k_i (u . do)
 *     dks_i  = dS_i . u + qs_i (do . u) + a_i (S_i . dpred)
 *     dS'_i  = dS_i + qs_i do + k_i dpred,   dg_i = a_i (S_i . dS'_i),   dS_{t-1,i} = a_i dS'_i
 * Columns j only meet column j in du, u and dpred, so the state is walked in column blocks
 * (two passes over a block: the column sums, then the update); the row sums i collect one
 * vector per row across the blocks and are reduced sixteen rows at a time. */
#include <math.h>
#include <string.h>

#include "kda/kda_backward.h"
#include "kda/kda_chunk.h"
#include "kda/kda_simd.h"

/* This ISA's recurrent forward, which rebuilds the states of a segment from its checkpoint. */
#define advance_state LS_ISA_FN(kda_recurrent_item)

enum { COLS = 4 }; /* vectors per column block */

typedef struct {
    float *ckpt, *seg;      /* [n_ckpt,K,V], [segment,K,V] */
    float *dS;              /* [K,V] dL/dS_t running backwards */
    float *qs, *ks, *g, *a; /* [K] loaded token, decay factors */
    float *ak;              /* [K] a * k */
    float *dqs, *dks, *dg;  /* [K] */
    float *rows;            /* [4,K,VW] per-row vector partial sums */
    float *dv;              /* [V] */
    float *step;            /* the forward step's scratch */
} rec_ws;

static size_t carve(const kda_bwd *b, unsigned char *base, rec_ws *w)
{
    const size_t K = (size_t)b->pl->p->K, V = (size_t)b->pl->p->V, KV = K * V;
    const size_t seg = (size_t)b->segment;
    const size_t n_ckpt = ((size_t)b->max_len + seg - 1) / seg;
    const size_t Kr = (K + VW - 1) / VW * VW; /* rows rounded up to whole reduction groups */
    size_t off = 0;
#define TAKE(field, count)                                                                         \
    do {                                                                                           \
        if (base) w->field = (float *)(void *)(base + off);                                        \
        off += kda_align64((count) * sizeof(float));                                               \
    } while (0)
    if (!b->saved) TAKE(ckpt, (n_ckpt ? n_ckpt : 1) * KV); /* else from the saved forward */
    TAKE(seg, seg * KV);
    TAKE(dS, KV);
    TAKE(qs, K);
    TAKE(ks, K);
    TAKE(g, K);
    TAKE(a, K);
    TAKE(ak, K);
    TAKE(dqs, Kr);
    TAKE(dks, Kr);
    TAKE(dg, Kr);
    TAKE(rows, 4 * Kr * VW);
    TAKE(dv, V);
    TAKE(step, kda_recurrent_scratch_floats(b->pl));
#undef TAKE
    return off;
}

size_t LS_ISA_FN(kda_recurrent_bwd_ws_bytes)(const kda_bwd *b) { return carve(b, NULL, NULL); }

static inline vf load_w(const float *p, int64_t w)
{
    return w == VW ? vf_load(p) : vf_load_n(p, w);
}
static inline void store_w(float *p, vf v, int64_t w)
{
    if (w == VW)
        vf_store(p, v);
    else
        vf_store_n(p, v, w);
}

/* Undoes token tok given S_prev = S_{t-1}; w->dS holds dL/dS_t and becomes dL/dS_{t-1}. */
static void token_backward(const kda_bwd *b, const rec_ws *w, int64_t tok, int64_t hv,
                           const float *S, double *item_partials)
{
    const kda_plan *pl = b->pl;
    const linseq_kda_problem *p = pl->p;
    const int64_t K = p->K, V = p->V, HV = pl->HV;
    const int64_t Kr = (K + VW - 1) / VW * VW;
    float beta;
    kda_load_token_v(pl, tok, hv, w->qs, w->ks, &beta, w->g);
    kda_row_decays(pl, w->g, w->a); /* exactly as the forward */
    for (int64_t i = 0; i < K; i++) w->ak[i] = w->a[i] * w->ks[i];
    const float kq = ls_vdot(K, w->ks, w->qs);
    const bool delta = pl->delta;
    const float *v = p->v + (tok * HV + hv) * V;
    const float *dout = b->d_o + (tok * HV + hv) * V;
    /* per-row vector partial sums: S.do, dS.u, S.dpred, S.dS' */
    float *r_sdo = w->rows, *r_dsu = r_sdo + Kr * VW, *r_sdp = r_dsu + Kr * VW,
          *r_sds = r_sdp + Kr * VW;
    memset(w->rows, 0, (size_t)(4 * Kr * VW) * sizeof(float));
    vf udo_acc = vf_zero(), dbeta_acc = vf_zero();

    for (int64_t j0 = 0; j0 < V; j0 += COLS * VW) {
        const int64_t width = V - j0 < COLS * VW ? V - j0 : COLS * VW;
        const int nv = (int)((width + VW - 1) / VW);
        const int64_t w_last = width - (int64_t)(nv - 1) * VW;
        vf pred[COLS], du[COLS], vdo[COLS], u[COLS], dp[COLS];
        for (int c = 0; c < COLS; c++) pred[c] = du[c] = vf_zero();
        for (int c = 0; c < nv; c++) vdo[c] = load_w(dout + j0 + c * VW, c == nv - 1 ? w_last : VW);
        /* pass 1: the column sums pred = S^T (a k), dS^T k, and the row sums S_i . do */
        for (int64_t i = 0; i < K; i++) {
            const float *s = S + i * V + j0, *ds = w->dS + i * V + j0;
            const vf vak = vf_set1(w->ak[i]), vk = vf_set1(w->ks[i]);
            vf row = vf_zero();
            for (int c = 0; c < nv; c++) {
                const int64_t wc = c == nv - 1 ? w_last : VW;
                const vf sv = load_w(s + c * VW, wc), dsv = load_w(ds + c * VW, wc);
                pred[c] = vf_fmadd(vak, sv, pred[c]);
                du[c] = vf_fmadd(vk, dsv, du[c]);
                row = vf_fmadd(sv, vdo[c], row);
            }
            vf_store(r_sdo + i * VW, vf_add(vf_load(r_sdo + i * VW), row));
        }
        const vf vb = vf_set1(beta), vkq = vf_set1(kq);
        for (int c = 0; c < nv; c++) {
            const int64_t wc = c == nv - 1 ? w_last : VW;
            const vf vin = load_w(v + j0 + c * VW, wc);
            const vf resid = delta ? vf_sub(vin, pred[c]) : vin;
            u[c] = vf_mul(vb, resid);
            du[c] = vf_fmadd(vkq, vdo[c], du[c]); /* o's share of dS_t, (k . qs) do */
            udo_acc = vf_fmadd(u[c], vdo[c], udo_acc);
            dbeta_acc = vf_fmadd(du[c], resid, dbeta_acc);
            store_w(w->dv + j0 + c * VW, vf_mul(vb, du[c]), wc);
            /* without the delta rule (beta 1) nothing was predicted: no gradient flows back
             * through pred */
            dp[c] = delta ? vf_mul(vf_sub(vf_zero(), vb), du[c]) : vf_zero();
        }
        /* pass 2: the row sums dS_i . u, S_i . dpred, S_i . dS'_i, and dS <- diag(a) dS' */
        for (int64_t i = 0; i < K; i++) {
            const float *s = S + i * V + j0;
            float *ds = w->dS + i * V + j0;
            const vf vq = vf_set1(w->qs[i]), vk = vf_set1(w->ks[i]), va = vf_set1(w->a[i]);
            vf rsu = vf_zero(), rsp = vf_zero(), rss = vf_zero();
            for (int c = 0; c < nv; c++) {
                const int64_t wc = c == nv - 1 ? w_last : VW;
                const vf sv = load_w(s + c * VW, wc), dsv = load_w(ds + c * VW, wc);
                rsu = vf_fmadd(dsv, u[c], rsu);
                rsp = vf_fmadd(sv, dp[c], rsp);
                const vf dsd = vf_fmadd(vk, dp[c], vf_fmadd(vq, vdo[c], dsv)); /* dS'_i */
                rss = vf_fmadd(sv, dsd, rss);
                store_w(ds + c * VW, vf_mul(va, dsd), wc);
            }
            vf_store(r_dsu + i * VW, vf_add(vf_load(r_dsu + i * VW), rsu));
            vf_store(r_sdp + i * VW, vf_add(vf_load(r_sdp + i * VW), rsp));
            vf_store(r_sds + i * VW, vf_add(vf_load(r_sds + i * VW), rss));
        }
    }
    const float udo = vf_hsum(udo_acc), dbeta = vf_hsum(dbeta_acc);
    /* the row sums, sixteen (VW) rows at a time */
    for (int64_t i0 = 0; i0 < Kr; i0 += VW) {
        vf t_sdo = vf_hsum_lanes((const vf *)(const void *)(r_sdo + i0 * VW));
        vf t_dsu = vf_hsum_lanes((const vf *)(const void *)(r_dsu + i0 * VW));
        vf t_sdp = vf_hsum_lanes((const vf *)(const void *)(r_sdp + i0 * VW));
        vf t_sds = vf_hsum_lanes((const vf *)(const void *)(r_sds + i0 * VW));
        float sdo[VW], dsu[VW], sdp[VW], sds[VW];
        vf_store(sdo, t_sdo);
        vf_store(dsu, t_dsu);
        vf_store(sdp, t_sdp);
        vf_store(sds, t_sds);
        for (int64_t l = 0; l < VW && i0 + l < K; l++) {
            const int64_t i = i0 + l;
            w->dqs[i] = w->a[i] * sdo[l] + w->ks[i] * udo;
            w->dks[i] = dsu[l] + w->qs[i] * udo + w->a[i] * sdp[l];
            w->dg[i] = w->a[i] * sds[l];
        }
    }
    if (p->decay == LINSEQ_DECAY_PER_HEAD) {
        float sum = 0.0f;
        for (int64_t i = 0; i < K; i++) sum += w->dg[i];
        w->dg[0] = sum;
    }
    kda_bwd_emit(b, tok, hv, w->dqs, w->dks, w->dv, dbeta, w->dg, item_partials);
}

void LS_ISA_FN(kda_recurrent_bwd_item)(const kda_bwd *b, int64_t n, int64_t hv, int64_t tok0,
                                       int64_t len, void *ws, double *item_partials)
{
    const kda_plan *pl = b->pl;
    const linseq_kda_problem *p = pl->p;
    const int64_t KV = p->K * p->V, seg = b->segment;
    rec_ws w = {0};
    carve(b, ws, &w);
    float *scratch = w.step;

    /* Checkpoints: the state before each segment (saved by a training forward, or made here) */
    const int64_t n_seg = (len + seg - 1) / seg;
    const float *saved = kda_bwd_saved_block(b, n, hv);
    const float *ckpt = saved ? saved : w.ckpt;
    if (!saved) {
        kda_state_load(pl, p->h0 ? p->h0 + (n * pl->HV + hv) * KV : NULL, w.seg);
        for (int64_t s = 0; s < n_seg; s++) {
            memcpy(w.ckpt + s * KV, w.seg, (size_t)KV * sizeof(float));
            const int64_t t0 = s * seg, cnt = len - t0 < seg ? len - t0 : seg;
            if (s + 1 < n_seg) advance_state(pl, tok0 + t0, cnt, hv, w.seg, NULL, scratch, 0, p->V);
        }
    }

    kda_bwd_load_dht(b, n, hv, w.dS);
    for (int64_t s = n_seg - 1; s >= 0; s--) {
        const int64_t t0 = s * seg, cnt = len - t0 < seg ? len - t0 : seg;
        /* seg[i] = S_{t0+i-1}, the state before token t0 + i */
        memcpy(w.seg, ckpt + s * KV, (size_t)KV * sizeof(float));
        for (int64_t i = 1; i < cnt; i++) {
            memcpy(w.seg + i * KV, w.seg + (i - 1) * KV, (size_t)KV * sizeof(float));
            advance_state(pl, tok0 + t0 + i - 1, 1, hv, w.seg + i * KV, NULL, scratch, 0, p->V);
        }
        for (int64_t i = cnt - 1; i >= 0; i--)
            token_backward(b, &w, tok0 + t0 + i, hv, w.seg + i * KV, item_partials);
    }
    kda_bwd_store_dh0(b, n, hv, w.dS);
}
