/* Internal: what the SSD kernels share (ssd_simd.c, ssd_bwd_simd.c): where an item's tokens
 * and state lie, its dt, and the chunk's decays, gathered blocks and scores. Include only from
 * sources compiled once per ISA: every function is static inline. */
#ifndef LS_SSD_SSD_KERNEL_H
#define LS_SSD_SSD_KERNEL_H

#include <math.h>
#include <string.h>

#include "core/activation.h"
#include "simd/bf16.h"
#include "simd/gemm.h"
#include "simd/gemm_bf16.h"
#include "simd/vec.h"
#include "ssd/ssd.h"

/* Where one item's tokens and state lie. */
typedef struct ssd_item {
    int64_t s, b, h, g, t0, n_tokens, row; /* s: the sequence (a decode's request) */
} ssd_item;

/* One decode token of item `it` from its bf16 row `from` into `to` (mamba's [P,N] layout),
 * the new state rounded by AVX512-BF16's instruction on the AVX-512 kernels
 * (ssd_decode_bf16_simd.c; every other ISA: the integer rounding, the same bits). */
LS_ISA_DECLARE(void, ls_ssd_decode_bf16_row,
               (const ssd_plan *pl, const ssd_item *it, const void *from, void *to, float *ys));

static inline ssd_item locate(const ssd_plan *pl, int64_t item)
{
    ssd_item it;
    const int64_t s = item / pl->H;
    it.s = s;
    it.h = item % pl->H;
    it.g = it.h / (pl->H / pl->G);
    it.b = pl->cu ? 0 : s;
    it.t0 = pl->cu ? pl->cu[s] : 0;
    it.n_tokens = pl->cu ? pl->cu[s + 1] - pl->cu[s] : pl->T;
    it.row = pl->by_row ? pl->by_row->src[s] : pl->rows ? pl->rows[s] : s;
    return it;
}

/* Offsets of token t (of the item's sequence) in the [.,T,H,P], [.,T,H] and [.,T,G,N] tensors. */
static inline int64_t at_hp(const ssd_plan *pl, const ssd_item *it, int64_t t)
{
    return ((it->b * pl->T + it->t0 + t) * pl->H + it->h) * pl->P;
}
static inline int64_t at_h(const ssd_plan *pl, const ssd_item *it, int64_t t)
{
    return (it->b * pl->T + it->t0 + t) * pl->H + it->h;
}
static inline int64_t at_gn(const ssd_plan *pl, const ssd_item *it, int64_t t)
{
    return ((it->b * pl->T + it->t0 + t) * pl->G + it->g) * pl->N;
}

/* dt of token t as the recurrence uses it: biased and softplus'd, then clamped. */
static inline float step_dt(const ssd_plan *pl, const ssd_item *it, int64_t t)
{
    float d = pl->dt[at_h(pl, it, t)];
    if (pl->dt_softplus) d = ls_softplusf(d + (pl->dt_bias ? pl->dt_bias[it->h] : 0.0f));
    if (pl->dt_max > pl->dt_min) d = fminf(fmaxf(d, pl->dt_min), pl->dt_max);
    return d;
}

/* The state row of the item in a [rows,H,P,N] (or N-first [rows,H,N,P]) buffer, to and from
 * St [N,P]. */
static inline void load_state(const ssd_plan *pl, const ssd_item *it, float *St)
{
    const int64_t P = pl->P, N = pl->N, size = P * N;
    if (!pl->s0) {
        memset(St, 0, (size_t)size * sizeof *St);
        return;
    }
    const float *src = pl->s0 + (it->row * pl->H + it->h) * size;
    if (pl->n_first) {
        memcpy(St, src, (size_t)size * sizeof *St);
        return;
    }
    for (int64_t p = 0; p < P; p++)
        for (int64_t n = 0; n < N; n++) St[n * P + p] = src[p * N + n];
}

static inline void store_state(const ssd_plan *pl, const ssd_item *it, const float *St)
{
    const int64_t P = pl->P, N = pl->N, size = P * N;
    float *dst = pl->sT + (it->row * pl->H + it->h) * size;
    if (pl->n_first) {
        memcpy(dst, St, (size_t)size * sizeof *St);
        return;
    }
    for (int64_t p = 0; p < P; p++)
        for (int64_t n = 0; n < N; n++) dst[p * N + n] = St[n * P + p];
}

