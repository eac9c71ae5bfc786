/* KDA chunked mode (the WY / UT-transform form), exact for every decay g <= 0.
 *
 * Per chunk of C tokens with chunk-start state S0 [K,V] and in-chunk cumulative log decay
 * G_r = sum_{i<=r} g_i (per channel or per head):
 *     Aqk[r,c] = sum_d qs_r[d] k_c[d] e^{G_r[d]-G_c[d]}          c <= r
 *     Akk[r,c] = sum_d k_r[d] k_c[d] e^{G_r[d]-G_c[d]}           c <  r
 *     (I + diag(beta) Akk) Vnew = diag(beta) V - diag(beta) (e^G * K) S0
 *     O  = (e^G * Qs) S0 + Aqk Vnew
 *     S_C = diag(e^{G_last}) S0 + (e^{G_last - G} * K)^T Vnew
 * Vnew row r is the delta u_r of the recurrence, so the chunk reproduces it exactly.
 *
 * Why no exponent is ever positive: e^{G_r - G_c} with c <= r only multiplies decays. For a
 * per-channel decay Aqk and Akk cannot be a plain product (Q e^G)(K e^{-G})^T, whose factors
 * overflow once the decay summed over the chunk passes -88. They are built from 16-row
 * sub-chunks instead: a block of rows r in sub-chunk i against columns c in an earlier
 * sub-chunk uses the first row n of sub-chunk i as the reference,
 *     e^{G_r - G_c} = e^{G_r - G_n} e^{G_n - G_c},   both exponents <= 0 since r >= n > c,
 * which turns the block into a matrix product; the 16x16 diagonal blocks are summed
 * element by element with e^{G_r - G_c} itself.
 *
 * The cumulative sums are kept in double: a large decay followed by small ones (-1000, then
 * -0.01 ...) would otherwise leave differences G_r - G_c with only a few correct bits. Each
 * g is first raised to -110 at most: e^{-110} underflows to 0 in float32, so every factor that
 * contains such a token is 0 either way, and the sums stay small. */
#include "kda/kda_chunk.h"

#include <math.h>
#include <string.h>

#include "core/matmul.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Lays the workspace out in one block; with base == NULL it only measures. */
static size_t carve(const kda_plan *pl, unsigned char *base, kda_chunk_ws *w)
{
    const size_t C = (size_t)pl->chunk, K = (size_t)pl->p->K, V = (size_t)pl->p->V;
    const size_t gK = (size_t)pl->gK;
    size_t off = 0;
#define TAKE(field, type, count)                                                         \
    do {                                                                                 \
        if (base) w->field = (type *)(void *)(base + off);                               \
        off += align64((count) * sizeof(type));                                          \
    } while (0)
    TAKE(qs, float, C * K);
    TAKE(ks, float, C * K);
    TAKE(beta, float, C);
    TAKE(g, float, C * gK);
    TAKE(G, double, C * gK);
    TAKE(eG, float, C * gK);
    TAKE(eL, float, C * gK);
    TAKE(qg, float, C * K);
    TAKE(kbg, float, C * K);
    TAKE(kd, float, C * K);
    TAKE(kc, float, C * K);
    TAKE(qt, float, KDA_SUB_CHUNK * K);
    TAKE(kt, float, KDA_SUB_CHUNK * K);
    TAKE(tmp, float, K);
    TAKE(Aqk, float, C * C);
    TAKE(Akk, float, C * C);
    TAKE(vnew, float, C * V);
    TAKE(decay_last, float, K);
#undef TAKE
    return off;
}

size_t kda_chunk_ws_bytes(const kda_plan *pl) { return carve(pl, NULL, NULL); }
void kda_chunk_ws_carve(const kda_plan *pl, void *base, kda_chunk_ws *w) { carve(pl, base, w); }

static float exp_diff(double a, double b) { return expf((float)(a - b)); }

