/* KDA chunked backward: the reverse of kda_chunk.c, one chunk at a time from the last.
 *
 * Memory: a forward pass keeps the state at the start of every chunk (one state per chunk,
 * never one per token); walking the chunks in reverse, each chunk is recomputed from its
 * start state (kda_chunk_prepare / kda_chunk_solve) and then differentiated:
 *     S_C = diag(e^{G_L}) S0 + Kd^T Vn      ->  dVn = Kd dS, dKd = Vn dS^T, dS0 = e^{G_L} dS
 *     O   = Qg S0 + Aqk Vn                  ->  dQg = dO S0^T, dS0 += Qg^T dO,
 *                                               dAqk = dO Vn^T (lower), dVn += Aqk^T dO
 *     M Vn = R, M = I + diag(beta) Akk      ->  dR = M^{-T} dVn, dM = -dR Vn^T (strict lower)
 *     R = diag(beta) V - Kbg S0             ->  dV, dbeta, dKbg = -dR S0^T, dS0 -= Kbg^T dR
 * and the factors Qg = Qs e^G, Kbg = beta K e^G, Kd = K e^{G_L - G} pass their share to dG,
 * the gradient w.r.t. the cumulative log decay. The score matrices go back through the same
 * sub-chunk factorisation as the forward, so no exponent is positive here either: for
 * A[r,c] = sum_d X_r[d] Y_c[d] e^{G_r[d]-G_c[d]},
 *     dX_r = sum_c dA[r,c] Y_c e^{G_r-G_c},  dY_c = sum_r dA[r,c] X_r e^{G_r-G_c},
 *     dG_r += X_r dX_r,  dG_c -= Y_c dY_c.
 * Finally dg_t = sum_{r >= t} dG_r inside the chunk (the earlier chunks see g_t only through
 * the state, whose gradient dS0 carries on), and tokens whose g was raised to the floor get 0:
 * every factor they enter is an exact float32 zero. */
#include <math.h>
#include <string.h>

#include "core/matmul.h"
#include "kda/kda_backward.h"
#include "kda/kda_chunk.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

typedef struct {
    float *ckpt;                 /* [n_chunks,K,V] the state at each chunk start             */
    float *S, *dS, *dS0;         /* [K,V]                                                   */
    float *dVn, *dR;             /* [C,V]; dR holds -dL/dR                                  */
    float *dqg, *dkd, *dkbg;     /* [C,K]                                                   */
    float *dqs, *dks;            /* [C,K]                                                   */
    float *dX, *dY;              /* [C,K] score backward results                            */
    float *fr, *fc, *xt, *yt;    /* [C,K] sub-chunk factors and factored rows               */
    float *prod;                 /* [C,K]                                                   */
    float *dAqk, *dAkk, *dAe;    /* [C,C]                                                   */
    float *dbeta;                /* [C]                                                     */
    float *dg;                   /* [C,gK] the emitted dg                                   */
    double *dG;                  /* [C,gK] dL/dG: many terms that cancel, so summed in double */
    double *dGL;                 /* [gK]                                                    */
    double *dgt;                 /* [gK] the running sum sum_{r >= t} dG_r                  */
    unsigned char *chunk;        /* the forward's chunk workspace                           */
} bwd_ws;