/* y_t from the state's read-out `ys` [P]: + D x_t, then * silu(z_t). */
static inline void finish_token(const ssd_plan *pl, const ssd_item *it, int64_t t, const float *ys)
{
    const int64_t P = pl->P, o = at_hp(pl, it, t);
    const float *x = pl->x + o, *z = pl->z ? pl->z + o : NULL;
    const float *D = pl->D ? pl->D + (pl->D_per_channel ? it->h * P : it->h) : NULL;
    float *y = pl->y + o;
    for (int64_t p = 0; p < P; p += VW) {
        const int64_t m = P - p < VW ? P - p : VW;
        vf v = vf_load_n(ys + p, m);
        if (D) {
            const vf d = pl->D_per_channel ? vf_load_n(D + p, m) : vf_set1(D[0]);
            v = vf_fmadd(d, vf_load_n(x + p, m), v);
        }
        if (z) v = vf_mul(v, vf_silu(vf_load_n(z + p, m)));
        vf_store_n(y + p, v, m);
    }
}

/* One thread's chunk buffers, carved from its scratch (ssd_scratch_floats). */
typedef struct chunk_bufs {
    float *St, *Cc, *Bt, *U, *W, *Y, *M, *lam, *elam, *wdec, *dtv, *nscale;
} chunk_bufs;

static inline chunk_bufs carve(float *s, int64_t P, int64_t N, int64_t L)
{
    chunk_bufs c;
    float **parts[] = {&c.St, &c.Cc,  &c.Bt,   &c.U,    &c.W,   &c.Y,
                       &c.M,  &c.lam, &c.elam, &c.wdec, &c.dtv, &c.nscale};
    const int64_t sizes[] = {N * P, L * N, N * L, L * P, L * P, L * P, L * L, L, L, L, L, N};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *parts[i] = s;
        s += ssd_round16(sizes[i]);
    }
    return c;
}

/* The chunk's decays: lam (partial sums), exp(lam), exp(lam_{n-1} - lam) and dt. */
static inline void chunk_decays(const ssd_plan *pl, const ssd_item *it, int64_t c0, int64_t n,
                                chunk_bufs *c)
{
    const float A = pl->A[it->h];
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        c->dtv[i] = step_dt(pl, it, c0 + i);
        sum += c->dtv[i] * A;
        c->lam[i] = sum;
    }
    const vf last = vf_set1(c->lam[n - 1]);
    for (int64_t i = 0; i < n; i += VW) {
        const int64_t m = n - i < VW ? n - i : VW;
        const vf l = vf_load_n(c->lam + i, m);
        vf_store_n(c->elam + i, vf_exp(l), m);
        vf_store_n(c->wdec + i, vf_exp(vf_sub(last, l)), m);
    }
}

/* C rows [n,N], B transposed [N,L] and U = dt x [n,P] of the chunk. */
static inline void chunk_gather(const ssd_plan *pl, const ssd_item *it, int64_t c0, int64_t n,
                                chunk_bufs *c)
{
    const int64_t P = pl->P, N = pl->N;
    for (int64_t i = 0; i < n; i++) {
        const int64_t gn = at_gn(pl, it, c0 + i);
        memcpy(c->Cc + i * N, pl->Cp + gn, (size_t)N * sizeof(float));
        for (int64_t k = 0; k < N; k++) c->Bt[k * pl->chunk + i] = pl->Bp[gn + k];
        const float *x = pl->x + at_hp(pl, it, c0 + i);
        const vf d = vf_set1(c->dtv[i]);
        for (int64_t p = 0; p < P; p += VW) {
            const int64_t m = P - p < VW ? P - p : VW;
            vf_store_n(c->U + i * P + p, vf_mul(d, vf_load_n(x + p, m)), m);
        }
    }
}

/* Row i of the [n, L]-strided block A times exp(lam_i - lam_j) for j <= i, and 0 above the
 * diagonal: the decay between token j and token i of a chunk. */
static inline void ssd_decay_row(float *A, int64_t i, int64_t n, int64_t L, const float *lam)
{
    float *row = A + i * L;
    const vf li = vf_set1(lam[i]);
    for (int64_t j = 0; j <= i; j += VW) {
        const int64_t m = i + 1 - j < VW ? i + 1 - j : VW;
        const vf e = vf_exp(vf_sub(li, vf_load_n(lam + j, m)));
        vf_store_n(row + j, vf_mul(vf_load_n(row + j, m), e), m);
    }
    memset(row + i + 1, 0, (size_t)(n - i - 1) * sizeof(float));
}

