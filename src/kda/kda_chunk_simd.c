/* KDA chunked mode (the WY / UT-transform form), exact for every decay g <= 0; compiled once
 * per ISA.
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
 * No exponent is ever evaluated at all beyond the per-token decays a_t = e^{g_t} <= 1: every
 * factor e^{G_r - G_c} (c <= r) is the product a_{c+1} ... a_r. A product of factors <= 1
 * cannot overflow, a token with g = -1000 contributes an exact 0 without disturbing the other
 * factors (where a difference of cumulative sums would lose their bits), and the rounding of
 * a product grows only with its length (<= 1.7 ulp per factor; the chains below are short).
 * For a per-channel decay Aqk and Akk cannot be a plain product (Q e^G)(K e^{-G})^T, whose
 * factors overflow once the decay over the chunk passes -88. They are built from 16-row
 * sub-chunks instead: rows r of sub-chunk i against columns c of an earlier sub-chunk j
 * factor as
 *     e^{G_r - G_c} = e^{G_r - G_n} * e^{G_n - G_e} * e^{G_e - G_c}
 * with n the first row of i and e the last row of j (n > e >= c): three products of decays,
 * so the block is a matrix product of scaled rows and scaled columns; the 16 x 16 diagonal
 * blocks run their products element by element. Each g is first raised to -110 at most: its
 * a_t is then an exact float32 zero either way.
 * Without the delta rule (gated linear attention, pl->delta false) there is nothing to solve:
 * Vnew = V, and Akk is not needed (the products skip it; the diagonal blocks, which form it in
 * the same pass as Aqk, leave it unread).
 *
 * With bf16 products (pl->bf16_products) the products that only the output reads take bf16
 * operands (simd/gemm_bf16.h): (e^G * Qs) S0, Aqk Vnew between 16-row blocks (the diagonal
 * blocks' triangles stay float32, visiting no later token) and, with one decay per head,
 * Aqk's own Qs K^T. Everything the state depends on (Akk, the solve, K S0, the update) stays
 * float32, so the final state is bit for bit the float32 path's: rounding the operands of
 * K S0 or of the update to bf16 leaves errors of 3e-4 and 3e-3 relative in the final state
 * (K = V = 128, slow decays), above the 1e-4 the state is held to. */
#include <string.h>

#include "kda/kda_chunk.h"
#include "kda/kda_simd.h"
#include "simd/gemm_bf16.h"

/* y = x * s over n floats */
static inline void vmul3(int64_t n, const float *x, const float *s, float *y)
{
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vf_store(y + i, vf_mul(vf_load(x + i), vf_load(s + i)));
    if (i < n) vf_store_n(y + i, vf_mul(vf_load_n(x + i, n - i), vf_load_n(s + i, n - i)), n - i);
}

static inline void vfill(int64_t n, float value, float *y)
{
    const vf v = vf_set1(value);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vf_store(y + i, v);
    if (i < n) vf_store_n(y + i, v, n - i);
}

/* y = x * s over n floats, s one scalar */
static inline void vmul_scalar(int64_t n, const float *x, float s, float *y)
{
    const vf sv = vf_set1(s);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vf_store(y + i, vf_mul(vf_load(x + i), sv));
    if (i < n) vf_store_n(y + i, vf_mul(vf_load_n(x + i, n - i), sv), n - i);
}

/* One token's rows of q, k (head h), v and o (head hv) lie H*K or HV*V floats apart from the
 * next token's: a stride of pages that the hardware prefetchers do not follow, so each load
 * of a chunk would wait for memory. The chunked item requests the next chunk's rows while
 * the current one's products run; a chunk's own loads request theirs this many tokens ahead
 * (the threads that share an item prepare chunks apart). */
enum { KDA_PREFETCH_AHEAD = 4 };

/* Requests row `row` (n elements each) of the per-token tensor at base, by 64-byte lines,
 * for reading (rw 0) or writing (rw 1), into every cache level (locality 3) or L2 and beyond
 * (1). A macro, not a function: GCC 12 deems a function that only prefetches free of side
 * effects and drops its calls. */