static size_t carve(const kda_bwd *b, unsigned char *base, bwd_ws *w)
{
    const kda_plan *pl = b->pl;
    const size_t C = (size_t)pl->chunk, K = (size_t)pl->p->K, V = (size_t)pl->p->V;
    const size_t gK = (size_t)pl->gK, KV = K * V;
    const size_t n_chunks = ((size_t)b->max_len + C - 1) / C;
    size_t off = 0;
#define TAKE_T(field, type, count)                                                       \
    do {                                                                                 \
        if (base) w->field = (type *)(void *)(base + off);                               \
        off += align64((count) * sizeof(type));                                          \
    } while (0)
#define TAKE(field, count) TAKE_T(field, float, count)
    TAKE(ckpt, (n_chunks ? n_chunks : 1) * KV);
    TAKE(S, KV);
    TAKE(dS, KV);
    TAKE(dS0, KV);
    TAKE(dVn, C * V);
    TAKE(dR, C * V);
    TAKE(dqg, C * K);
    TAKE(dkd, C * K);
    TAKE(dkbg, C * K);
    TAKE(dqs, C * K);
    TAKE(dks, C * K);
    TAKE(dX, C * K);
    TAKE(dY, C * K);
    TAKE(fr, C * K);
    TAKE(fc, C * K);
    TAKE(xt, C * K);
    TAKE(yt, C * K);
    TAKE(prod, C * K);
    TAKE(dAqk, C * C);
    TAKE(dAkk, C * C);
    TAKE(dAe, C * C);
    TAKE(dbeta, C);
    TAKE(dg, C * gK);
    TAKE_T(dG, double, C * gK);
    TAKE_T(dGL, double, gK);
    TAKE_T(dgt, double, gK);
#undef TAKE
#undef TAKE_T
    if (base) w->chunk = base + off;
    return off + kda_chunk_ws_bytes(pl);
}

size_t kda_chunk_bwd_ws_bytes(const kda_bwd *b) { return carve(b, NULL, NULL); }

/* dG_row += sign * a (*) b: element-wise per channel, summed over K per head. */
static void add_dG(double *dG_row, int64_t gK, int64_t K, const float *a, const float *b,
                   double sign)
{
    if (gK == K) {
        for (int64_t d = 0; d < K; d++) dG_row[d] += sign * (double)(a[d] * b[d]);
    } else {
        dG_row[0] += sign * (double)ls_dot(K, a, b);
    }
}

/* For A[r,c] = sum_d X_r[d] Y_c[d] e^{G_r[d]-G_c[d]} (c <= r, or c < r when strict):
 * dX = dA-weighted Y, dY = dA-weighted X, both overwritten (see the file comment). */
static void scores_backward_per_channel(const bwd_ws *w, const kda_chunk_ws *cw, int64_t Lc,
                                        int64_t K, int64_t C, const float *dA, bool strict,
                                        const float *X, const float *Y)
{
    memset(w->dX, 0, (size_t)(Lc * K) * sizeof(float));
    memset(w->dY, 0, (size_t)(Lc * K) * sizeof(float));
    for (int64_t n = 0; n < Lc; n += KDA_SUB_CHUNK) {
        const int64_t m = Lc - n < KDA_SUB_CHUNK ? Lc - n : KDA_SUB_CHUNK;
        const double *Gn = cw->G + n * K;
        if (n > 0) {
            /* rows r of this sub-chunk against every column c < n, through reference row n */
            for (int64_t r = 0; r < m; r++) {
                const double *Gr = cw->G + (n + r) * K;
                for (int64_t d = 0; d < K; d++) {
                    const float f = expf((float)(Gr[d] - Gn[d]));
                    w->fr[r * K + d] = f;
                    w->xt[r * K + d] = X[(n + r) * K + d] * f;
                }
            }
            for (int64_t c = 0; c < n; c++) {
                const double *Gc = cw->G + c * K;
                for (int64_t d = 0; d < K; d++) {
                    const float f = expf((float)(Gn[d] - Gc[d]));
                    w->fc[c * K + d] = f;
                    w->yt[c * K + d] = Y[c * K + d] * f;
                }
            }
            ls_gemm_nn(m, K, n, dA + n * C, C, w->yt, K, w->prod, K, false);
            for (int64_t r = 0; r < m; r++)
                for (int64_t d = 0; d < K; d++)
                    w->dX[(n + r) * K + d] += w->fr[r * K + d] * w->prod[r * K + d];
            ls_gemm_tn(n, K, m, dA + n * C, C, w->xt, K, w->prod, K, false);
            for (int64_t c = 0; c < n; c++)
                for (int64_t d = 0; d < K; d++)
                    w->dY[c * K + d] += w->fc[c * K + d] * w->prod[c * K + d];
        }
        for (int64_t r = n; r < n + m; r++) {
            const double *Gr = cw->G + r * K;
            for (int64_t c = n; c < r + (strict ? 0 : 1); c++) {
                const double *Gc = cw->G + c * K;
                const float a = dA[r * C + c];
                for (int64_t d = 0; d < K; d++) {
                    const float e = a * expf((float)(Gr[d] - Gc[d]));
                    w->dX[r * K + d] += e * Y[c * K + d];
                    w->dY[c * K + d] += e * X[r * K + d];
                }
            }
        }
    }
}

