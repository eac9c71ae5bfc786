/* Internal: the steps of one KDA chunk, shared by the chunked forward (kda_chunk_simd.c) and
 * the chunked backward (kda_chunk_bwd_simd.c), which recomputes a chunk from its start state
 * before differentiating it. See kda_chunk_simd.c for the algebra. */
#ifndef LS_KDA_CHUNK_H
#define LS_KDA_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#include "core/kda_math.h"
#include "kda/kda_internal.h"
#include "simd/isa.h"

enum { KDA_SUB_CHUNK = 16 };

/* The log decay every chunk computation sees: g raised to this floor (core/kda_math.h). */
#define KDA_LOG_DECAY_FLOOR LS_KDA_LOG_DECAY_FLOOR

/* One thread's buffers for one chunk of C rows. All decay factors are products of the
 * per-token decays a_t = e^{g_t} <= 1, never exponentials of differences of sums, so none can
 * overflow, and a decay of -1000 is an exact zero that leaves the other factors intact. */
typedef struct kda_chunk_ws {
    float *qs, *ks, *beta, *g; /* loaded rows [C,K] [C,K] [C] [C,gK] (g after the gate) */
    float *a;                  /* [C,gK] e^{g_r} with g floored */
    float *eG, *eL;            /* [C,gK] e^{G_r} and e^{G_last - G_r} (G: in-chunk sums) */
    float *qg, *kbg, *kd;      /* [C,K]: qs e^G, beta k e^G, k e^{G_last - G} */
    float *Aqk;                /* [C,C] lower incl.: sum_d qs_r k_c e^{G_r - G_c}; never
                                * read above the diagonal (kda_triangle_rows) */
    float *Akk;                /* [C,C] strictly lower: sum_d k_r k_c e^{G_r - G_c} (no beta) */
    float *Mneg;               /* [C,C] strictly lower: -beta_r Akk[r,c], the solve's factor */
    float *vnew;               /* [C,V] the deltas u of the chunk's tokens */
    float *decay_last;         /* [K] e^{G_last} */
    /* scratch of the score construction */
    float *yt;              /* [K,C] column factors, transposed */
    float *yts;             /* [K,C] the same scaled to one row block's reference */
    float *xt;              /* [2*16,K] the row block's q and k, scaled */
    float *sc;              /* [2*16,C] one row block's scores */
    float *w, *fr, *dscale; /* [K] running products */
    float *tot;             /* [C/16,K] each sub-chunk's total decay */
    float *tile;            /* [C,V], bf16 only: the chunk's outputs before they are rounded
                             * (none for float32, whose outputs are summed where they lie) */
    /* bf16 products only (pl->bf16_products): the operands of the output's products packed
     * as simd/gemm_bf16.h describes, Kw = ceil(K/2) and Cw = C/2 words */
    uint32_t *qg_w;   /* [C,Kw] rows of qg */
    uint32_t *Aqk_w;  /* [C,Cw] rows of Aqk before their 16-row block (rows >= 16) */
    uint32_t *S0_w;   /* [Kw,V] pairs of rows of the chunk-start state */
    uint32_t *vnew_w; /* [Cw,V] pairs of token rows of vnew */
    uint32_t *qs_w;   /* [C,Kw] rows of qs (one decay per head: Aqk = (Qs K^T) o M) */
    uint32_t *yt_w;   /* [Kw,C] pairs of rows of yt, the same */
} kda_chunk_ws;

static inline size_t kda_align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Lays the workspace out in one block; with base == NULL it only measures. */
static inline size_t kda_chunk_ws_layout(const kda_plan *pl, unsigned char *base, kda_chunk_ws *w)
{
    const size_t C = (size_t)pl->chunk, K = (size_t)pl->p->K, V = (size_t)pl->p->V;
    const size_t gK = (size_t)pl->gK, S = KDA_SUB_CHUNK;
    size_t off = 0;
#define TAKE_AS(type, field, count)                                                                \
    do {                                                                                           \
        if (base) w->field = (type *)(void *)(base + off);                                         \
        off += kda_align64((count) * sizeof(type));                                                \
    } while (0)
#define TAKE(field, count) TAKE_AS(float, field, count)
    TAKE(qs, C * K);
    TAKE(ks, C * K);
    TAKE(beta, C);
    TAKE(g, C * gK);
    TAKE(a, C * gK);
    TAKE(eG, C * gK);
    TAKE(eL, C * gK);
    TAKE(qg, C * K);
    TAKE(kbg, C * K);
    TAKE(kd, C * K);
    TAKE(Aqk, C * C);
    TAKE(Akk, C * C);
    TAKE(Mneg, C * C);
    TAKE(vnew, C * V);
    TAKE(decay_last, K);
    TAKE(yt, K * C);
    TAKE(yts, K * C);
    TAKE(xt, 2 * S * K);
    TAKE(sc, 2 * S * C);
    TAKE(w, K);
    TAKE(fr, K);
    TAKE(dscale, K);
    TAKE(tot, (C / S + 1) * K);
    TAKE(tile, pl->bf16 ? C * V : 0);
    const size_t Kw = (K + 1) / 2, Cw = (C + 1) / 2, words = pl->bf16_products ? 1 : 0;
    TAKE_AS(uint32_t, qg_w, words * C * Kw);
    TAKE_AS(uint32_t, Aqk_w, words * C * Cw);
    TAKE_AS(uint32_t, S0_w, words * Kw * V);
    TAKE_AS(uint32_t, vnew_w, words * Cw * V);
    TAKE_AS(uint32_t, qs_w, words * C * Kw);
    TAKE_AS(uint32_t, yt_w, words * Kw * C);
#undef TAKE
#undef TAKE_AS
    return off;
}

/* Loads rows [first, first+Lc) of value head hv, their decay factors and the score matrices:
 * everything of a chunk that does not depend on its start state. */
LS_ISA_DECLARE(void, kda_chunk_prepare,
               (const kda_plan *pl, const kda_chunk_ws *w, int64_t first, int64_t Lc, int64_t hv));

/* The steps that involve the state touch the columns [j0, j1) of S, vnew and o only: each
 * column of V is independent there, so threads may take disjoint column ranges of one chunk
 * (and get the same bits as one thread doing all of them).
 *     solve:   vnew = (I + diag(beta) Akk)^{-1} (diag(beta) V - kbg S0)
 *     output:  o = qg S0 + Aqk vnew
 *     advance: S <- diag(e^{G_last}) S + kd^T vnew */
LS_ISA_DECLARE(void, kda_chunk_solve,
               (const kda_plan *pl, const kda_chunk_ws *w, const float *S0, int64_t first,
                int64_t Lc, int64_t hv, int64_t j0, int64_t j1));
LS_ISA_DECLARE(void, kda_chunk_output,
               (const kda_plan *pl, const kda_chunk_ws *w, const float *S0, int64_t first,
                int64_t Lc, int64_t hv, float *o, int64_t j0, int64_t j1));
LS_ISA_DECLARE(void, kda_chunk_advance,
               (const kda_plan *pl, const kda_chunk_ws *w, float *S, int64_t Lc, int64_t j0,
                int64_t j1));

#endif
