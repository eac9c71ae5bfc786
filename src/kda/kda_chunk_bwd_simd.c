/* KDA chunked backward: the reverse of kda_chunk_simd.c, one chunk at a time from the last;
 * compiled once per ISA.
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
 * factorisation into products of decays as the forward, so no exponent is evaluated here
 * either: for A[r,c] = sum_d X_r[d] Y_c[d] e^{G_r[d]-G_c[d]},
 *     dX_r = sum_c dA[r,c] Y_c e^{G_r-G_c},  dY_c = sum_r dA[r,c] X_r e^{G_r-G_c},
 *     dG_r += X_r dX_r,  dG_c -= Y_c dY_c.
 * A factor whose exponent is identically 0 (Aqk's diagonal, Kd's last row) gets no dG share:
 * its +x to dG_r and -x to dG_r would cancel to float32 rounding of O(1) terms, while the
 * true dg can be e^g small (every token decaying by e^-30 leaves dg ~ 1e-14): so dG only
 * collects terms that carry at least one decay factor, and dg keeps float32 accuracy relative
 * to its own scale, as the recurrent backward does.
 * Finally dg_t = sum_{r >= t} dG_r inside the chunk (the earlier chunks see g_t only through
 * the state, whose gradient dS0 carries on), and tokens whose g was raised to the floor get 0:
 * every factor they enter is an exact float32 zero.
 * Without the delta rule (gated linear attention) Vn = V: dV = dVn, and the solve, its Akk
 * and the Kbg S0 term have no gradient to pass.
 *
 * With bf16 products (pl->bf16_grad_products) the products that only the per-token gradients
 * read take bf16 operands (simd/gemm_bf16.h), each operand rounded once: dQg = dO S0^T,
 * dKd = Vn dS^T, dKbg = -dR S0^T, dAqk = dO Vn^T, dM = -dR Vn^T, and the score matrices'
 * products between 16-row blocks (with one decay per head, all of them). Everything dS0
 * depends on stays float32: Kd dS, Aqk^T dO, the back substitution, Qg^T dO and Kbg^T dR,
 * with the chunk's recomputed forward (its Aqk too). So dh0, and dv = beta dR, are bit for
 * bit the float32 products' gradients; dq, dk, dbeta and dg carry the bf16 rounding. */
#include <string.h>

#include "kda/kda_backward.h"
#include "kda/kda_chunk.h"
#include "kda/kda_simd.h"
#include "simd/gemm_bf16.h"

typedef struct {
    float *ckpt;              /* [n_chunks,K,V] the state at each chunk start */
    float *vnew_all;          /* [n_chunks*C,V] each chunk's deltas (per token, not a state) */
    float *S, *dS, *dS0;      /* [K,V] */
    float *ST, *dST;          /* [V,K] S0 and dS transposed */
    float *VnT;               /* [V,C] Vn transposed */
    float *dVn, *dR;          /* [C,V]; dR holds -dL/dR */
    float *dqg, *dkd, *dkbg;  /* [C,K] */
    float *dqs, *dks;         /* [C,K] */
    float *dX, *dY;           /* [C,K] score backward results */
    float *cf, *fc, *xt, *yt; /* [C,K] column factors, their block scaling, scaled rows */
    float *prod;              /* [C,K] */
    float *dAqk, *dAkk, *dAe; /* [C,C] */
    float *fr, *dsc;          /* [K] */
    float *dbeta;             /* [C] */
    float *dg;                /* [C,gK] the emitted dg */
    float *dG;                /* [C,gK] dL/dG of each row */
    float *dGL;               /* [gK] */
    /* bf16 products only (pl->bf16_grad_products): operands packed as simd/gemm_bf16.h
     * describes, Vw = ceil(V/2), Cw = C/2 words */
    uint32_t *dO_w;         /* [C,Vw] rows of dO */
    uint32_t *dR_w;         /* [C,Vw] rows of -dR */
    uint32_t *ST_w, *dST_w; /* [Vw,K] pairs of rows of S0^T, dS^T */
    uint32_t *VnT_w;        /* [Vw,C] pairs of rows of Vn^T (read as rows of Vn, too) */
    uint32_t *dA_w;         /* [C,Cw] a score gradient's block, by rows or by pairs */
    uint32_t *x_w, *y_w;    /* [Cw,K] pairs of rows of a score's scaled operands */
    unsigned char *chunk;   /* the forward's chunk workspace */
} bwd_ws;