/* The same with one decay per row: e^{G_r - G_c} is a scalar weight of dA. */
static void scores_backward_per_head(const bwd_ws *w, const kda_chunk_ws *cw, int64_t Lc,
                                     int64_t K, int64_t C, const float *dA, bool strict,
                                     const float *X, const float *Y)
{
    for (int64_t r = 0; r < Lc; r++)
        for (int64_t c = 0; c < Lc; c++)
            w->dAe[r * C + c] = (c < r || (c == r && !strict))
                                    ? dA[r * C + c] * expf((float)(cw->G[r] - cw->G[c]))
                                    : 0.0f;
    ls_gemm_nn(Lc, K, Lc, w->dAe, C, Y, K, w->dX, K, false);
    ls_gemm_tn(Lc, K, Lc, w->dAe, C, X, K, w->dY, K, false);
}

static void scores_backward(const kda_plan *pl, const bwd_ws *w, const kda_chunk_ws *cw,
                            int64_t Lc, const float *dA, bool strict, const float *X,
                            const float *Y)
{
    const int64_t K = pl->p->K, C = pl->chunk;
    if (pl->p->decay == LINSEQ_DECAY_PER_CHANNEL)
        scores_backward_per_channel(w, cw, Lc, K, C, dA, strict, X, Y);
    else
        scores_backward_per_head(w, cw, Lc, K, C, dA, strict, X, Y);
}