/* M = (C B^T) o exp(lam_i - lam_j) on and below the diagonal, 0 above. */
static inline void chunk_scores(int64_t n, int64_t N, int64_t L, chunk_bufs *c)
{
    ls_gemm(n, n, N, c->Cc, N, 1, c->Bt, L, c->M, L, false);
    for (int64_t i = 0; i < n; i++) ssd_decay_row(c->M, i, n, L, c->lam);
}

/* The product with a triangular factor, over the columns [0, cols) of Y:
 *     Y_i (+)= sum_j coef[i*coef_r + j*coef_c] X_j,   j in [0, i] (lower) or [i, n) (upper)
 * for the rows i in [0, n), j increasing. Only the triangle is visited: a product over the
 * whole block with zeros in the other triangle would turn one token's NaN or Inf into
 * 0 * NaN = NaN in the tokens that do not depend on it. */
#define SSD_TRI_COLS 4
static inline void ssd_tri(float *Y, int64_t ldy, const float *X, int64_t ldx, int64_t cols,
                           int64_t n, const float *coef, int64_t coef_r, int64_t coef_c, bool upper,
                           bool accumulate)
{
    for (int64_t c0 = 0; c0 < cols; c0 += SSD_TRI_COLS * VW) {
        const int64_t width = cols - c0 < SSD_TRI_COLS * VW ? cols - c0 : SSD_TRI_COLS * VW;
        const int nv = (int)((width + VW - 1) / VW);
        for (int64_t i = 0; i < n; i++) {
            float *row = Y + i * ldy + c0;
            const int64_t lo = upper ? i : 0, hi = upper ? n : i + 1;
            vf acc[SSD_TRI_COLS];
            for (int v = 0; v < nv; v++) {
                const int64_t m = width - v * VW < VW ? width - v * VW : VW;
                acc[v] = accumulate ? vf_load_n(row + v * VW, m) : vf_zero();
            }
            for (int64_t j = lo; j < hi; j++) {
                const vf f = vf_set1(coef[i * coef_r + j * coef_c]);
                const float *src = X + j * ldx + c0;
                for (int v = 0; v < nv; v++) {
                    const int64_t m = width - v * VW < VW ? width - v * VW : VW;
                    acc[v] = vf_fmadd(f, vf_load_n(src + v * VW, m), acc[v]);
                }
            }
            for (int v = 0; v < nv; v++) {
                const int64_t m = width - v * VW < VW ? width - v * VW : VW;
                vf_store_n(row + v * VW, acc[v], m);
            }
        }
    }
}

/* rows of `cols` floats scaled in place: Y_i *= scale[i]. */
static inline void ssd_scale_rows(float *Y, const float *scale, int64_t rows, int64_t cols)
{
    for (int64_t i = 0; i < rows; i++) {
        const vf s = vf_set1(scale[i]);
        for (int64_t p = 0; p < cols; p += VW) {
            const int64_t m = cols - p < VW ? cols - p : VW;
            vf_store_n(Y + i * cols + p, vf_mul(s, vf_load_n(Y + i * cols + p, m)), m);
        }
    }
}

/* Y = diag(exp(lam)) (C S_prev) + M U: the chunk's outputs before the skip and the gate,
 * Y holding C S_prev on entry. */
static inline void chunk_outputs(int64_t n, int64_t P, int64_t L, const chunk_bufs *c, float *Y)
{
    ssd_scale_rows(Y, c->elam, n, P);
    ssd_tri(Y, P, c->U, P, P, n, c->M, L, 1, false, true);
}

/* ---- bf16 products (pl->bf16_products, simd/gemm_bf16.h) ------------------------------ */

/* The packed bf16 operands of the output's products, carved from the thread's scratch after
 * the chunk buffers, in ssd_bf16_parts' order and sizes. */
typedef struct chunk_words {
    uint32_t *C, *Bt, *St, *M, *U;
} chunk_words;

