/* KDA recurrent mode (prefill token by token, and decode); compiled once per ISA.
 *
 * With a_i = e^{g_i} the decay of key row i, one token is
 *     pred = (a * k)^T S,  o_pre = (a * qs)^T S           (S still the previous state)
 *     u = beta (v - pred),  o = o_pre + (qs . k) u         (o reads S_t = diag(a) S + k u^T)
 *     S <- diag(a) S + k u^T
 * Every column j of S, u and o depends on column j only, so the state is walked in column
 * blocks of four vectors: the two products read the block, then the update rewrites it while
 * it is still in L1. One read and one write of the state per token. With bf16 per-token
 * tensors the token's v row is widened into scratch and its o row summed there and rounded
 * once: the arithmetic is the float32 path's on the widened values. Without the delta rule
 * (gated linear attention) u = v: pred is neither formed nor used. */
#include <string.h>

#include "kda/kda_simd.h"

enum { COLS = 4 }; /* vectors per column block */

/* One column block of n vectors (n <= COLS; the last one w lanes wide). Always inlined, so
 * that the full-block call below compiles to a body with constant trip counts and its sums in
 * registers (called with run-time sizes it ran 1.6x slower). */
static inline __attribute__((always_inline)) void
column_block(int64_t K, int64_t V, float *S, int64_t j0, int nv, int64_t w_last, const float *a,
             const float *ak, const float *aq, const float *ks, float qk, float beta, bool delta,
             const float *v, float *out)
{
    vf acc_p[COLS], acc_o[COLS], u[COLS];
    for (int c = 0; c < COLS; c++) acc_p[c] = acc_o[c] = vf_zero();
    const bool full = nv == COLS && w_last == VW;
    for (int64_t i = 0; i < K; i++) {
        const float *row = S + i * V + j0;
        const vf vak = vf_set1(ak[i]), vaq = vf_set1(aq[i]);
        if (full) {
#pragma GCC unroll 4
            for (int c = 0; c < COLS; c++) {
                const vf s = vf_load(row + c * VW);
                acc_p[c] = vf_fmadd(vak, s, acc_p[c]);
                acc_o[c] = vf_fmadd(vaq, s, acc_o[c]);
            }
        } else {
            for (int c = 0; c < nv; c++) {
                const int64_t w = c == nv - 1 ? w_last : VW;
                const vf s = w == VW ? vf_load(row + c * VW) : vf_load_n(row + c * VW, w);
                acc_p[c] = vf_fmadd(vak, s, acc_p[c]);
                acc_o[c] = vf_fmadd(vaq, s, acc_o[c]);
            }
        }
    }
    const vf vb = vf_set1(beta), vqk = vf_set1(qk);
    for (int c = 0; c < nv; c++) {
        const int64_t w = c == nv - 1 ? w_last : VW;
        const vf vin = w == VW ? vf_load(v + j0 + c * VW) : vf_load_n(v + j0 + c * VW, w);
        u[c] = delta ? vf_mul(vb, vf_sub(vin, acc_p[c])) : vin;
        if (out) {
            const vf o = vf_fmadd(vqk, u[c], acc_o[c]);
            if (w == VW)
                vf_store(out + j0 + c * VW, o);
            else
                vf_store_n(out + j0 + c * VW, o, w);
        }
    }
    for (int64_t i = 0; i < K; i++) {
        float *row = S + i * V + j0;
        const vf va = vf_set1(a[i]), vk = vf_set1(ks[i]);
        if (full) {
#pragma GCC unroll 4
            for (int c = 0; c < COLS; c++)
                vf_store(row + c * VW, vf_fmadd(vk, u[c], vf_mul(va, vf_load(row + c * VW))));
        } else {
            for (int c = 0; c < nv; c++) {
                const int64_t w = c == nv - 1 ? w_last : VW;
                if (w == VW)
                    vf_store(row + c * VW, vf_fmadd(vk, u[c], vf_mul(va, vf_load(row + c * VW))));
                else
                    vf_store_n(row + c * VW,
                               vf_fmadd(vk, u[c], vf_mul(va, vf_load_n(row + c * VW, w))), w);
            }
        }
    }
}

/* One token's factors in scratch [6K]: qs, ks, g, the decays a = e^g, a*ks and a*qs; and
 * beta and qs . ks. */
static inline void token_factors(const kda_plan *pl, int64_t tok, int64_t hv, float *scratch,
                                 float *beta, float *qk)
{
    const int64_t K = pl->p->K;
    float *qs = scratch, *ks = qs + K, *g = ks + K, *a = g + K, *ak = a + K, *aq = ak + K;
    kda_load_token_v(pl, tok, hv, qs, ks, beta, g);
    kda_row_decays(pl, g, a);
    kda_vmul(K, a, ks, ak);
    kda_vmul(K, a, qs, aq);
    *qk = ls_vdot(K, qs, ks);
}

