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
 * (da_j = sum over i >= j).
 * With bf16 products (pl->bf16_products) every product that only the tokens' gradients read
 * takes bf16 operands (simd/gemm_bf16.h), each rounded once after its scaling: the
 * recomputed M = (C B^T) o E and C S_prev (the forward's bf16 products, so y before the gate,
 * which dz reads, is the forward's bits), Q = dY U^T, dY S_prev, diag(w) U dS^T and
 * diag(w) B dS, and the triangular products (Q o E) B, (Q o E)^T C and M^T dY between
 * 16-token blocks (each block's own triangle stays float32, so that no product visits a token
 * across the causal mask). The gradient at the state, dS_prev = exp(lam_{n-1}) dS +
 * C^T diag(exp(lam)) dY, reads none of them and stays float32 with the states recomputed
 * from h0: dh0 is bit for bit the float32 products'. */
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

/* The packed bf16 operands of the backward's products (pl->bf16_products), after the rest of
 * a thread's scratch: the forward's (the scores, C S_prev and, for dz, M U), then the
 * backward's own, in ssd_bwd_bf16_parts' order and sizes (ssd.h says what each holds). */
typedef struct bwd_words {
    chunk_words f;
    uint32_t *dYr, *dYp, *Ut, *Sp, *dSp, *Qr, *Qp, *Bp, *Cp, *W, *Wb, *dS, *Mp;
} bwd_words;

static bwd_words carve_bwd_words(uint32_t *w, int64_t P, int64_t N, int64_t L)
{
    bwd_words b;
    b.f = carve_words(w, P, N, L);
    w += ssd_bf16_words(P, N, L);
    uint32_t **parts[SSD_BWD_BF16_PARTS] = {&b.dYr, &b.dYp, &b.Ut, &b.Sp, &b.dSp, &b.Qr, &b.Qp,
                                            &b.Bp,  &b.Cp,  &b.W,  &b.Wb, &b.dS,  &b.Mp};
    int64_t words[SSD_BWD_BF16_PARTS];
    ssd_bwd_bf16_parts(P, N, L, words);
    for (int i = 0; i < SSD_BWD_BF16_PARTS; i++) {
        *parts[i] = w;
        w += ssd_round16(words[i]);
    }
    return b;
}

/* ssd_tri's upper product with coef [n, ldc] row-major read transposed (Y_i (+)= sum_{j >= i}
 * coef[j*ldc + i] X_j): for each SSD_BF16_BLOCK-token block of rows from r0, the tokens j of
 * the later blocks in one product on bf16 operands (coef's rows and X's rows from the second
 * block on, packed by pairs into cw [., ldc] and xw [., cols]), then the block's own triangle
 * in float32 as without them, so that no product visits a token across the mask. */
static void ssd_tri_upper_bf16(bool dot, float *Y, int64_t ldy, const float *X, int64_t ldx,
                               int64_t cols, int64_t n, const float *coef, int64_t ldc,
                               uint32_t *cw, uint32_t *xw, bool accumulate)
{
    const int64_t S = SSD_BF16_BLOCK;
    if (n > S) { /* the rows later blocks hold, for the columns of the blocks before them */
        ls_pack_bf16_pairs(n - S, (n - 1) / S * S, coef + S * ldc, ldc, cw + S / 2 * ldc, ldc);
        ls_pack_bf16_pairs(n - S, cols, X + S * ldx, ldx, xw + S / 2 * cols, cols);
    }
    for (int64_t r0 = 0; r0 < n; r0 += S) {
        const int64_t m = n - r0 < S ? n - r0 : S, k0 = r0 + m; /* k0 is even: whole words */
        if (k0 < n)
            ls_gemm_bf16(dot, m, cols, (n - k0 + 1) / 2, cw + k0 / 2 * ldc + r0, 1, ldc,
                         xw + k0 / 2 * cols, cols, Y + r0 * ldy, ldy, accumulate, NULL);
        ssd_tri(Y + r0 * ldy, ldy, X + r0 * ldx, ldx, cols, m, coef + r0 * ldc + r0, 1, ldc, true,
                accumulate || k0 < n);
    }
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
                           chunk_bufs *c, bwd_bufs *e, const bwd_words *w)
{
    const int64_t P = pl->P, L = pl->chunk;
    if (pl->z) { /* Yf = diag(exp(lam)) C S_prev + M U: y before the skip and the gate */
        memcpy(e->Yf, c->Y, (size_t)(n * P) * sizeof(float));
        if (w)
            ssd_outputs_bf16(pl, n, c, &w->f, e->Yf);
        else
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
 * before it, writing its tokens' gradients. c->St holds the state before the chunk. w: the
 * packed operands with bf16 products, NULL without. */
static void chunk_back(const ssd_plan *pl, const ssd_item *it, int64_t c0, int64_t n, chunk_bufs *c,
                       bwd_bufs *e, const bwd_words *w, float *dA, float *dbias, float *dD)
{
    const int64_t P = pl->P, N = pl->N, L = pl->chunk, S = SSD_BF16_BLOCK;
    const int64_t Pw = (P + 1) / 2, Nw = (N + 1) / 2;
    const bool dotp = pl->bf16_dot;
    chunk_decays(pl, it, c0, n, c);
    chunk_gather(pl, it, c0, n, c);
    for (int64_t i = 0; i < n; i++)
        memcpy(e->Bc + i * N, pl->Bp + at_gn(pl, it, c0 + i), (size_t)N * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int64_t p = 0; p < P; p++) e->Ut[p * L + i] = c->U[i * P + p];
    if (w) { /* M and C S_prev as the forward's bf16 products compute them */
        ssd_scores_bf16(pl, n, c, &w->f);
        ssd_read_bf16(pl, n, c, &w->f, c->Y);
    } else {
        chunk_scores(n, N, L, c);
        ls_gemm(n, P, N, c->Cc, N, 1, c->St, P, c->Y, P, false); /* C S_prev */
    }
    chunk_upstream(pl, it, c0, n, c, e, w);
    transpose(c->St, N, P, e->Sp);
    transpose(e->dS, N, P, e->dSp);

    memset(e->dlam, 0, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) e->dlam[i] = c->elam[i] * dot(e->dY + i * P, c->Y + i * P, P);
    if (w) { /* Q = dY U^T by row blocks up to each block's last column (the rest is zeroed) */
        ls_pack_bf16_rows(n, P, e->dY, P, w->dYr, Pw);
        ls_pack_bf16_pairs(P, n, e->Ut, L, w->Ut, L);
        for (int64_t r0 = 0; r0 < n; r0 += S) {
            const int64_t m = n - r0 < S ? n - r0 : S;
            ls_gemm_bf16(dotp, m, r0 + m, Pw, w->dYr + r0 * Pw, Pw, 1, w->Ut, L, e->Q + r0 * L, L,
                         false, NULL);
        }
    } else {
        ls_gemm(n, n, P, e->dY, P, 1, e->Ut, L, e->Q, L, false);
    }
    chunk_score_grads(n, L, c, e);

    if (w) {
        ls_pack_bf16_pairs(P, N, e->Sp, N, w->Sp, N);
        ls_gemm_bf16(dotp, n, N, Pw, w->dYr, Pw, 1, w->Sp, N, e->dC, N, false, NULL);
        ssd_scale_rows(e->dC, c->elam, n, N);
        ssd_tri_lower_bf16(dotp, e->dC, N, e->Bc, N, N, n, e->Q, L, w->Qr, w->Bp);
        scale_rows(c->U, c->wdec, n, P, c->W);
        ssd_tri_upper_bf16(dotp, e->dB, N, c->Cc, N, N, n, e->Q, L, w->Qp, w->Cp, false);
        ls_pack_bf16_rows(n, P, c->W, P, w->W, Pw);
        ls_pack_bf16_pairs(P, N, e->dSp, N, w->dSp, N);
        ls_gemm_bf16(dotp, n, N, Pw, w->W, Pw, 1, w->dSp, N, e->dB, N, true, NULL);
        scale_rows(e->Bc, c->wdec, n, N, e->Wb);
        ls_pack_bf16_rows(n, N, e->Wb, N, w->Wb, Nw);
        ls_pack_bf16_pairs(N, P, e->dS, P, w->dS, P);
        ls_gemm_bf16(dotp, n, P, Nw, w->Wb, Nw, 1, w->dS, P, e->dU, P, false, NULL);
    } else {
        ls_gemm(n, N, P, e->dY, P, 1, e->Sp, N, e->dC, N, false);
        ssd_scale_rows(e->dC, c->elam, n, N);
        ssd_tri(e->dC, N, e->Bc, N, N, n, e->Q, L, 1, false, true);
        scale_rows(c->U, c->wdec, n, P, c->W);
        ssd_tri(e->dB, N, c->Cc, N, N, n, e->Q, 1, L, true, false);
        ls_gemm(n, N, P, c->W, P, 1, e->dSp, N, e->dB, N, true);
        scale_rows(e->Bc, c->wdec, n, N, e->Wb);
        ls_gemm(n, P, N, e->Wb, N, 1, e->dS, P, e->dU, P, false);
    }
    float carried = c->elam[n - 1] * dot(e->dS, c->St, N * P);
    for (int64_t j = 0; j < n; j++) {
        const float term = dot(c->U + j * P, e->dU + j * P, P);
        carried += term;
        e->dlam[j] -= term;
    }
    e->dlam[n - 1] += carried;
    if (w)
        ssd_tri_upper_bf16(dotp, e->dU, P, e->dY, P, P, n, c->M, L, w->Mp, w->dYp, true);
    else
        ssd_tri(e->dU, P, e->dY, P, P, n, c->M, 1, L, true, true);

    /* dS_prev = exp(lam_{n-1}) dS + C^T diag(exp(lam)) dY: float32 either way */
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
    /* with bf16 products, the packed operands at the end of the scratch */
    const int64_t n_words = ssd_bwd_bf16_words(P, N, L);
    const bwd_words w =
        pl->bf16_products
            ? carve_bwd_words((uint32_t *)(void *)(scratch + pl->scratch_floats - n_words), P, N, L)
            : (bwd_words){.dYr = NULL};
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
        chunk_back(pl, &it, c0, n, &c, &e, pl->bf16_products ? &w : NULL, &dA, &dbias, dD);
    }
    if (pl->dh0) store_dh0(pl, &it, e.dS);
    pl->item_dA[item] = dA;
    pl->item_dbias[item] = dbias;
}
