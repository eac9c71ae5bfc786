/* KDA recurrent mode (prefill token by token, and decode); compiled once per ISA.
 *
 * With a_i = e^{g_i} the decay of key row i, one token is
 *     pred = (a * k)^T S,  o_pre = (a * qs)^T S           (S still the previous state)
 *     u = beta (v - pred),  o = o_pre + (qs . k) u         (o reads S_t = diag(a) S + k u^T)
 *     S <- diag(a) S + k u^T
 * Every column j of S, u and o depends on column j only, so the state is walked in column
 * blocks of four vectors: the two products read the block, then the update rewrites it while
 * it is still in L1. One read and one write of the state per token. */
#include <string.h>

#include "kda/kda_simd.h"

enum { COLS = 4 }; /* vectors per column block */

/* One column block of n vectors (n <= COLS; the last one w lanes wide). */
static inline void column_block(int64_t K, int64_t V, float *S, int64_t j0, int nv, int64_t w_last,
                                const float *a, const float *ak, const float *aq, const float *ks,
                                float qk, float beta, const float *v, float *out)
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
        u[c] = vf_mul(vb, vf_sub(vin, acc_p[c]));
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
                    vf_store_n(row + c * VW, vf_fmadd(vk, u[c], vf_mul(va, vf_load_n(row + c * VW, w))), w);
            }
        }
    }
}

void LS_ISA_FN(kda_recurrent_item)(const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv,
                                   float *S, float *o, float *scratch, int64_t j0, int64_t j1)
{
    const linseq_kda_problem *p = pl->p;
    const int64_t K = p->K, V = p->V, HV = pl->HV;
    float *qs = scratch, *ks = qs + K, *g = ks + K, *a = g + K, *ak = a + K, *aq = ak + K;

    for (int64_t tok = tok0; tok < tok0 + len; tok++) {
        float beta;
        kda_load_token_v(pl, tok, hv, qs, ks, &beta, g);
        kda_row_decays(pl, g, a);
        for (int64_t i = 0; i < K; i++) {
            ak[i] = a[i] * ks[i];
            aq[i] = a[i] * qs[i];
        }
        const float qk = ls_vdot(K, qs, ks);
        const float *v = p->v + (tok * HV + hv) * V;
        float *out = o ? o + (tok * HV + hv) * V : NULL;
        const int64_t block = COLS * VW;
        for (int64_t jb = j0; jb < j1; jb += block) {
            const int64_t w = j1 - jb < block ? j1 - jb : block;
            const int nv = (int)((w + VW - 1) / VW);
            column_block(K, V, S, jb, nv, w - (int64_t)(nv - 1) * VW, a, ak, aq, ks, qk, beta, v, out);
        }
    }
}