void LS_ISA_FN(kda_recurrent_item)(const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv,
                                   float *S, float *o, float *scratch, int64_t j0, int64_t j1)
{
    const linseq_kda_problem *p = pl->p;
    const int64_t K = p->K, V = p->V, HV = pl->HV;
    const float *ks = scratch + K, *a = scratch + 3 * K, *ak = a + K, *aq = ak + K;
    float *v_row = scratch + 6 * K, *o_row = v_row + V; /* bf16: [V] each, columns [j0, j1) */

    for (int64_t tok = tok0; tok < tok0 + len; tok++) {
        float beta, qk;
        token_factors(pl, tok, hv, scratch, &beta, &qk);
        const int64_t at = (tok * HV + hv) * V;
        /* column_block indexes v and out by column: a widened span stands at v_row + j0 */
        const float *v = kda_token_span(pl, p->v, at + j0, j1 - j0, v_row + j0) - j0;
        float *out = !o ? NULL : pl->bf16 ? o_row : o + at;
        const int64_t block = COLS * VW;
        for (int64_t jb = j0; jb < j1; jb += block) {
            const int64_t w = j1 - jb < block ? j1 - jb : block;
            if (w == block) {
                column_block(K, V, S, jb, COLS, VW, a, ak, aq, ks, qk, beta, pl->delta, v, out);
            } else {
                const int nv = (int)((w + VW - 1) / VW);
                column_block(K, V, S, jb, nv, w - (int64_t)(nv - 1) * VW, a, ak, aq, ks, qk, beta,
                             pl->delta, v, out);
            }
        }
        if (o && pl->bf16) kda_token_store_bf16(o, at + j0, j1 - j0, o_row + j0);
    }
}

/* One decode token on a V-first state S^T [V,K] where it lives: row j of S^T is column j of
 * S, so pred_j = (a k) . S^T_j and o_j need one dot product per row, reduced VW rows at a
 * time, and the update S^T_j <- a * S^T_j + u_j k rewrites each row while it is in L1. */
void LS_ISA_FN(kda_decode_v_first)(const kda_plan *pl, int64_t tok, int64_t hv, float *ST, float *o,
                                   float *scratch)
{
    const linseq_kda_problem *p = pl->p;
    const int64_t K = p->K, V = p->V, HV = pl->HV;
    const float *ks = scratch + K, *a = scratch + 3 * K, *ak = a + K, *aq = ak + K;
    float *v_row = scratch + 6 * K, *o_row = v_row + V; /* bf16 only */
    float beta, qk;
    token_factors(pl, tok, hv, scratch, &beta, &qk);
    const int64_t at = (tok * HV + hv) * V;
    const float *v = kda_token_span(pl, p->v, at, V, v_row);
    float *out = pl->bf16 ? o_row : o + at;
    for (int64_t j0 = 0; j0 < V; j0 += VW) {
        const int64_t rows = V - j0 < VW ? V - j0 : VW;
        vf acc_p[VW], acc_o[VW];
        for (int64_t r = 0; r < VW; r++) acc_p[r] = acc_o[r] = vf_zero();
        for (int64_t r = 0; r < rows; r++) {
            const float *row = ST + (j0 + r) * K;
            int64_t i = 0;
            for (; i + VW <= K; i += VW) {
                const vf s = vf_load(row + i);
                acc_p[r] = vf_fmadd(vf_load(ak + i), s, acc_p[r]);
                acc_o[r] = vf_fmadd(vf_load(aq + i), s, acc_o[r]);
            }
            if (i < K) {
                const vf s = vf_load_n(row + i, K - i);
                acc_p[r] = vf_fmadd(vf_load_n(ak + i, K - i), s, acc_p[r]);
                acc_o[r] = vf_fmadd(vf_load_n(aq + i, K - i), s, acc_o[r]);
            }
        }
        const vf pred = vf_hsum_lanes(acc_p), o_pre = vf_hsum_lanes(acc_o);
        const vf vin = rows == VW ? vf_load(v + j0) : vf_load_n(v + j0, rows);
        const vf u = pl->delta ? vf_mul(vf_set1(beta), vf_sub(vin, pred)) : vin;
        const vf ov = vf_fmadd(vf_set1(qk), u, o_pre);
        float ubuf[VW];
        vf_store(ubuf, u);
        if (rows == VW)
            vf_store(out + j0, ov);
        else
            vf_store_n(out + j0, ov, rows);
        for (int64_t r = 0; r < rows; r++) {
            float *row = ST + (j0 + r) * K;
            const vf ur = vf_set1(ubuf[r]);
            int64_t i = 0;
            for (; i + VW <= K; i += VW)
                vf_store(row + i,
                         vf_fmadd(ur, vf_load(ks + i), vf_mul(vf_load(a + i), vf_load(row + i))));
            if (i < K)
                vf_store_n(row + i,
                           vf_fmadd(ur, vf_load_n(ks + i, K - i),
                                    vf_mul(vf_load_n(a + i, K - i), vf_load_n(row + i, K - i))),
                           K - i);
        }
    }
    if (pl->bf16) kda_token_store_bf16(o, at, V, o_row);
}
