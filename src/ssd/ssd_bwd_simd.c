/* The SSD backward (ssd.h), compiled once per ISA. One item is one (sequence, head): it runs
 * the state forward from h0 chunk by chunk, keeping the state before each chunk, then walks
 * the chunks back with dS, the gradient at the chunk's last state (N-first, as the state).
 *
 * Per chunk of n tokens (the forward's notation, ssd_simd.c; dY_i the gradient at y_i before
 * the gate and the skip, E[i,j] = exp(lam_i - lam_j) on and below the diagonal, w_j =
 * exp(lam_{n-1} - lam_j), Q = dY U^T):
 *     dC   = diag(exp(lam)) dY S_prev + (Q o E) B
 *     dB   = (Q o E)^T C + diag(w) U dS^T
 *     dU   = M^T dY + diag(w) B dS
 *     dS_prev = exp(lam_{n-1}) dS + C^T diag(exp(lam)) dY
 * and the gradient at each partial sum lam_i, from the three places it enters (the read-out
 * of S_prev, the scores M, the carry to the chunk's end), is summed back into each a_j = dt_j A
 * (da_j = sum over i >= j). */
#include <math.h>
#include <string.h>

#include "ssd/ssd_kernel.h"

/* The backward's own blocks, after the forward's in a thread's scratch. */
typedef struct bwd_bufs {
    float *Bc, *Wb, *dC, *dB, *dY, *dYs, *dU, *Yf, *Q, *Ut, *Sp, *dS, *dSp, *dlam, *ckpt;
} bwd_bufs;

static bwd_bufs carve_bwd(float *s, int64_t P, int64_t N, int64_t L)
{
    bwd_bufs e;
    float **parts[] = {&e.Bc, &e.Wb, &e.dC, &e.dB, &e.dY,  &e.dYs,  &e.dU,  &e.Yf,
                       &e.Q,  &e.Ut, &e.Sp, &e.dS, &e.dSp, &e.dlam, &e.ckpt};
    const int64_t sizes[] = {L * N, L * N, L * N, L * N, L * P, L * P, L * P, L * P,
                             L * L, P * L, N * P, N * P, N * P, L,     0};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *parts[i] = s;
        s += ssd_round16(sizes[i]);
    }
    return e;
}

/* dst [cols,rows] = src [rows,cols] transposed. */
static void transpose(const float *src, int64_t rows, int64_t cols, float *dst)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++) dst[k * rows + r] = src[r * cols + k];
}

static float dot(const float *a, const float *b, int64_t n)
{
    vf acc = vf_zero();
    for (int64_t i = 0; i < n; i += VW) {
        const int64_t m = n - i < VW ? n - i : VW;
        acc = vf_fmadd(vf_load_n(a + i, m), vf_load_n(b + i, m), acc);
    }
    return vf_hsum(acc);
}

/* out[i] = scale[i] * in[i] for rows of `cols` floats. */
static void scale_rows(const float *in, const float *scale, int64_t rows, int64_t cols, float *out)
{
    for (int64_t i = 0; i < rows; i++) {
        const vf s = vf_set1(scale[i]);
        for (int64_t p = 0; p < cols; p += VW) {
            const int64_t m = cols - p < VW ? cols - p : VW;
            vf_store_n(out + i * cols + p, vf_mul(s, vf_load_n(in + i * cols + p, m)), m);
        }
    }
}

/* The state after a chunk (the forward's update, no outputs). */
static void advance(const ssd_plan *pl, const ssd_item *it, int64_t c0, int64_t n, chunk_bufs *c)
{
    const int64_t P = pl->P, N = pl->N;
    chunk_decays(pl, it, c0, n, c);
    chunk_gather(pl, it, c0, n, c);
    scale_rows(c->U, c->wdec, n, P, c->W);
    for (int64_t k = 0; k < N; k++) c->nscale[k] = c->elam[n - 1];
    ls_gemm_scaled(N, P, n, c->Bt, pl->chunk, 1, c->W, P, c->St, P, true, c->nscale);
}

/* dY = d_y (* silu(z)); with z, dz from the output before the gate, recomputed. */
static void chunk_upstream(const ssd_plan *pl, const ssd_item *it, int64_t c0, int64_t n,
                           chunk_bufs *c, bwd_bufs *e)
{
    const int64_t P = pl->P, L = pl->chunk;
    if (pl->z) { /* Yf = diag(exp(lam)) C S_prev + M U: y before the skip and the gate */
        memcpy(e->Yf, c->Y, (size_t)(n * P) * sizeof(float));
        chunk_outputs(n, P, L, c, e->Yf);
    }
    const float *D = pl->D ? pl->D + (pl->D_per_channel ? it->h * P : it->h) : NULL;
    for (int64_t i = 0; i < n; i++) {
        const int64_t o = at_hp(pl, it, c0 + i);
        const float *dy = pl->d_y + o, *x = pl->x + o;
        for (int64_t p = 0; p < P; p += VW) {
            const int64_t m = P - p < VW ? P - p : VW;
            const vf g = vf_load_n(dy + p, m);
            if (!pl->z) {
                vf_store_n(e->dY + i * P + p, g, m);
                continue;
            }
            const vf z = vf_load_n(pl->z + o + p, m), sig = vf_sigmoid(z);
            vf yf = vf_load_n(e->Yf + i * P + p, m);
            if (D) {
                const vf d = pl->D_per_channel ? vf_load_n(D + p, m) : vf_set1(D[0]);
                yf = vf_fmadd(d, vf_load_n(x + p, m), yf);
            }
            vf_store_n(e->dY + i * P + p, vf_mul(g, vf_mul(z, sig)), m);
            if (pl->dz) { /* silu'(z) = sig (1 + z (1 - sig)) */
                const vf one = vf_set1(1.0f);
                const vf dsilu = vf_mul(sig, vf_fmadd(z, vf_sub(one, sig), one));
                vf_store_n(pl->dz + o + p, vf_mul(vf_mul(g, yf), dsilu), m);
            }
        }
    }
}