/* Aqk and Akk for a per-channel decay, through 16-row sub-chunks (see the file comment). */
static void build_scores_per_channel(const kda_chunk_ws *w, int64_t Lc, int64_t K, int64_t C)
{
    for (int64_t n = 0; n < Lc; n += KDA_SUB_CHUNK) {
        const int64_t m = Lc - n < KDA_SUB_CHUNK ? Lc - n : KDA_SUB_CHUNK;
        const double *Gn = w->G + n * K;
        if (n > 0) {
            for (int64_t r = 0; r < m; r++) {
                const double *Gr = w->G + (n + r) * K;
                const float *q = w->qs + (n + r) * K, *k = w->ks + (n + r) * K;
                float *qt = w->qt + r * K, *kt = w->kt + r * K;
                for (int64_t i = 0; i < K; i++) {
                    const float e = exp_diff(Gr[i], Gn[i]);
                    qt[i] = q[i] * e;
                    kt[i] = k[i] * e;
                }
            }
            for (int64_t c = 0; c < n; c++) {
                const double *Gc = w->G + c * K;
                const float *k = w->ks + c * K;
                float *kc = w->kc + c * K;
                for (int64_t i = 0; i < K; i++) kc[i] = k[i] * exp_diff(Gn[i], Gc[i]);
            }
            for (int64_t r = 0; r < m; r++)
                for (int64_t c = 0; c < n; c++) {
                    w->Aqk[(n + r) * C + c] = ls_dot(K, w->qt + r * K, w->kc + c * K);
                    w->Akk[(n + r) * C + c] = ls_dot(K, w->kt + r * K, w->kc + c * K);
                }
        }
        for (int64_t r = n; r < n + m; r++) {
            const double *Gr = w->G + r * K;
            for (int64_t c = n; c <= r; c++) {
                const double *Gc = w->G + c * K;
                const float *k = w->ks + c * K;
                for (int64_t i = 0; i < K; i++) w->tmp[i] = k[i] * exp_diff(Gr[i], Gc[i]);
                w->Aqk[r * C + c] = ls_dot(K, w->qs + r * K, w->tmp);
                if (c < r) w->Akk[r * C + c] = ls_dot(K, w->ks + r * K, w->tmp);
            }
        }
    }
}

/* With one decay per token the factor e^{G_r - G_c} is a scalar outside the dot product. */
static void build_scores_per_head(const kda_chunk_ws *w, int64_t Lc, int64_t K, int64_t C)
{
    for (int64_t r = 0; r < Lc; r++)
        for (int64_t c = 0; c <= r; c++) {
            const float d = exp_diff(w->G[r], w->G[c]);
            w->Aqk[r * C + c] = ls_dot(K, w->qs + r * K, w->ks + c * K) * d;
            if (c < r) w->Akk[r * C + c] = ls_dot(K, w->ks + r * K, w->ks + c * K) * d;
        }
}

void kda_chunk_prepare(const kda_plan *pl, const kda_chunk_ws *w, int64_t first, int64_t Lc,
                       int64_t hv)
{
    const int64_t K = pl->p->K, C = pl->chunk, gK = pl->gK;
    const bool per_channel = pl->p->decay == LINSEQ_DECAY_PER_CHANNEL;

    for (int64_t r = 0; r < Lc; r++)
        kda_load_token(pl, first + r, hv, w->qs + r * K, w->ks + r * K, &w->beta[r],
                       w->g + r * gK);
    for (int64_t i = 0; i < gK; i++) {
        double acc = 0.0;
        for (int64_t r = 0; r < Lc; r++) {
            float g = w->g[r * gK + i];
            if (g < KDA_LOG_DECAY_FLOOR) g = KDA_LOG_DECAY_FLOOR; /* NaN stays NaN */
            acc += g;
            w->G[r * gK + i] = acc;
        }
    }

    if (per_channel)
        build_scores_per_channel(w, Lc, K, C);
    else
        build_scores_per_head(w, Lc, K, C);

    const double *Glast = w->G + (Lc - 1) * gK;
    for (int64_t r = 0; r < Lc; r++) {
        const double *Gr = w->G + r * gK;
        float *eG = w->eG + r * gK, *eL = w->eL + r * gK;
        for (int64_t i = 0; i < gK; i++) {
            eG[i] = expf((float)Gr[i]);
            eL[i] = exp_diff(Glast[i], Gr[i]);
        }
        const float *q = w->qs + r * K, *k = w->ks + r * K;
        float *qg = w->qg + r * K, *kbg = w->kbg + r * K, *kd = w->kd + r * K;
        const float beta = w->beta[r];
        for (int64_t i = 0; i < K; i++) {
            const float e = eG[per_channel ? i : 0], el = eL[per_channel ? i : 0];
            qg[i] = q[i] * e;
            kbg[i] = beta * k[i] * e;
            kd[i] = k[i] * el;
        }
    }
    for (int64_t i = 0; i < K; i++)
        w->decay_last[i] = expf((float)Glast[per_channel ? i : 0]);
}