static size_t carve(const kda_bwd *b, unsigned char *base, bwd_ws *w)
{
    const kda_plan *pl = b->pl;
    const size_t C = (size_t)pl->chunk, K = (size_t)pl->p->K, V = (size_t)pl->p->V;
    const size_t gK = (size_t)pl->gK, KV = K * V;
    const size_t n_chunks = ((size_t)b->max_len + C - 1) / C;
    size_t off = 0;
#define TAKE_T(field, type, count)                                                                 \
    do {                                                                                           \
        if (base) w->field = (type *)(void *)(base + off);                                         \
        off += kda_align64((count) * sizeof(type));                                                \
    } while (0)
#define TAKE(field, count) TAKE_T(field, float, count)
    if (!b->saved) { /* with a saved forward these come from it */
        TAKE(ckpt, (n_chunks ? n_chunks : 1) * KV);
        TAKE(vnew_all, (n_chunks ? n_chunks : 1) * C * V);
    }
    TAKE(S, KV);
    TAKE(dS, KV);
    TAKE(dS0, KV);
    TAKE(ST, KV);
    TAKE(dST, KV);
    TAKE(VnT, V * C);
    TAKE(dVn, C * V);
    TAKE(dR, C * V);
    TAKE(dqg, C * K);
    TAKE(dkd, C * K);
    TAKE(dkbg, C * K);
    TAKE(dqs, C * K);
    TAKE(dks, C * K);
    TAKE(dX, C * K);
    TAKE(dY, C * K);
    TAKE(cf, C * K);
    TAKE(fc, C * K);
    TAKE(xt, C * K);
    TAKE(yt, C * K);
    TAKE(prod, C * K);
    TAKE(dAqk, C * C);
    TAKE(dAkk, C * C);
    TAKE(dAe, C * C);
    TAKE(fr, K);
    TAKE(dsc, K);
    TAKE(dbeta, C);
    TAKE(dg, C * gK);
    TAKE(dG, C * gK);
    TAKE(dGL, gK);
    const size_t Vw = (V + 1) / 2, Cw = (C + 1) / 2, words = pl->bf16_grad_products ? 1 : 0;
    TAKE_T(dO_w, uint32_t, words * C * Vw);
    TAKE_T(dR_w, uint32_t, words * C * Vw);
    TAKE_T(ST_w, uint32_t, words * Vw * K);
    TAKE_T(dST_w, uint32_t, words * Vw * K);
    TAKE_T(VnT_w, uint32_t, words * Vw * C);
    TAKE_T(dA_w, uint32_t, words * C * Cw);
    TAKE_T(x_w, uint32_t, words * Cw * K);
    TAKE_T(y_w, uint32_t, words * Cw * K);
#undef TAKE
#undef TAKE_T
    if (base) w->chunk = base + off;
    return off + kda_chunk_ws_layout(pl, NULL, NULL);
}

size_t LS_ISA_FN(kda_chunk_bwd_ws_bytes)(const kda_bwd *b) { return carve(b, NULL, NULL); }

/* y = a x over n floats */
static inline void vscale_to(int64_t n, float a, const float *x, float *y)
{
    const vf av = vf_set1(a);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vf_store(y + i, vf_mul(av, vf_load(x + i)));
    if (i < n) vf_store_n(y + i, vf_mul(av, vf_load_n(x + i, n - i)), n - i);
}

/* y = x * s, y += x * s over n floats */
static inline void vmul3(int64_t n, const float *x, const float *s, float *y)
{
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vf_store(y + i, vf_mul(vf_load(x + i), vf_load(s + i)));
    if (i < n) vf_store_n(y + i, vf_mul(vf_load_n(x + i, n - i), vf_load_n(s + i, n - i)), n - i);
}
static inline void vfma3(int64_t n, const float *x, const float *s, float *y)
{
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        vf_store(y + i, vf_fmadd(vf_load(x + i), vf_load(s + i), vf_load(y + i)));
    if (i < n)
        vf_store_n(
            y + i,
            vf_fmadd(vf_load_n(x + i, n - i), vf_load_n(s + i, n - i), vf_load_n(y + i, n - i)),
            n - i);
}