#define KDA_PREFETCH_ROW(pl, base, row, n, rw, locality)                                           \
    for (int64_t pf_i_ = 0, pf_es_ = (int64_t)kda_token_bytes(pl); pf_i_ < (n)*pf_es_;             \
         pf_i_ += 64)                                                                              \
    __builtin_prefetch((const char *)(base) + (row) * (n)*pf_es_ + pf_i_, rw, locality)

/* The rows of token tok that a chunk reads: q and k (K elements each), v (V elements) and
 * g (gK elements). */
#define KDA_PREFETCH_TOKEN(pl, tok, hv, locality)                                                  \
    do {                                                                                           \
        const linseq_kda_problem *pf_p_ = (pl)->p;                                                 \
        const int64_t pf_h_ = (hv) / (pl)->group;                                                  \
        KDA_PREFETCH_ROW(pl, pf_p_->q, (tok)*pf_p_->H + pf_h_, pf_p_->K, 0, locality);             \
        KDA_PREFETCH_ROW(pl, pf_p_->k, (tok)*pf_p_->H + pf_h_, pf_p_->K, 0, locality);             \
        KDA_PREFETCH_ROW(pl, pf_p_->v, (tok) * (pl)->HV + (hv), pf_p_->V, 0, locality);            \
        if (pf_p_->g)                                                                              \
            KDA_PREFETCH_ROW(pl, pf_p_->g, (tok) * (pl)->HV + (hv), (pl)->gK, 0, locality);        \
    } while (0)

/* Lane sums of 16 vectors into out[16], VW vectors per reduction. */
static inline void reduce16(const vf *acc, float *out)
{
    for (int g = 0; g < 16; g += VW) vf_store(out + g, vf_hsum_lanes(acc + g));
}

/* Row r of a diagonal block against the columns [c_lo, c_hi) (at most 8, all below r):
 * Aqk[r][c] = sum_d q_r k_c w_c and Akk[r][c] = sum_d k_r k_c w_c with the running product
 * w_c = a_{c+1} ... a_r carried down from c_hi - 1. w_carry holds, per channel, the product
 * down to c_hi (1 when c_hi == r) and is left holding it down to c_lo. Walking the channels
 * outside and the (at most 8) columns inside keeps all 16 sums in registers. */