/* The backward of one chunk: dS holds dL/dS_C on entry, dL/dS0 on return. */
static void chunk_backward(const kda_bwd *b, bwd_ws *w, const kda_chunk_ws *cw, int64_t first,
                           int64_t Lc, int64_t hv, const float *S0, double *item_partials)
{
    const kda_plan *pl = b->pl;
    const linseq_kda_problem *p = pl->p;
    const int64_t K = p->K, V = p->V, HV = pl->HV, C = pl->chunk, gK = pl->gK;
    const int64_t ldo = HV * V;
    const float *dO = b->d_o + (first * HV + hv) * V;
    const float *Vn = cw->vnew;
    const bool has_decay = p->decay != LINSEQ_DECAY_NONE;

    memset(w->dG, 0, (size_t)(Lc * gK) * sizeof(double));
    memset(w->dGL, 0, (size_t)gK * sizeof(double));
    memset(w->dbeta, 0, (size_t)Lc * sizeof(float));

    /* S_C = diag(e^{G_L}) S0 + Kd^T Vn */
    ls_gemm_nn(Lc, V, K, cw->kd, K, w->dS, V, w->dVn, V, false);
    ls_gemm_nt(Lc, K, V, Vn, V, w->dS, V, w->dkd, K, false);
    for (int64_t i = 0; i < K; i++) {
        const float *ds = w->dS + i * V, *s0 = S0 + i * V;
        float *d0 = w->dS0 + i * V;
        const float e = cw->decay_last[i];
        for (int64_t j = 0; j < V; j++) d0[j] = e * ds[j];
        w->dGL[gK == K ? i : 0] += (double)(e * ls_dot(V, s0, ds));
    }

    /* O = Qg S0 + Aqk Vn */
    ls_gemm_nt(Lc, K, V, dO, ldo, S0, V, w->dqg, K, false);
    ls_gemm_tn(K, V, Lc, cw->qg, K, dO, ldo, w->dS0, V, true);
    for (int64_t r = 0; r < Lc; r++)
        for (int64_t c = 0; c <= r; c++) {
            w->dAqk[r * C + c] = ls_dot(V, dO + r * ldo, Vn + c * V);
            const float a = cw->Aqk[r * C + c];
            float *dvc = w->dVn + c * V;
            const float *dor = dO + r * ldo;
            for (int64_t j = 0; j < V; j++) dvc[j] += a * dor[j];
        }

    /* M Vn = R: dR = M^{-T} dVn by back substitution, stored negated in w->dR; then
     * dM[r,c] = -dR_r . Vn_c with M[r,c] = beta_r Akk[r,c]. */
    for (int64_t r = Lc - 1; r >= 0; r--) {
        float *x = w->dR + r * V;
        const float *src = w->dVn + r * V;
        for (int64_t j = 0; j < V; j++) x[j] = -src[j];
        for (int64_t c = r + 1; c < Lc; c++) {
            const float m = cw->beta[c] * cw->Akk[c * C + r];
            const float *xc = w->dR + c * V;
            for (int64_t j = 0; j < V; j++) x[j] -= m * xc[j];
        }
    }
    for (int64_t r = 0; r < Lc; r++)
        for (int64_t c = 0; c < r; c++) {
            const float dM = ls_dot(V, w->dR + r * V, Vn + c * V); /* = -dR_r . Vn_c */
            w->dbeta[r] += dM * cw->Akk[r * C + c];
            w->dAkk[r * C + c] = dM * cw->beta[r];
        }

    /* R = diag(beta) V - Kbg S0, with -dR in w->dR */
    for (int64_t r = 0; r < Lc; r++) {
        const float *v = p->v + ((first + r) * HV + hv) * V;
        w->dbeta[r] -= ls_dot(V, v, w->dR + r * V);
    }
    ls_gemm_nt(Lc, K, V, w->dR, V, S0, V, w->dkbg, K, false);
    ls_gemm_tn(K, V, Lc, cw->kbg, K, w->dR, V, w->dS0, V, true);

    for (int64_t r = 0; r < Lc; r++) {
        const float *k = cw->ks + r * K, *eG = cw->eG + r * gK, *eL = cw->eL + r * gK;
        float *dks = w->dks + r * K, *dqs = w->dqs + r * K;
        double *dG = w->dG + r * gK;
        const float *dkbg = w->dkbg + r * K, *dqg = w->dqg + r * K, *dkd = w->dkd + r * K;
        const float beta = cw->beta[r];
        float db = 0.0f;
        for (int64_t d = 0; d < K; d++) {
            const float e = eG[gK == K ? d : 0], el = eL[gK == K ? d : 0];
            db += dkbg[d] * k[d] * e;              /* Kbg = beta K e^G             */
            dks[d] = beta * e * dkbg[d] + el * dkd[d]; /* ... and Kd = K e^{G_L - G} */
            dqs[d] = e * dqg[d];                   /* Qg = Qs e^G                  */
        }
        w->dbeta[r] += db;
        if (has_decay) {
            add_dG(dG, gK, K, dkbg, cw->kbg + r * K, 1.0);
            add_dG(dG, gK, K, dqg, cw->qg + r * K, 1.0);
            /* Kd's exponent G_L - G_r: -dG_r, and +dG_L for every row */
            add_dG(dG, gK, K, dkd, cw->kd + r * K, -1.0);
            add_dG(w->dGL, gK, K, dkd, cw->kd + r * K, 1.0);
        }
    }

    /* The score matrices: Aqk (qs against k, diagonal included), Akk (k against k). */
    scores_backward(pl, w, cw, Lc, w->dAqk, false, cw->qs, cw->ks);
    for (int64_t r = 0; r < Lc; r++) {
        for (int64_t d = 0; d < K; d++) {
            w->dqs[r * K + d] += w->dX[r * K + d];
            w->dks[r * K + d] += w->dY[r * K + d];
        }
        if (has_decay) {
            add_dG(w->dG + r * gK, gK, K, cw->qs + r * K, w->dX + r * K, 1.0);
            add_dG(w->dG + r * gK, gK, K, cw->ks + r * K, w->dY + r * K, -1.0);
        }
    }
    scores_backward(pl, w, cw, Lc, w->dAkk, true, cw->ks, cw->ks);
    for (int64_t r = 0; r < Lc; r++) {
        for (int64_t d = 0; d < K; d++)
            w->dks[r * K + d] += w->dX[r * K + d] + w->dY[r * K + d];
        if (has_decay) {
            add_dG(w->dG + r * gK, gK, K, cw->ks + r * K, w->dX + r * K, 1.0);
            add_dG(w->dG + r * gK, gK, K, cw->ks + r * K, w->dY + r * K, -1.0);
        }
    }
    for (int64_t i = 0; i < gK; i++) w->dG[(Lc - 1) * gK + i] += w->dGL[i];

    /* dg_t = sum_{r >= t} dG_r, a running sum from the last row. A floored decay enters only
     * exact zeros, so its own gradient is 0. */
    memset(w->dgt, 0, (size_t)gK * sizeof(double));
    for (int64_t r = Lc - 1; r >= 0; r--) {
        float *dg = w->dg + r * gK;
        for (int64_t i = 0; i < gK; i++) {
            w->dgt[i] += w->dG[r * gK + i];
            dg[i] = cw->g[r * gK + i] < KDA_LOG_DECAY_FLOOR ? 0.0f : (float)w->dgt[i];
        }
    }
    for (int64_t r = 0; r < Lc; r++) {
        /* the token's dv = beta_r dR_r (w->dR holds -dR); dVn row r is free to hold it */
        float *dv = w->dVn + r * V;
        const float beta = cw->beta[r], *ndr = w->dR + r * V;
        for (int64_t j = 0; j < V; j++) dv[j] = -beta * ndr[j];
        kda_bwd_emit(b, first + r, hv, w->dqs + r * K, w->dks + r * K, dv, w->dbeta[r],
                     has_decay ? w->dg + r * gK : NULL, item_partials);
    }

    /* dS0 becomes the dS of the previous chunk */
    memcpy(w->dS, w->dS0, (size_t)(K * V) * sizeof(float));
}