/* dG_row += sign * a (*) b: element-wise per channel, summed over K per head. */
static void add_dG(float *dG_row, int64_t gK, int64_t K, const float *a, const float *b, float sign)
{
    if (gK != K) {
        dG_row[0] += sign * ls_vdot(K, a, b);
        return;
    }
    const vf s = vf_set1(sign);
    int64_t d = 0;
    for (; d + VW <= K; d += VW)
        vf_store(dG_row + d,
                 vf_fmadd(vf_mul(s, vf_load(a + d)), vf_load(b + d), vf_load(dG_row + d)));
    if (d < K)
        vf_store_n(dG_row + d,
                   vf_fmadd(vf_mul(s, vf_load_n(a + d, K - d)), vf_load_n(b + d, K - d),
                            vf_load_n(dG_row + d, K - d)),
                   K - d);
}

/* out [M,K] = dA [M,N] (row stride lda) Y [N,K]: a score gradient's rows against scaled
 * columns, on bf16 operands with pl->bf16_grad_products. */
static void score_rows_product(const kda_plan *pl, const bwd_ws *w, int64_t M, int64_t N, int64_t K,
                               const float *dA, int64_t lda, const float *Y, float *out)
{
    if (!pl->bf16_grad_products) {
        ls_gemm(M, K, N, dA, lda, 1, Y, K, out, K, false);
        return;
    }
    const int64_t Nw = (N + 1) / 2;
    ls_pack_bf16_rows(M, N, dA, lda, w->dA_w, Nw);
    ls_pack_bf16_pairs(N, K, Y, K, w->y_w, K);
    ls_gemm_bf16(pl->bf16_dot, M, K, Nw, w->dA_w, Nw, 1, w->y_w, K, out, K, false, NULL);
}

/* out [N,K] = dA^T X, dA [M,N] (row stride lda), X [M,K]: the same gradient's columns. */
static void score_cols_product(const kda_plan *pl, const bwd_ws *w, int64_t M, int64_t N, int64_t K,
                               const float *dA, int64_t lda, const float *X, float *out)
{
    if (!pl->bf16_grad_products) {
        ls_gemm(N, K, M, dA, 1, lda, X, K, out, K, false);
        return;
    }
    const int64_t Mw = (M + 1) / 2;
    ls_pack_bf16_pairs(M, N, dA, lda, w->dA_w, N); /* read back as rows of dA^T */
    ls_pack_bf16_pairs(M, K, X, K, w->x_w, K);
    ls_gemm_bf16(pl->bf16_dot, N, K, Mw, w->dA_w, 1, N, w->x_w, K, out, K, false, NULL);
}

/* For the strictly lower A[r,c] = sum_d X_r[d] Y_c[d] e^{G_r[d]-G_c[d]} (c < r): dX = dA-weighted
 * Y, dY = dA-weighted X, overwritten, through the forward's factorisation. (A diagonal has no
 * decay and no dG share: the caller adds it.) */
