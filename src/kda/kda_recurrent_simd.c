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

#include "kda/kda_columns.h"

void LS_ISA_FN(kda_recurrent_item)(const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv,
                                   float *S, float *o, float *scratch, int64_t j0, int64_t j1)
{
    const linseq_kda_problem *p = pl->p;
    const int64_t K = p->K, V = p->V, HV = pl->HV;
    float *v_row = scratch + 6 * K, *o_row = v_row + V; /* bf16: [V] each, columns [j0, j1) */

    for (int64_t tok = tok0; tok < tok0 + len; tok++) {
        const token_terms t = token_terms_of(pl, tok, hv, scratch);
        const int64_t at = (tok * HV + hv) * V;
        /* column_block indexes v and out by column: a widened span stands at v_row + j0 */
        const float *v = kda_token_span(pl, p->v, at + j0, j1 - j0, v_row + j0) - j0;
        float *out = !o ? NULL : pl->bf16 ? o_row : o + at;
        token_columns(K, V, S, S, false, j0, j1, &t, v, out);
        if (o && pl->bf16) kda_token_store_bf16(o, at + j0, j1 - j0, o_row + j0);
    }
}

/* One decode token (request tok) on a [K,V]-first state read from `from` and written to `to`
 * (a pool's row in place, or its destination row), float32 or bf16: a bf16 state is widened
 * as it is loaded and rounded once as it is stored, so the result is the float32 step's on
 * the widened state, rounded once, with one read and one write of the half-size row. */
void LS_ISA_FN(kda_decode_rows_item)(const kda_plan *pl, int64_t tok, int64_t hv, const void *from,
                                     void *to, bool half, float *o, float *scratch)
{
    decode_rows_token(pl, tok, hv, from, to, half, o, scratch);
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
