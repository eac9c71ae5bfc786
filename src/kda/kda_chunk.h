/* Internal: the steps of one KDA chunk, shared by the chunked forward (kda_chunk.c) and the
 * chunked backward (kda_chunk_bwd.c), which recomputes a chunk from its start state before
 * differentiating it. See kda_chunk.c for the algebra. */
#ifndef LS_KDA_CHUNK_H
#define LS_KDA_CHUNK_H

#include <stdint.h>

#include "kda/kda_internal.h"

enum { KDA_SUB_CHUNK = 16 };

/* One thread's buffers for one chunk of C rows. */
typedef struct kda_chunk_ws {
    float *qs, *ks, *beta, *g;   /* loaded rows [C,K] [C,K] [C] [C,gK] (g after the gate)    */
    double *G;                   /* in-chunk cumulative log decay [C,gK]                     */
    float *eG, *eL;              /* [C,gK]: e^{G_r} and e^{G_last - G_r}                      */
    float *qg, *kbg, *kd;        /* [C,K]: qs e^G, beta k e^G, k e^{G_last - G}               */
    float *kc, *qt, *kt, *tmp;   /* sub-chunk factors [C,K] [16,K] [16,K] [K]                */
    float *Aqk;                  /* [C,C] lower incl.: sum_d qs_r k_c e^{G_r - G_c}           */
    float *Akk;                  /* [C,C] strictly lower: sum_d k_r k_c e^{G_r - G_c} (no beta) */
    float *vnew;                 /* [C,V] the deltas u of the chunk's tokens                  */
    float *decay_last;           /* [K] e^{G_last}                                           */
} kda_chunk_ws;

/* Bytes of one kda_chunk_ws (64-aligned pieces), and its layout in a block of that size. */
size_t kda_chunk_ws_bytes(const kda_plan *pl);
void kda_chunk_ws_carve(const kda_plan *pl, void *base, kda_chunk_ws *w);

/* Loads rows [first, first+Lc) of value head hv, their cumulative decay, the score matrices
 * and the decay factors: everything of a chunk that does not depend on its start state. */
void kda_chunk_prepare(const kda_plan *pl, const kda_chunk_ws *w, int64_t first, int64_t Lc,
                       int64_t hv);

/* vnew = (I + diag(beta) Akk)^{-1} (diag(beta) V - kbg S0). */
void kda_chunk_solve(const kda_plan *pl, const kda_chunk_ws *w, const float *S0, int64_t first,
                     int64_t Lc, int64_t hv);

/* S <- diag(e^{G_last}) S + kd^T vnew. */
void kda_chunk_advance(const kda_plan *pl, const kda_chunk_ws *w, float *S, int64_t Lc);

/* The log decay every chunk computation sees: g raised to KDA_LOG_DECAY_FLOOR (NaN stays). */
#define KDA_LOG_DECAY_FLOOR (-110.0f)

#endif