static void scores_backward_per_channel(const kda_plan *pl, const bwd_ws *w, const kda_chunk_ws *cw,
                                        int64_t Lc, int64_t K, int64_t C, const float *dA,
                                        const float *X, const float *Y)
{
    const int64_t S = KDA_SUB_CHUNK;
    memset(w->dX, 0, (size_t)(Lc * K) * sizeof(float));
    memset(w->dY, 0, (size_t)(Lc * K) * sizeof(float));
    for (int64_t n = 0; n < Lc; n += S) {
        const int64_t m = Lc - n < S ? Lc - n : S;
        /* diagonal block: for row r, walk the channels outside and the columns inside, so the
         * running product and dX_r stay in registers (two channel vectors at a time hide the
         * multiply latency of the product chain); dY_c collects in memory. */
        for (int64_t r = n; r < n + m; r++) {
            const float *xr = X + r * K;
            float *dxr = w->dX + r * K;
            int64_t d = 0;
            for (; d + 2 * VW <= K; d += 2 * VW) {
                vf run0 = vf_set1(1.0f), run1 = vf_set1(1.0f), acc0 = vf_zero(), acc1 = vf_zero();
                const vf x0 = vf_load(xr + d), x1 = vf_load(xr + d + VW);
                for (int64_t c = r - 1; c >= n; c--) {
                    const float *a = cw->a + (c + 1) * K + d, *y = Y + c * K + d;
                    float *dy = w->dY + c * K + d;
                    const vf coef = vf_set1(dA[r * C + c]);
                    run0 = vf_mul(run0, vf_load(a));
                    run1 = vf_mul(run1, vf_load(a + VW));
                    const vf e0 = vf_mul(coef, run0), e1 = vf_mul(coef, run1);
                    acc0 = vf_fmadd(e0, vf_load(y), acc0);
                    acc1 = vf_fmadd(e1, vf_load(y + VW), acc1);
                    vf_store(dy, vf_fmadd(e0, x0, vf_load(dy)));
                    vf_store(dy + VW, vf_fmadd(e1, x1, vf_load(dy + VW)));
                }
                vf_store(dxr + d, vf_add(vf_load(dxr + d), acc0));
                vf_store(dxr + d + VW, vf_add(vf_load(dxr + d + VW), acc1));
            }
            for (; d < K; d += VW) {
                const int64_t t = K - d < VW ? K - d : VW;
                vf run = vf_set1(1.0f), acc = vf_zero();
                const vf x = vf_load_n(xr + d, t);
                for (int64_t c = r - 1; c >= n; c--) {
                    float *dy = w->dY + c * K + d;
                    const vf e = vf_mul(vf_set1(dA[r * C + c]),
                                        run = vf_mul(run, vf_load_n(cw->a + (c + 1) * K + d, t)));
                    acc = vf_fmadd(e, vf_load_n(Y + c * K + d, t), acc);
                    vf_store_n(dy, vf_fmadd(e, x, vf_load_n(dy, t)), t);
                }
                vf_store_n(dxr + d, vf_add(vf_load_n(dxr + d, t), acc), t);
            }
        }
        if (n == 0) continue;
        /* rows of this block against every earlier column, as two matrix products */
        for (int64_t d = 0; d < K; d++) w->fr[d] = 1.0f;
        for (int64_t rr = 0; rr < m; rr++) {
            if (rr > 0) vmul3(K, w->fr, cw->a + (n + rr) * K, w->fr);
            memcpy(w->prod + rr * K, w->fr, (size_t)K * sizeof(float)); /* rf_r, kept below */
            vmul3(K, X + (n + rr) * K, w->fr, w->xt + rr * K);
        }
        memcpy(w->dsc, cw->a + n * K, (size_t)K * sizeof(float));
        for (int64_t j = n / S - 1; j >= 0; j--) {
            for (int64_t c = j * S; c < (j + 1) * S; c++) {
                vmul3(K, w->cf + c * K, w->dsc, w->fc + c * K);
                vmul3(K, Y + c * K, w->fc + c * K, w->yt + c * K);
            }
            if (j > 0) vmul3(K, w->dsc, cw->tot + j * K, w->dsc);
        }
        /* dX_r += rf_r * (dA[rows, :n] Y') ; the rf_r rows sit in prod[0..m) */
        float *rf = w->prod, *t = w->prod + m * K;
        score_rows_product(pl, w, m, n, K, dA + n * C, C, w->yt, t);
        for (int64_t rr = 0; rr < m; rr++) vfma3(K, rf + rr * K, t + rr * K, w->dX + (n + rr) * K);
        /* dY_c += fc_c * (dA[rows, :n]^T X') */
        score_cols_product(pl, w, m, n, K, dA + n * C, C, w->xt, t);
        for (int64_t c = 0; c < n; c++) vfma3(K, w->fc + c * K, t + c * K, w->dY + c * K);
    }
}

/* The same with one decay per row: e^{G_r - G_c} is a scalar weight of dA. */
static void scores_backward_per_head(const kda_plan *pl, const bwd_ws *w, const kda_chunk_ws *cw,
                                     int64_t Lc, int64_t K, int64_t C, const float *dA,
                                     const float *X, const float *Y)
{
    for (int64_t r = 0; r < Lc; r++) {
        float e = 1.0f;
        for (int64_t c = Lc - 1; c > r; c--) w->dAe[r * C + c] = 0.0f;
        for (int64_t c = r; c >= 0; c--) {
            w->dAe[r * C + c] = c < r ? dA[r * C + c] * e : 0.0f;
            e *= cw->a[c];
        }
    }
    score_rows_product(pl, w, Lc, Lc, K, w->dAe, C, Y, w->dX);
    score_cols_product(pl, w, Lc, Lc, K, w->dAe, C, X, w->dY);
}