static void diagonal_row_segment(const kda_chunk_ws *w, int64_t r, int64_t c_lo, int64_t c_hi,
                                 int64_t K, int64_t C, float *w_carry)
{
    const int nc = (int)(c_hi - c_lo);
    const float *q = w->qs + r * K, *kr = w->ks + r * K;
    vf acc[16];
    for (int i = 0; i < 16; i++) acc[i] = vf_zero();
    int64_t d = 0;
    /* two channel vectors at a time: the running products are a chain of multiplications
     * down the columns, so two independent chains hide its latency (four spill registers) */
    for (; d + 2 * VW <= K; d += 2 * VW) {
        vf run0 = vf_load(w_carry + d), run1 = vf_load(w_carry + d + VW);
        const vf q0 = vf_load(q + d), q1 = vf_load(q + d + VW);
        const vf k0 = vf_load(kr + d), k1 = vf_load(kr + d + VW);
#pragma GCC unroll 8
        for (int cc = 7; cc >= 0; cc--) {
            if (cc >= nc) continue;
            const int64_t c = c_lo + cc;
            const float *a = w->a + (c + 1) * K + d, *kc = w->ks + c * K + d;
            run0 = vf_mul(run0, vf_load(a));
            run1 = vf_mul(run1, vf_load(a + VW));
            const vf kw0 = vf_mul(vf_load(kc), run0), kw1 = vf_mul(vf_load(kc + VW), run1);
            acc[cc] = vf_fmadd(q1, kw1, vf_fmadd(q0, kw0, acc[cc]));
            acc[8 + cc] = vf_fmadd(k1, kw1, vf_fmadd(k0, kw0, acc[8 + cc]));
        }
        vf_store(w_carry + d, run0);
        vf_store(w_carry + d + VW, run1);
    }
    for (; d < K; d += VW) {
        const int64_t t = K - d < VW ? K - d : VW;
        const bool full = t == VW;
        vf run = full ? vf_load(w_carry + d) : vf_load_n(w_carry + d, t);
        const vf vq = full ? vf_load(q + d) : vf_load_n(q + d, t);
        const vf vk = full ? vf_load(kr + d) : vf_load_n(kr + d, t);
        for (int cc = nc - 1; cc >= 0; cc--) {
            const int64_t c = c_lo + cc;
            const float *a = w->a + (c + 1) * K + d, *kc = w->ks + c * K + d;
            run = vf_mul(run, full ? vf_load(a) : vf_load_n(a, t));
            const vf kw = vf_mul(full ? vf_load(kc) : vf_load_n(kc, t), run);
            acc[cc] = vf_fmadd(vq, kw, acc[cc]);
            acc[8 + cc] = vf_fmadd(vk, kw, acc[8 + cc]);
        }
        if (full)
            vf_store(w_carry + d, run);
        else
            vf_store_n(w_carry + d, run, t);
    }
    float sums[16];
    reduce16(acc, sums);
    for (int cc = 0; cc < nc; cc++) {
        w->Aqk[r * C + c_lo + cc] = sums[cc];
        w->Akk[r * C + c_lo + cc] = sums[8 + cc];
    }
}

/* Diagonal block [n, n+m): Aqk[r][c] and Akk[r][c] for n <= c <= r, element by element (no
 * factorisation keeps every exponent <= 0 inside it), in segments of 8 columns. */
static void diagonal_block_per_channel(const kda_chunk_ws *w, int64_t n, int64_t m, int64_t K,
                                       int64_t C)
{
    for (int64_t r = n; r < n + m; r++) {
        w->Aqk[r * C + r] = ls_vdot(K, w->qs + r * K, w->ks + r * K);
        vfill(K, 1.0f, w->w);
        for (int64_t c_hi = r; c_hi > n; c_hi -= 8) {
            const int64_t c_lo = c_hi - 8 > n ? c_hi - 8 : n;
            diagonal_row_segment(w, r, c_lo, c_hi, K, C, w->w);
        }
    }
}

static void scores_per_channel(const kda_chunk_ws *w, int64_t Lc, int64_t K, int64_t C, bool delta)
{
    const int64_t S = KDA_SUB_CHUNK;
    /* Column side, once per chunk: row c of sub-chunk j scaled by e^{G_e - G_c} (e the last
     * row of j), stored transposed for the products; and each sub-chunk's total decay. */
    for (int64_t nj = 0, j = 0; nj < Lc; nj += S, j++) {
        const int64_t ej = (nj + S < Lc ? nj + S : Lc) - 1;
        vfill(K, 1.0f, w->w);
        for (int64_t c = ej; c >= nj; c--) {
            if (c < ej) vmul3(K, w->w, w->a + (c + 1) * K, w->w);
            vmul3(K, w->ks + c * K, w->w, w->xt + (c - nj) * K);
        }
        ls_transpose(ej - nj + 1, K, w->xt, K, w->yt + nj, C);
        vmul3(K, w->w, w->a + nj * K, w->tot + j * K);
    }
    /* Row blocks i >= 1 against all earlier columns: one matrix product per block. */
    for (int64_t n = S, i = 1; n < Lc; n += S, i++) {
        const int64_t m = Lc - n < S ? Lc - n : S;
        vfill(K, 1.0f, w->fr);
        for (int64_t rr = 0; rr < m; rr++) {
            if (rr > 0) vmul3(K, w->fr, w->a + (n + rr) * K, w->fr);
            vmul3(K, w->qs + (n + rr) * K, w->fr, w->xt + rr * K);
            vmul3(K, w->ks + (n + rr) * K, w->fr, w->xt + (m + rr) * K);
        }
        /* e^{G_n - G_e} for the sub-chunk j just before i is a_n; further back it gathers
         * the totals of the sub-chunks in between. */
        memcpy(w->dscale, w->a + n * K, (size_t)K * sizeof(float));
        for (int64_t j = i - 1; j >= 0; j--) {
            const int64_t nj = j * S;
            for (int64_t d = 0; d < K; d++) {
                const vf f = vf_set1(w->dscale[d]);
                for (int64_t c = nj; c < nj + S; c += VW) /* S is a multiple of VW */
                    vf_store(w->yts + d * C + c, vf_mul(vf_load(w->yt + d * C + c), f));
            }
            if (j > 0) vmul3(K, w->dscale, w->tot + j * K, w->dscale);
        }
        ls_gemm(delta ? 2 * m : m, n, K, w->xt, K, 1, w->yts, C, w->sc, C, false);
        for (int64_t rr = 0; rr < m; rr++) {
            memcpy(w->Aqk + (n + rr) * C, w->sc + rr * C, (size_t)n * sizeof(float));
            if (delta)
                memcpy(w->Akk + (n + rr) * C, w->sc + (m + rr) * C, (size_t)n * sizeof(float));
        }
    }
    for (int64_t n = 0; n < Lc; n += S)
        diagonal_block_per_channel(w, n, Lc - n < S ? Lc - n : S, K, C);
}