/* The gradient at the partial sums from the scores: R = M o Q adds to lam_i along its row and
 * takes from lam_j along its column; then Q becomes Q o E (zero above the diagonal). */
static void chunk_score_grads(int64_t n, int64_t L, const chunk_bufs *c, bwd_bufs *e)
{
    for (int64_t i = 0; i < n; i++) {
        const float *m = c->M + i * L;
        float *q = e->Q + i * L;
        for (int64_t j = 0; j <= i; j++) {
            const float r = m[j] * q[j];
            e->dlam[i] += r;
            e->dlam[j] -= r;
        }
        ssd_decay_row(e->Q, i, n, L, c->lam);
    }
}

/* Per token: dx, ddt (w.r.t. dt as given), this head's dB and dC, and the per-head sums. */
static void chunk_token_grads(const ssd_plan *pl, const ssd_item *it, int64_t c0, int64_t n,
                              const chunk_bufs *c, const bwd_bufs *e, float *dA, float *dbias,
                              float *dD)
{
    const int64_t P = pl->P, N = pl->N, H = pl->H;
    const float A = pl->A[it->h];
    const float *D = pl->D ? pl->D + (pl->D_per_channel ? it->h * P : it->h) : NULL;
    float da = 0.0f; /* sum of dlam over i >= j, walked from the chunk's end */
    for (int64_t j = n - 1; j >= 0; j--) {
        da += e->dlam[j];
        const int64_t t = c0 + j, o = at_hp(pl, it, t);
        const float d = c->dtv[j], *x = pl->x + o, *du = e->dU + j * P, *dy = e->dY + j * P;
        const float dd = A * da + dot(du, x, P);
        *dA += d * da;
        if (pl->dx)
            for (int64_t p = 0; p < P; p += VW) {
                const int64_t m = P - p < VW ? P - p : VW;
                vf v = vf_mul(vf_set1(d), vf_load_n(du + p, m));
                if (D) {
                    const vf s = pl->D_per_channel ? vf_load_n(D + p, m) : vf_set1(D[0]);
                    v = vf_fmadd(s, vf_load_n(dy + p, m), v);
                }
                vf_store_n(pl->dx + o + p, v, m);
            }
        if (dD) {
            if (pl->D_per_channel)
                for (int64_t p = 0; p < P; p++) dD[p] += dy[p] * x[p];
            else
                dD[0] += dot(dy, x, P);
        }
        /* through the clamp (a clamped dt passes no gradient) and the softplus */
        const float raw = pl->dt[at_h(pl, it, t)];
        const float biased = raw + (pl->dt_bias ? pl->dt_bias[it->h] : 0.0f);
        const float pre = pl->dt_softplus ? ls_softplusf(biased) : raw;
        float g = pl->dt_max > pl->dt_min && (pre < pl->dt_min || pre > pl->dt_max) ? 0.0f : dd;
        if (pl->dt_softplus) g *= ls_sigmoidf(biased);
        *dbias += g;
        if (pl->ddt) pl->ddt[at_h(pl, it, t)] = g;
        const int64_t tok = it->b * pl->T + it->t0 + t;
        float *db = pl->dBh  ? pl->dBh + (tok * H + it->h) * N
                    : pl->dB ? pl->dB + at_gn(pl, it, t)
                             : NULL;
        float *dc = pl->dCh  ? pl->dCh + (tok * H + it->h) * N
                    : pl->dC ? pl->dC + at_gn(pl, it, t)
                             : NULL;
        if (db) memcpy(db, e->dB + j * N, (size_t)N * sizeof(float));
        if (dc) memcpy(dc, e->dC + j * N, (size_t)N * sizeof(float));
    }
}

/* One chunk back: from dS (the gradient at its last state) to the gradient at the state
 * before it, writing its tokens' gradients. c->St holds the state before the chunk. */