static inline chunk_words carve_words(uint32_t *w, int64_t P, int64_t N, int64_t L)
{
    chunk_words cw;
    uint32_t **parts[SSD_BF16_PARTS] = {&cw.C, &cw.Bt, &cw.St, &cw.M, &cw.U};
    int64_t words[SSD_BF16_PARTS];
    ssd_bf16_parts(P, N, L, words);
    for (int i = 0; i < SSD_BF16_PARTS; i++) {
        *parts[i] = w;
        w += ssd_round16(words[i]);
    }
    return cw;
}

/* M = (C B^T) o decays with bf16 operands C and B (the float32 order of chunk_scores), by row
 * blocks up to each block's last column: ssd_decay_row zeroes every score above the
 * diagonal. Leaves C packed by rows in w->C for ssd_read_bf16. */
static inline void ssd_scores_bf16(const ssd_plan *pl, int64_t n, chunk_bufs *c,
                                   const chunk_words *w)
{
    const int64_t N = pl->N, L = pl->chunk, Nw = (N + 1) / 2, S = SSD_BF16_BLOCK;
    ls_pack_bf16_rows(n, N, c->Cc, N, w->C, Nw);
    ls_pack_bf16_pairs(N, n, c->Bt, L, w->Bt, L);
    for (int64_t r0 = 0; r0 < n; r0 += S) {
        const int64_t m = n - r0 < S ? n - r0 : S;
        ls_gemm_bf16(pl->bf16_dot, m, r0 + m, Nw, w->C + r0 * Nw, Nw, 1, w->Bt, L, c->M + r0 * L, L,
                     false, NULL);
    }
    for (int64_t i = 0; i < n; i++) ssd_decay_row(c->M, i, n, L, c->lam);
}

/* Y = C St with bf16 operands, C packed by ssd_scores_bf16. */
static inline void ssd_read_bf16(const ssd_plan *pl, int64_t n, const chunk_bufs *c,
                                 const chunk_words *w, float *Y)
{
    const int64_t P = pl->P, N = pl->N, Nw = (N + 1) / 2;
    ls_pack_bf16_pairs(N, P, c->St, P, w->St, P);
    ls_gemm_bf16(pl->bf16_dot, n, P, Nw, w->C, Nw, 1, w->St, P, Y, P, false, NULL);
}

/* ssd_tri's lower product, accumulating, with coef [n, ldc] row-major (Y_i += sum_{j <= i}
 * coef[i*ldc + j] X_j): for each SSD_BF16_BLOCK-token block of rows from r0, the columns
 * j < r0 in one product on bf16 operands (coef's rows packed into cw [n, ldc/2] words, X's
 * rows that earlier blocks hold by pairs into xw [., cols]), then the block's own triangle in
 * float32 as without them, so that no product visits a later token. */
static inline void ssd_tri_lower_bf16(bool dot, float *Y, int64_t ldy, const float *X, int64_t ldx,
                                      int64_t cols, int64_t n, const float *coef, int64_t ldc,
                                      uint32_t *cw, uint32_t *xw)
{
    const int64_t S = SSD_BF16_BLOCK, cww = ldc / 2;
    ls_pack_bf16_pairs((n - 1) / S * S, cols, X, ldx, xw, cols);
    for (int64_t r0 = 0; r0 < n; r0 += S) {
        const int64_t m = n - r0 < S ? n - r0 : S;
        if (r0 > 0) { /* r0 is even: whole words */
            ls_pack_bf16_rows(m, r0, coef + r0 * ldc, ldc, cw + r0 * cww, cww);
            ls_gemm_bf16(dot, m, cols, r0 / 2, cw + r0 * cww, cww, 1, xw, cols, Y + r0 * ldy, ldy,
                         true, NULL);
        }
        ssd_tri(Y + r0 * ldy, ldy, X + r0 * ldx, ldx, cols, m, coef + r0 * ldc + r0, ldc, 1, false,
                true);
    }
}

/* Y = diag(exp(lam)) Y + M U with M U's products between 16-token blocks on bf16 operands
 * (M after its decays, U = dt x after dt): Y holds C St on entry. */
static inline void ssd_outputs_bf16(const ssd_plan *pl, int64_t n, const chunk_bufs *c,
                                    const chunk_words *w, float *Y)
{
    const int64_t P = pl->P;
    ssd_scale_rows(Y, c->elam, n, P);
    ssd_tri_lower_bf16(pl->bf16_dot, Y, P, c->U, P, P, n, c->M, pl->chunk, w->M, w->U);
}

#endif