/* With one decay per token the mask e^{G_r - G_c} = a_{c+1} ... a_r is a scalar per (r, c):
 * Aqk = (Qs K^T) o M and Akk = (K K^T) o M need no rescaled rows, only the plain products
 * over the lower triangle of 16-row blocks (the blocks above the diagonal are never read).
 * Row r of M is row r - 1 times a_r, one vector multiply per row; the solve's factor
 * Mneg = -beta_r Akk is formed in the same pass. */
static void scores_per_head(const kda_plan *pl, const kda_chunk_ws *w, int64_t Lc, int64_t K,
                            int64_t C, bool delta)
{
    const int64_t S = KDA_SUB_CHUNK, Kw = (K + 1) / 2;
    ls_transpose(Lc, K, w->ks, K, w->yt, C);
    if (pl->bf16_products) {
        ls_pack_bf16_rows(Lc, K, w->qs, K, w->qs_w, Kw);
        ls_pack_bf16_pairs(K, Lc, w->yt, C, w->yt_w, C);
    }
    for (int64_t n = 0; n < Lc; n += S) {
        const int64_t m = Lc - n < S ? Lc - n : S;
        if (pl->bf16_products)
            ls_gemm_bf16(pl->bf16_dot, m, n + m, Kw, w->qs_w + n * Kw, Kw, 1, w->yt_w, C,
                         w->Aqk + n * C, C, false, NULL);
        else
            ls_gemm(m, n + m, K, w->qs + n * K, K, 1, w->yt, C, w->Aqk + n * C, C, false);
        if (delta) ls_gemm(m, n + m, K, w->ks + n * K, K, 1, w->yt, C, w->Akk + n * C, C, false);
    }
    float *mask = w->sc; /* [C]: row r of M left of the diagonal */
    w->Akk[0] = 0.0f;
    for (int64_t r = 1; r < Lc; r++) {
        vmul_scalar(r - 1, mask, w->a[r], mask);
        mask[r - 1] = w->a[r];
        float *aqk = w->Aqk + r * C, *akk = w->Akk + r * C;
        vmul3(r, aqk, mask, aqk);
        if (!delta) continue;
        vmul3(r, akk, mask, akk);
        akk[r] = 0.0f;
        vmul_scalar(r, akk, -w->beta[r], w->Mneg + r * C);
    }
}

/* The state-independent operands of the output's bf16 products, once per chunk: qg by rows,
 * and each 16-row block of Aqk by rows over the columns of the earlier blocks (the diagonal
 * blocks stay float32, so that no product reaches past a row's own token). */