static void chunk_back(const ssd_plan *pl, const ssd_item *it, int64_t c0, int64_t n, chunk_bufs *c,
                       bwd_bufs *e, float *dA, float *dbias, float *dD)
{
    const int64_t P = pl->P, N = pl->N, L = pl->chunk;
    chunk_decays(pl, it, c0, n, c);
    chunk_gather(pl, it, c0, n, c);
    for (int64_t i = 0; i < n; i++)
        memcpy(e->Bc + i * N, pl->Bp + at_gn(pl, it, c0 + i), (size_t)N * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int64_t p = 0; p < P; p++) e->Ut[p * L + i] = c->U[i * P + p];
    chunk_scores(n, N, L, c);
    ls_gemm(n, P, N, c->Cc, N, 1, c->St, P, c->Y, P, false); /* C S_prev */
    chunk_upstream(pl, it, c0, n, c, e);
    transpose(c->St, N, P, e->Sp);
    transpose(e->dS, N, P, e->dSp);

    memset(e->dlam, 0, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) e->dlam[i] = c->elam[i] * dot(e->dY + i * P, c->Y + i * P, P);
    ls_gemm(n, n, P, e->dY, P, 1, e->Ut, L, e->Q, L, false);
    chunk_score_grads(n, L, c, e);

    ls_gemm(n, N, P, e->dY, P, 1, e->Sp, N, e->dC, N, false);
    ssd_scale_rows(e->dC, c->elam, n, N);
    ssd_tri(e->dC, N, e->Bc, N, N, n, e->Q, L, 1, false, true);
    scale_rows(c->U, c->wdec, n, P, c->W);
    ssd_tri(e->dB, N, c->Cc, N, N, n, e->Q, 1, L, true, false);
    ls_gemm(n, N, P, c->W, P, 1, e->dSp, N, e->dB, N, true);

    scale_rows(e->Bc, c->wdec, n, N, e->Wb);
    ls_gemm(n, P, N, e->Wb, N, 1, e->dS, P, e->dU, P, false);
    float carried = c->elam[n - 1] * dot(e->dS, c->St, N * P);
    for (int64_t j = 0; j < n; j++) {
        const float term = dot(c->U + j * P, e->dU + j * P, P);
        carried += term;
        e->dlam[j] -= term;
    }
    e->dlam[n - 1] += carried;
    ssd_tri(e->dU, P, e->dY, P, P, n, c->M, 1, L, true, true);

    scale_rows(e->dY, c->elam, n, P, e->dYs);
    for (int64_t k = 0; k < N; k++) c->nscale[k] = c->elam[n - 1];
    ls_gemm_scaled(N, P, n, c->Cc, 1, N, e->dYs, P, e->dS, P, true, c->nscale);
    chunk_token_grads(pl, it, c0, n, c, e, dA, dbias, dD);
}

/* The gradient at the initial state, in the layout of h0. */
static void store_dh0(const ssd_plan *pl, const ssd_item *it, const float *dSt)
{
    const int64_t P = pl->P, N = pl->N;
    float *dst = pl->dh0 + (it->row * pl->H + it->h) * P * N;
    if (pl->n_first)
        memcpy(dst, dSt, (size_t)(P * N) * sizeof(float));
    else
        transpose(dSt, N, P, dst);
}

void LS_ISA_FN(ls_ssd_bwd_item)(void *ctx, int64_t item, int thread)
{
    const ssd_plan *pl = ctx;
    const ssd_item it = locate(pl, item);
    const int64_t P = pl->P, N = pl->N, L = pl->chunk;
    float *scratch = pl->scratch + (int64_t)thread * pl->scratch_floats;
    chunk_bufs c = carve(scratch, P, N, L);
    bwd_bufs e = carve_bwd(scratch + ssd_scratch_floats(P, N, true, L), P, N, L);
    const int64_t n_chunks = (it.n_tokens + L - 1) / L, NP = ssd_round16(N * P);

    load_state(pl, &it, c.St);
    for (int64_t k = 0; k < n_chunks; k++) {
        memcpy(e.ckpt + k * NP, c.St, (size_t)(N * P) * sizeof(float));
        if (k + 1 < n_chunks) advance(pl, &it, k * L, L, &c);
    }
    if (pl->d_hT) {
        ssd_plan up = *pl;
        up.s0 = pl->d_hT;
        load_state(&up, &it, e.dS);
    } else {
        memset(e.dS, 0, (size_t)(N * P) * sizeof(float));
    }
    float dA = 0.0f, dbias = 0.0f;
    float *dD = pl->item_dD ? pl->item_dD + item * (pl->D_per_channel ? P : 1) : NULL;
    if (dD) memset(dD, 0, (size_t)(pl->D_per_channel ? P : 1) * sizeof(float));
    for (int64_t k = n_chunks - 1; k >= 0; k--) {
        const int64_t c0 = k * L, n = it.n_tokens - c0 < L ? it.n_tokens - c0 : L;
        memcpy(c.St, e.ckpt + k * NP, (size_t)(N * P) * sizeof(float));
        chunk_back(pl, &it, c0, n, &c, &e, &dA, &dbias, dD);
    }
    if (pl->dh0) store_dh0(pl, &it, e.dS);
    pl->item_dA[item] = dA;
    pl->item_dbias[item] = dbias;
}
