/* Internal: what the KDA entry points hand to the recurrent and chunked kernels.
 *
 * The entry points (kda.c) validate the problem and split it into independent items, one
 * per (sequence, value head). A kernel sees one item: its token range in the flattened
 * [B*T] time axis, its value head, and a K-major working state S [K,V] that it advances. */
#ifndef LS_KDA_INTERNAL_H
#define LS_KDA_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/activation.h"
#include "linseq.h"

/* A validated problem with its defaults resolved. */
typedef struct kda_plan {
    const linseq_kda_problem *p;
    int64_t HV;       /* value heads (p->HV, or H when 0)                                   */
    int64_t group;    /* value heads per qk head: value head hv reads qk head hv / group    */
    int64_t n_seqs;   /* state rows: B, or the varlen sequence count                       */
    int64_t gK;       /* decay values per token and head: K, or 1 (per head / none)          */
    float scale;
    int chunk;        /* chunk size (chunked mode)                                         */
} kda_plan;

/* Tokens [*start, *start + *len) of sequence n in the flattened time axis. */
static inline void kda_seq_range(const kda_plan *pl, int64_t n, int64_t *start, int64_t *len)
{
    const linseq_kda_problem *p = pl->p;
    if (p->cu_seqlens) {
        *start = p->cu_seqlens[n];
        *len = p->cu_seqlens[n + 1] - p->cu_seqlens[n];
    } else {
        *start = n * p->T;
        *len = p->T;
    }
}

/* The decay of the in-kernel gate; the standalone gate op uses the same function so the two
 * agree bit for bit. */
static inline float kda_gate_value(float raw, float bias, float a_log, float lower_bound)
{
    const float x = raw + bias;
    if (lower_bound == 0.0f) return -expf(a_log) * ls_softplusf(x);
    return lower_bound * ls_sigmoidf(expf(a_log) * x);
}

/* One token of one item after the in-kernel options: qs = scale * l2norm(q) (or scale * q),
 * ks = l2norm(k) (or k), *beta (after the sigmoid when beta is a logit), g[gK] the log decay
 * (after the gate when it is in kernel; 0 with no decay). tok is a flattened token index. */
void kda_load_token(const kda_plan *pl, int64_t tok, int64_t hv, float *qs, float *ks,
                    float *beta, float *g);

/* S [K,V] <- the stored state row (K-major or V-first), or zeros when src is NULL. */
void kda_state_load(const kda_plan *pl, const float *src, float *S);
/* The stored state row <- S [K,V]. */
void kda_state_store(const kda_plan *pl, const float *S, float *dst);

/* Recurrent mode: advances S over tokens [tok0, tok0+len) of value head hv and writes their
 * outputs. scratch holds kda_recurrent_scratch_floats(pl) floats. */
size_t kda_recurrent_scratch_floats(const kda_plan *pl);
void kda_recurrent_item(const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv, float *S,
                        float *o, float *scratch);

/* Chunked mode: same contract. ws holds kda_chunk_workspace_bytes(pl) bytes, 64-aligned. */
size_t kda_chunk_workspace_bytes(const kda_plan *pl);
void kda_chunk_item(const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv, float *S,
                    float *o, void *ws);

/* The readable reference: the recurrence of the header comment, token by token, in double,
 * with every option applied literally. Assumes a validated problem. */
linseq_status ls_kda_reference(const linseq_kda_problem *p, float *o, float *ht);

/* Reference of the standalone gate, in double. */
void ls_kda_gate_reference(const linseq_kda_gate_problem *p, float *g);

#endif
