/* The KDA segment summary, compiled once per ISA: one item's transition P [K,K] and
 * zero-start end state R [K,V] through the steps of the chunked forward (kda_chunk_simd.c).
 *
 * A chunk maps its start state S0 affinely (kda_chunk_simd.c):
 *     (I + diag(beta) Akk) Vnew = diag(beta) V - kbg S0,   S_C = diag(e^{G_last}) S0 + kd^T Vnew
 * Its linear part, applied to the transition P of the chunks before it, is the same update
 * with V = 0 and K columns:
 *     (I + diag(beta) Akk) U = -kbg P,                     P <- diag(e^{G_last}) P + kd^T U
 * and R is the forward's own state update from zeros, without the output. Both use the
 * matrices the forward's prepare step builds (products of decays e^g <= 1 only), so the
 * summary is exact for every decay, as the forward. */
#include "kda/kda_segment.h"
#include "kda/kda_simd.h"

/* P <- the chunk's transition times P; U [Lc,K] is scratch. */
static void advance_transition(const kda_plan *pl, const kda_chunk_ws *w, float *P, float *U,
                               int64_t Lc)
{
    const int64_t K = pl->p->K, C = pl->chunk, S = KDA_SUB_CHUNK;
    ls_gemm(Lc, K, K, w->kbg, K, 1, P, K, U, K, false);
    ls_vscale(Lc * K, -1.0f, U);
    /* forward substitution by 16-row blocks, as the forward's solve */
    for (int64_t r0 = 0; r0 < Lc; r0 += S) {
        const int64_t m = Lc - r0 < S ? Lc - r0 : S;
        if (r0 > 0) ls_gemm(m, K, r0, w->Mneg + r0 * C, C, 1, U, K, U + r0 * K, K, true);
        kda_substitute_rows(U, K, K, r0, r0 + m, w->Mneg, C, 1);
    }
    ls_gemm_scaled(K, K, Lc, w->kd, 1, K, U, K, P, K, true, w->decay_last);
}

void LS_ISA_FN(kda_segment_item)(const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv,
                                 float *P, float *R, void *ws)
{
    const int64_t K = pl->p->K, V = pl->p->V, C = pl->chunk;
    kda_chunk_ws w = {0};
    const size_t chunk_bytes = kda_align64(kda_chunk_ws_layout(pl, ws, &w));
    float *U = (float *)(void *)((unsigned char *)ws + chunk_bytes);
    for (int64_t i = 0; i < K * K; i++) P[i] = 0.0f;
    for (int64_t i = 0; i < K; i++) P[i * K + i] = 1.0f;
    for (int64_t i = 0; i < K * V; i++) R[i] = 0.0f;
    for (int64_t c0 = 0; c0 < len; c0 += C) {
        const int64_t Lc = len - c0 < C ? len - c0 : C;
        LS_ISA_FN(kda_chunk_prepare)(pl, &w, tok0 + c0, Lc, hv);
        LS_ISA_FN(kda_chunk_solve)(pl, &w, R, tok0 + c0, Lc, hv, 0, V);
        LS_ISA_FN(kda_chunk_advance)(pl, &w, R, Lc, 0, V);
        advance_transition(pl, &w, P, U, Lc);
    }
}