void kda_chunk_bwd_item(const kda_bwd *b, int64_t n, int64_t hv, int64_t tok0, int64_t len,
                        void *ws, double *item_partials)
{
    const kda_plan *pl = b->pl;
    const linseq_kda_problem *p = pl->p;
    const int64_t KV = p->K * p->V, C = pl->chunk;
    bwd_ws w = {0};
    carve(b, ws, &w);
    kda_chunk_ws cw = {0};
    kda_chunk_ws_carve(pl, w.chunk, &cw);

    const int64_t n_chunks = (len + C - 1) / C;
    kda_state_load(pl, p->h0 ? p->h0 + (n * pl->HV + hv) * KV : NULL, w.S);
    for (int64_t c = 0; c < n_chunks; c++) {
        memcpy(w.ckpt + c * KV, w.S, (size_t)KV * sizeof(float));
        if (c + 1 == n_chunks) break;
        const int64_t first = tok0 + c * C;
        kda_chunk_prepare(pl, &cw, first, C, hv);
        kda_chunk_solve(pl, &cw, w.S, first, C, hv);
        kda_chunk_advance(pl, &cw, w.S, C);
    }

    kda_bwd_load_dht(b, n, hv, w.dS);
    for (int64_t c = n_chunks - 1; c >= 0; c--) {
        const int64_t first = tok0 + c * C, Lc = len - c * C < C ? len - c * C : C;
        const float *S0 = w.ckpt + c * KV;
        kda_chunk_prepare(pl, &cw, first, Lc, hv);
        kda_chunk_solve(pl, &cw, S0, first, Lc, hv);
        chunk_backward(b, &w, &cw, first, Lc, hv, S0, item_partials);
    }
    kda_bwd_store_dh0(b, n, hv, w.dS);
}