static void pack_output_operands(const kda_chunk_ws *w, int64_t Lc, int64_t K, int64_t C)
{
    const int64_t Kw = (K + 1) / 2, Cw = C / 2, S = KDA_SUB_CHUNK;
    ls_pack_bf16_rows(Lc, K, w->qg, K, w->qg_w, Kw);
    for (int64_t r0 = S; r0 < Lc; r0 += S)
        ls_pack_bf16_rows(Lc - r0 < S ? Lc - r0 : S, r0, w->Aqk + r0 * C, C, w->Aqk_w + r0 * Cw,
                          Cw);
}

void LS_ISA_FN(kda_chunk_prepare)(const kda_plan *pl, const kda_chunk_ws *w, int64_t first,
                                  int64_t Lc, int64_t hv)
{
    const int64_t K = pl->p->K, C = pl->chunk, gK = pl->gK;
    const bool per_channel = pl->p->decay == LINSEQ_DECAY_PER_CHANNEL;

    for (int64_t r = 0; r < Lc; r++) {
        if (r + KDA_PREFETCH_AHEAD < Lc)
            KDA_PREFETCH_TOKEN(pl, first + r + KDA_PREFETCH_AHEAD, hv, 3);
        kda_load_token_v(pl, first + r, hv, w->qs + r * K, w->ks + r * K, &w->beta[r],
                         w->g + r * gK);
        kda_decay_row(pl, gK, w->g + r * gK, KDA_LOG_DECAY_FLOOR, w->a + r * gK);
    }
    /* e^{G_r} and e^{G_last - G_r} as running products from either end */
    memcpy(w->eG, w->a, (size_t)gK * sizeof(float));
    for (int64_t r = 1; r < Lc; r++) vmul3(gK, w->eG + (r - 1) * gK, w->a + r * gK, w->eG + r * gK);
    vfill(gK, 1.0f, w->eL + (Lc - 1) * gK);
    for (int64_t r = Lc - 2; r >= 0; r--)
        vmul3(gK, w->eL + (r + 1) * gK, w->a + (r + 1) * gK, w->eL + r * gK);

    for (int64_t r = 0; r < Lc; r++) {
        const float *q = w->qs + r * K, *k = w->ks + r * K;
        float *qg = w->qg + r * K, *kbg = w->kbg + r * K, *kd = w->kd + r * K;
        if (per_channel) {
            vmul3(K, q, w->eG + r * K, qg);
            vmul3(K, k, w->eG + r * K, kbg);
            ls_vscale(K, w->beta[r], kbg);
            vmul3(K, k, w->eL + r * K, kd);
        } else {
            vmul_scalar(K, q, w->eG[r], qg);
            vmul_scalar(K, k, w->eG[r], kbg);
            ls_vscale(K, w->beta[r], kbg);
            vmul_scalar(K, k, w->eL[r], kd);
        }
    }
    for (int64_t i = 0; i < K; i++) w->decay_last[i] = w->eG[(Lc - 1) * gK + (per_channel ? i : 0)];

    if (!per_channel) {
        scores_per_head(pl, w, Lc, K, C, pl->delta);
    } else {
        scores_per_channel(w, Lc, K, C, pl->delta);
        for (int64_t r = 1; pl->delta && r < Lc; r++)
            vmul_scalar(r, w->Akk + r * C, -w->beta[r], w->Mneg + r * C);
    }
    if (pl->bf16_products) pack_output_operands(w, Lc, K, C);
}