static void scores_backward(const kda_plan *pl, const bwd_ws *w, const kda_chunk_ws *cw, int64_t Lc,
                            const float *dA, const float *X, const float *Y)
{
    const int64_t K = pl->p->K, C = pl->chunk;
    if (pl->p->decay == LINSEQ_DECAY_PER_CHANNEL)
        scores_backward_per_channel(pl, w, cw, Lc, K, C, dA, X, Y);
    else
        scores_backward_per_head(pl, w, cw, Lc, K, C, dA, X, Y);
}

/* dg_t = sum_{r >= t} dG_r from the last row up, 0 where g was floored. The running sum
 * cancels, so it is kept in double: eight channels at a time in a generic double vector
 * (one register where the ISA has 512-bit vectors). */
typedef float f8 __attribute__((vector_size(32)));
typedef double d8 __attribute__((vector_size(64)));
typedef int32_t i8 __attribute__((vector_size(32)));

static void running_sum_dg(const bwd_ws *w, const kda_chunk_ws *cw, int64_t Lc, int64_t gK)
{
    int64_t i = 0;
    for (; i + 8 <= gK; i += 8) {
        d8 sum = {0};
        for (int64_t r = Lc - 1; r >= 0; r--) {
            f8 dG, g;
            memcpy(&dG, w->dG + r * gK + i, sizeof dG);
            memcpy(&g, cw->g + r * gK + i, sizeof g);
            sum += __builtin_convertvector(dG, d8);
            f8 out = __builtin_convertvector(sum, f8);
            const f8 floor = {KDA_LOG_DECAY_FLOOR, KDA_LOG_DECAY_FLOOR, KDA_LOG_DECAY_FLOOR,
                              KDA_LOG_DECAY_FLOOR, KDA_LOG_DECAY_FLOOR, KDA_LOG_DECAY_FLOOR,
                              KDA_LOG_DECAY_FLOOR, KDA_LOG_DECAY_FLOOR};
            const i8 keep = ~(g < floor); /* lanes of all ones where g is not floored */
            out = (f8)((i8)out & keep);
            memcpy(w->dg + r * gK + i, &out, sizeof out);
        }
    }
    for (; i < gK; i++) {
        double sum = 0.0;
        for (int64_t r = Lc - 1; r >= 0; r--) {
            sum += (double)w->dG[r * gK + i];
            w->dg[r * gK + i] = cw->g[r * gK + i] < KDA_LOG_DECAY_FLOOR ? 0.0f : (float)sum;
        }
    }
}