void kda_chunk_solve(const kda_plan *pl, const kda_chunk_ws *w, const float *S0, int64_t first,
                     int64_t Lc, int64_t hv)
{
    const int64_t K = pl->p->K, V = pl->p->V, HV = pl->HV, C = pl->chunk;
    ls_gemm_nn(Lc, V, K, w->kbg, K, S0, V, w->vnew, V, false);
    for (int64_t r = 0; r < Lc; r++) {
        const float *v = pl->p->v + ((first + r) * HV + hv) * V;
        float *vn = w->vnew + r * V;
        const float beta = w->beta[r];
        for (int64_t j = 0; j < V; j++) vn[j] = beta * v[j] - vn[j];
        for (int64_t c = 0; c < r; c++) {
            const float a = beta * w->Akk[r * C + c];
            const float *vc = w->vnew + c * V;
            for (int64_t j = 0; j < V; j++) vn[j] -= a * vc[j];
        }
    }
}

void kda_chunk_advance(const kda_plan *pl, const kda_chunk_ws *w, float *S, int64_t Lc)
{
    const int64_t K = pl->p->K, V = pl->p->V;
    for (int64_t i = 0; i < K; i++) {
        float *row = S + i * V;
        const float d = w->decay_last[i];
        for (int64_t j = 0; j < V; j++) row[j] *= d;
    }
    ls_gemm_tn(K, V, Lc, w->kd, K, w->vnew, V, S, V, true);
}

size_t kda_chunk_workspace_bytes(const kda_plan *pl) { return kda_chunk_ws_bytes(pl); }

void kda_chunk_item(const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv, float *S,
                    float *o, void *ws)
{
    const int64_t V = pl->p->V, HV = pl->HV, C = pl->chunk, K = pl->p->K;
    kda_chunk_ws w = {0};
    kda_chunk_ws_carve(pl, ws, &w);

    for (int64_t c0 = 0; c0 < len; c0 += C) {
        const int64_t Lc = len - c0 < C ? len - c0 : C;
        const int64_t first = tok0 + c0;
        kda_chunk_prepare(pl, &w, first, Lc, hv);
        kda_chunk_solve(pl, &w, S, first, Lc, hv);
        if (o) {
            /* The decayed chunk-start state read by q, plus the in-chunk part. */
            float *out = o + (first * HV + hv) * V;
            ls_gemm_nn(Lc, V, K, w.qg, K, S, V, out, HV * V, false);
            for (int64_t r = 0; r < Lc; r++) {
                float *orow = out + r * HV * V;
                for (int64_t c = 0; c <= r; c++) {
                    const float a = w.Aqk[r * C + c];
                    const float *vc = w.vnew + c * V;
                    for (int64_t j = 0; j < V; j++) orow[j] += a * vc[j];
                }
            }
        }
        kda_chunk_advance(pl, &w, S, Lc);
    }
}