void LS_ISA_FN(kda_chunk_solve)(const kda_plan *pl, const kda_chunk_ws *w, const float *S0,
                                int64_t first, int64_t Lc, int64_t hv, int64_t j0, int64_t j1)
{
    const int64_t K = pl->p->K, V = pl->p->V, HV = pl->HV, C = pl->chunk, S = KDA_SUB_CHUNK;
    const int64_t n = j1 - j0;
    float *vnew = w->vnew + j0;
    if (!pl->delta) { /* gated linear attention writes v itself */
        for (int64_t r = 0; r < Lc; r++) {
            float *vn = vnew + r * V;
            const float *v = kda_token_span(pl, pl->p->v, ((first + r) * HV + hv) * V + j0, n, vn);
            if (v != vn) memcpy(vn, v, (size_t)n * sizeof(float));
        }
        return;
    }
    ls_gemm(Lc, n, K, w->kbg, K, 1, S0 + j0, V, vnew, V, false);
    for (int64_t r = 0; r < Lc; r++) {
        const int64_t v_at = ((first + r) * HV + hv) * V + j0;
        float *vn = vnew + r * V;
        const vf beta = vf_set1(w->beta[r]);
        int64_t j = 0;
        for (; j + VW <= n; j += VW)
            vf_store(vn + j, vf_fmadd(beta, kda_token_vec(pl, pl->p->v, v_at + j, VW),
                                      vf_sub(vf_zero(), vf_load(vn + j))));
        if (j < n)
            vf_store_n(vn + j,
                       vf_fmadd(beta, kda_token_vec(pl, pl->p->v, v_at + j, n - j),
                                vf_sub(vf_zero(), vf_load_n(vn + j, n - j))),
                       n - j);
    }
    /* Forward substitution by 16-row blocks: the rows of earlier blocks enter as one matrix
     * product accumulated into the block, the block itself row by row. */
    for (int64_t r0 = 0; r0 < Lc; r0 += S) {
        const int64_t m = Lc - r0 < S ? Lc - r0 : S;
        if (r0 > 0) ls_gemm(m, n, r0, w->Mneg + r0 * C, C, 1, vnew, V, vnew + r0 * V, V, true);
        kda_substitute_rows(vnew, V, n, r0, r0 + m, w->Mneg, C, 1);
    }
}

/* out += Aqk vnew over the columns [j0, j1): by 16-row blocks, the rows of earlier blocks as
 * one matrix product, the block's own triangle row by row. */
static void output_in_chunk(const kda_chunk_ws *w, int64_t Lc, int64_t C, int64_t V, float *out,
                            int64_t ld, int64_t j0, int64_t j1)
{
    const int64_t SC = KDA_SUB_CHUNK, n = j1 - j0;
    for (int64_t r0 = 0; r0 < Lc; r0 += SC) {
        const int64_t m = Lc - r0 < SC ? Lc - r0 : SC;
        if (r0 > 0)
            ls_gemm(m, n, r0, w->Aqk + r0 * C, C, 1, w->vnew + j0, V, out + r0 * ld, ld, true);
        kda_triangle_rows(out, ld, w->vnew + j0, V, n, r0, r0 + m, w->Aqk, C, 1, false);
    }
}

/* out = qg S0 + Aqk vnew over the columns [j0, j1), the products of qg S0 and of each row
 * block with the earlier blocks on bf16 operands (S0 and vnew packed by pairs of rows here:
 * their columns are this caller's), the blocks' own triangles in float32 as without them. */
static void output_bf16_products(const kda_plan *pl, const kda_chunk_ws *w, const float *S0,
                                 int64_t Lc, float *out, int64_t ld, int64_t j0, int64_t j1)
{
    const int64_t K = pl->p->K, V = pl->p->V, C = pl->chunk, Kw = (K + 1) / 2, Cw = C / 2;
    const int64_t SC = KDA_SUB_CHUNK, n = j1 - j0;
    ls_pack_bf16_pairs(K, n, S0 + j0, V, w->S0_w + j0, V);
    ls_gemm_bf16(pl->bf16_dot, Lc, n, Kw, w->qg_w, Kw, 1, w->S0_w + j0, V, out, ld, false, NULL);
    const int64_t last_block = (Lc - 1) / SC * SC; /* the rows the earlier blocks hold */
    ls_pack_bf16_pairs(last_block, n, w->vnew + j0, V, w->vnew_w + j0, V);
    for (int64_t r0 = 0; r0 < Lc; r0 += SC) {
        const int64_t m = Lc - r0 < SC ? Lc - r0 : SC;
        if (r0 > 0) /* r0 is even: whole words */
            ls_gemm_bf16(pl->bf16_dot, m, n, r0 / 2, w->Aqk_w + r0 * Cw, Cw, 1, w->vnew_w + j0, V,
                         out + r0 * ld, ld, true, NULL);
        kda_triangle_rows(out, ld, w->vnew + j0, V, n, r0, r0 + m, w->Aqk, C, 1, false);
    }
}