/* The backward of one chunk: dS holds dL/dS_C on entry, dL/dS0 on return. */
static void chunk_backward(const kda_bwd *b, bwd_ws *w, const kda_chunk_ws *cw, int64_t first,
                           int64_t Lc, int64_t hv, const float *S0, double *item_partials)
{
    const kda_plan *pl = b->pl;
    const linseq_kda_problem *p = pl->p;
    const int64_t K = p->K, V = p->V, HV = pl->HV, C = pl->chunk, gK = pl->gK, SC = KDA_SUB_CHUNK;
    const int64_t ldo = HV * V, Vw = (V + 1) / 2;
    const bool bf16 = pl->bf16_grad_products, dot = pl->bf16_dot;
    const float *dO = b->d_o + (first * HV + hv) * V;
    const float *Vn = cw->vnew;
    const bool has_decay = p->decay != LINSEQ_DECAY_NONE;
    const bool per_channel = p->decay == LINSEQ_DECAY_PER_CHANNEL;

    memset(w->dG, 0, (size_t)(Lc * gK) * sizeof(float));
    memset(w->dGL, 0, (size_t)gK * sizeof(float));
    memset(w->dbeta, 0, (size_t)Lc * sizeof(float));
    ls_transpose(K, V, S0, V, w->ST, K);
    ls_transpose(K, V, w->dS, V, w->dST, K);
    ls_transpose(Lc, V, Vn, V, w->VnT, C);
    if (bf16) {
        ls_pack_bf16_pairs(V, K, w->ST, K, w->ST_w, K);
        ls_pack_bf16_pairs(V, K, w->dST, K, w->dST_w, K);
        ls_pack_bf16_pairs(V, Lc, w->VnT, C, w->VnT_w, C);
        ls_pack_bf16_rows(Lc, V, dO, ldo, w->dO_w, Vw);
    }

    /* S_C = diag(e^{G_L}) S0 + Kd^T Vn (VnT_w read with strides is Vn by rows) */
    ls_gemm(Lc, V, K, cw->kd, K, 1, w->dS, V, w->dVn, V, false);
    if (bf16)
        ls_gemm_bf16(dot, Lc, K, Vw, w->VnT_w, 1, C, w->dST_w, K, w->dkd, K, false, NULL);
    else
        ls_gemm(Lc, K, V, Vn, V, 1, w->dST, K, w->dkd, K, false);
    for (int64_t i = 0; i < K; i++) {
        const float *ds = w->dS + i * V;
        float *d0 = w->dS0 + i * V;
        const float e = cw->decay_last[i];
        vscale_to(V, e, ds, d0);
        w->dGL[per_channel ? i : 0] += e * ls_vdot(V, S0 + i * V, ds);
    }

    /* O = Qg S0 + Aqk Vn */
    if (bf16) {
        ls_gemm_bf16(dot, Lc, K, Vw, w->dO_w, Vw, 1, w->ST_w, K, w->dqg, K, false, NULL);
        ls_gemm_bf16(dot, Lc, Lc, Vw, w->dO_w, Vw, 1, w->VnT_w, C, w->dAqk, C, false, NULL);
    } else {
        ls_gemm(Lc, K, V, dO, ldo, 1, w->ST, K, w->dqg, K, false);
        ls_gemm(Lc, Lc, V, dO, ldo, 1, w->VnT, C, w->dAqk, C, false);
    }
    ls_gemm(K, V, Lc, cw->qg, 1, K, dO, ldo, w->dS0, V, true);
    /* dVn_c += sum_{r >= c} Aqk[r,c] dO_r: the triangle of each block, then the later rows */
    for (int64_t n = 0; n < Lc; n += SC) {
        const int64_t m = Lc - n < SC ? Lc - n : SC, after = n + m;
        kda_triangle_rows(w->dVn, V, dO, ldo, V, n, after, cw->Aqk, 1, C, true);
        if (after < Lc)
            ls_gemm(m, V, Lc - after, cw->Aqk + after * C + n, 1, C, dO + after * ldo, ldo,
                    w->dVn + n * V, V, true);
    }

    if (!pl->delta) {
        for (int64_t r = 0; r < Lc; r++) vscale_to(V, -1.0f, w->dVn + r * V, w->dR + r * V);
        memset(w->dkbg, 0, (size_t)(Lc * K) * sizeof(float));
    }
    /* M Vn = R: -dR = -M^{-T} dVn by back substitution in 16-row blocks, into w->dR. The
     * forward's Mneg = -M below the diagonal: -dR_r = -dVn_r + sum_{c>r} Mneg[c,r] (-dR_c). */
    for (int64_t n = (Lc - 1) / SC * SC; pl->delta && n >= 0; n -= SC) {
        const int64_t m = Lc - n < SC ? Lc - n : SC, after = n + m;
        for (int64_t r = n; r < after; r++) vscale_to(V, -1.0f, w->dVn + r * V, w->dR + r * V);
        if (after < Lc)
            ls_gemm(m, V, Lc - after, cw->Mneg + after * C + n, 1, C, w->dR + after * V, V,
                    w->dR + n * V, V, true);
        kda_substitute_rows(w->dR, V, V, after - 1, n - 1, cw->Mneg, 1, C);
    }
    /* dM = -dR Vn^T = (w->dR) Vn^T, strictly lower; M[r,c] = beta_r Akk[r,c] */
    if (pl->delta && bf16) {
        ls_pack_bf16_rows(Lc, V, w->dR, V, w->dR_w, Vw);
        ls_gemm_bf16(dot, Lc, Lc, Vw, w->dR_w, Vw, 1, w->VnT_w, C, w->dAe, C, false, NULL);
    } else if (pl->delta) {
        ls_gemm(Lc, Lc, V, w->dR, V, 1, w->VnT, C, w->dAe, C, false);
    }
    for (int64_t r = 0; pl->delta && r < Lc; r++) {
        const float *dM = w->dAe + r * C;
        float *dAkk = w->dAkk + r * C;
        w->dbeta[r] += ls_vdot(r, dM, cw->Akk + r * C);
        vscale_to(r, cw->beta[r], dM, dAkk);
        memset(dAkk + r, 0, (size_t)(Lc - r) * sizeof(float)); /* Akk is strictly lower */
    }

    /* R = diag(beta) V - Kbg S0, with -dR in w->dR */
    for (int64_t r = 0; pl->delta && r < Lc; r++) {
        const float *v = p->v + ((first + r) * HV + hv) * V;
        w->dbeta[r] -= ls_vdot(V, v, w->dR + r * V);
    }
    if (pl->delta) {
        if (bf16)
            ls_gemm_bf16(dot, Lc, K, Vw, w->dR_w, Vw, 1, w->ST_w, K, w->dkbg, K, false, NULL);
        else
            ls_gemm(Lc, K, V, w->dR, V, 1, w->ST, K, w->dkbg, K, false);
        ls_gemm(K, V, Lc, cw->kbg, 1, K, w->dR, V, w->dS0, V, true);
    }

    for (int64_t r = 0; r < Lc; r++) {
        const float *k = cw->ks + r * K, *eG = cw->eG + r * gK, *eL = cw->eL + r * gK;
        float *dks = w->dks + r * K, *dqs = w->dqs + r * K;
        float *dG = w->dG + r * gK;
        const float *dkbg = w->dkbg + r * K, *dqg = w->dqg + r * K, *dkd = w->dkd + r * K;
        const float beta = cw->beta[r];
        /* Kbg = beta K e^G, Kd = K e^{G_L - G}, Qg = Qs e^G */
        vf db = vf_zero();
        const vf vbeta = vf_set1(beta);
        for (int64_t d = 0; d < K; d += VW) {
            const int64_t t = K - d < VW ? K - d : VW;
            const vf e = per_channel ? vf_load_n(eG + d, t) : vf_set1(eG[0]);
            const vf el = per_channel ? vf_load_n(eL + d, t) : vf_set1(eL[0]);
            const vf vkbg = vf_load_n(dkbg + d, t);
            db = vf_fmadd(vkbg, vf_mul(vf_load_n(k + d, t), e), db);
            vf_store_n(dks + d, vf_fmadd(el, vf_load_n(dkd + d, t), vf_mul(vf_mul(vbeta, e), vkbg)),
                       t);
            vf_store_n(dqs + d, vf_mul(e, vf_load_n(dqg + d, t)), t);
        }
        w->dbeta[r] += vf_hsum(db);
        if (has_decay) {
            add_dG(dG, gK, K, dkbg, cw->kbg + r * K, 1.0f);
            add_dG(dG, gK, K, dqg, cw->qg + r * K, 1.0f);
            /* Kd's exponent G_L - G_r: -dG_r and +dG_L, except for the last row, whose
             * exponent is identically 0 (its two terms would cancel, see the header) */
            if (r < Lc - 1) {
                add_dG(dG, gK, K, dkd, cw->kd + r * K, -1.0f);
                add_dG(w->dGL, gK, K, dkd, cw->kd + r * K, 1.0f);
            }
        }
    }

    /* The score matrices: Aqk (qs against k, diagonal included), Akk (k against k). The
     * column factors e^{G_e - G_c} within each sub-chunk, shared by both. */
    if (per_channel)
        for (int64_t nj = 0; nj < Lc; nj += SC) {
            const int64_t ej = (nj + SC < Lc ? nj + SC : Lc) - 1;
            for (int64_t d = 0; d < K; d++) w->cf[ej * K + d] = 1.0f;
            for (int64_t c = ej - 1; c >= nj; c--)
                vmul3(K, w->cf + (c + 1) * K, cw->a + (c + 1) * K, w->cf + c * K);
        }
    /* Aqk's diagonal has the factor e^0 = 1 and no dG share: it goes to dqs and dks only,
     * and the strictly lower part through the scores' backward with its dG terms. */
    scores_backward(pl, w, cw, Lc, w->dAqk, cw->qs, cw->ks);
    for (int64_t r = 0; r < Lc; r++) {
        const float diag = w->dAqk[r * C + r];
        ls_vaxpy(K, diag, cw->ks + r * K, w->dqs + r * K);
        ls_vaxpy(K, diag, cw->qs + r * K, w->dks + r * K);
        ls_vaxpy(K, 1.0f, w->dX + r * K, w->dqs + r * K);
        ls_vaxpy(K, 1.0f, w->dY + r * K, w->dks + r * K);
        if (has_decay) {
            add_dG(w->dG + r * gK, gK, K, cw->qs + r * K, w->dX + r * K, 1.0f);
            add_dG(w->dG + r * gK, gK, K, cw->ks + r * K, w->dY + r * K, -1.0f);
        }
    }
    if (pl->delta) scores_backward(pl, w, cw, Lc, w->dAkk, cw->ks, cw->ks);
    for (int64_t r = 0; pl->delta && r < Lc; r++) {
        ls_vaxpy(K, 1.0f, w->dX + r * K, w->dks + r * K);
        ls_vaxpy(K, 1.0f, w->dY + r * K, w->dks + r * K);
        if (has_decay) {
            add_dG(w->dG + r * gK, gK, K, cw->ks + r * K, w->dX + r * K, 1.0f);
            add_dG(w->dG + r * gK, gK, K, cw->ks + r * K, w->dY + r * K, -1.0f);
        }
    }
    for (int64_t i = 0; i < gK; i++) w->dG[(Lc - 1) * gK + i] += w->dGL[i];

    /* dg_t = sum_{r >= t} dG_r, a running sum from the last row. A floored decay enters only
     * exact zeros, so its own gradient is 0. */
    running_sum_dg(w, cw, Lc, gK);
    for (int64_t r = 0; r < Lc; r++) {
        /* the token's dv = beta_r dR_r (w->dR holds -dR); dVn row r is free to hold it */
        float *dv = w->dVn + r * V;
        const float beta = cw->beta[r], *ndr = w->dR + r * V;
        vscale_to(V, -beta, ndr, dv);
        kda_bwd_emit(b, first + r, hv, w->dqs + r * K, w->dks + r * K, dv, w->dbeta[r],
                     has_decay ? w->dg + r * gK : NULL, item_partials);
    }

    /* dS0 becomes the dS of the previous chunk */
    float *spare = w->dS;
    w->dS = w->dS0;
    w->dS0 = spare;
}

void LS_ISA_FN(kda_chunk_bwd_item)(const kda_bwd *b, int64_t n, int64_t hv, int64_t tok0,
                                   int64_t len, void *ws, double *item_partials)
{
    const kda_plan *pl = b->pl;
    const linseq_kda_problem *p = pl->p;
    const int64_t KV = p->K * p->V, C = pl->chunk;
    bwd_ws w = {0};
    carve(b, ws, &w);
    kda_chunk_ws cw = {0};
    kda_chunk_ws_layout(pl, w.chunk, &cw);

    const int64_t n_chunks = (len + C - 1) / C;
    const float *saved = kda_bwd_saved_block(b, n, hv);
    const float *ckpt = saved ? saved : w.ckpt;
    const float *vnew_all = saved ? saved + n_chunks * KV : w.vnew_all;
    /* The forward pass keeps each chunk's start state and deltas (unless the training forward
     * saved them); the walk back then only rebuilds the chunk-local matrices. */
    const float *vnew_forward = cw.vnew;
    if (!saved) kda_state_load(pl, p->h0 ? p->h0 + (n * pl->HV + hv) * KV : NULL, w.S);
    for (int64_t c = 0; !saved && c < n_chunks; c++) {
        memcpy(w.ckpt + c * KV, w.S, (size_t)KV * sizeof(float));
        const int64_t first = tok0 + c * C, Lc = len - c * C < C ? len - c * C : C;
        cw.vnew = w.vnew_all + c * C * p->V;
        LS_ISA_FN(kda_chunk_prepare)(pl, &cw, first, Lc, hv);
        LS_ISA_FN(kda_chunk_solve)(pl, &cw, w.S, first, Lc, hv, 0, p->V);
        if (c + 1 < n_chunks) LS_ISA_FN(kda_chunk_advance)(pl, &cw, w.S, Lc, 0, p->V);
    }

    kda_bwd_load_dht(b, n, hv, w.dS);
    for (int64_t c = n_chunks - 1; c >= 0; c--) {
        const int64_t first = tok0 + c * C, Lc = len - c * C < C ? len - c * C : C;
        const float *S0 = ckpt + c * KV;
        cw.vnew = (float *)(vnew_all + c * C * p->V); /* read only from here on */
        LS_ISA_FN(kda_chunk_prepare)(pl, &cw, first, Lc, hv);
        chunk_backward(b, &w, &cw, first, Lc, hv, S0, item_partials);
    }
    cw.vnew = (float *)vnew_forward;
    kda_bwd_store_dh0(b, n, hv, w.dS);
}