void LS_ISA_FN(kda_chunk_output)(const kda_plan *pl, const kda_chunk_ws *w, const float *S0,
                                 int64_t first, int64_t Lc, int64_t hv, float *o, int64_t j0,
                                 int64_t j1)
{
    const int64_t K = pl->p->K, V = pl->p->V, HV = pl->HV, C = pl->chunk;
    const int64_t n = j1 - j0;
    /* the decayed chunk-start state read by q, then the in-chunk part by row blocks; bf16
     * outputs are summed in the float tile (the same products: no result depends on where
     * it is stored) and rounded once */
    const int64_t at = (first * HV + hv) * V + j0;
    float *out = pl->bf16 ? w->tile + j0 : o + at;
    const int64_t ld = pl->bf16 ? V : HV * V;
    if (pl->bf16_products) {
        output_bf16_products(pl, w, S0, Lc, out, ld, j0, j1);
    } else {
        ls_gemm(Lc, n, K, w->qg, K, 1, S0 + j0, V, out, ld, false);
        output_in_chunk(w, Lc, C, V, out, ld, j0, j1);
    }
    if (pl->bf16)
        for (int64_t r = 0; r < Lc; r++) kda_token_store_bf16(o, at + r * HV * V, n, out + r * V);
}

void LS_ISA_FN(kda_chunk_advance)(const kda_plan *pl, const kda_chunk_ws *w, float *S, int64_t Lc,
                                  int64_t j0, int64_t j1)
{
    const int64_t K = pl->p->K, V = pl->p->V;
    ls_gemm_scaled(K, j1 - j0, Lc, w->kd, 1, K, w->vnew + j0, V, S + j0, V, true, w->decay_last);
}

void LS_ISA_FN(kda_chunk_item)(const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv, float *S,
                               float *o, void *ws, float *save)
{
    const int64_t V = pl->p->V, C = pl->chunk, KV = pl->p->K * V;
    kda_chunk_ws w = {0};
    kda_chunk_ws_layout(pl, ws, &w);
    float *save_deltas = save ? save + (len + C - 1) / C * KV : NULL;

    for (int64_t c0 = 0; c0 < len; c0 += C) {
        const int64_t Lc = len - c0 < C ? len - c0 : C;
        const int64_t first = tok0 + c0;
        if (save) {
            memcpy(save + c0 / C * KV, S, (size_t)KV * sizeof(float));
            w.vnew = save_deltas + c0 * V; /* the deltas land in the saved block directly */
        }
        LS_ISA_FN(kda_chunk_prepare)(pl, &w, first, Lc, hv);
        /* the next chunk's rows into L2 while this one's products run */
        for (int64_t t = first + Lc; t < tok0 + len && t < first + Lc + C; t++) {
            KDA_PREFETCH_TOKEN(pl, t, hv, 1);
            if (o) KDA_PREFETCH_ROW(pl, o, t * pl->HV + hv, V, 1, 1);
        }
        LS_ISA_FN(kda_chunk_solve)(pl, &w, S, first, Lc, hv, 0, V);
        if (o) LS_ISA_FN(kda_chunk_output)(pl, &w, S, first, Lc, hv, o, 0, V);
        LS_ISA_FN(kda_chunk_advance)(pl, &w, S, Lc, 0, V);
    }
}
