/* Internal: what the KDA backward entry point (kda_backward.c) shares with its recurrent
 * (kda_recurrent_bwd.c) and chunked (kda_chunk_bwd.c) kernels.
 *
 * A work item is one (sequence, qk head): it walks the group's value heads in order, so the
 * dq and dk rows it owns collect the sum over the group without any race, in a fixed order.
 * The kernels produce, per token and value head, the gradients with respect to the loaded
 * quantities (qs = scale * l2norm(q), ks = l2norm(k), beta and g after their in-kernel
 * functions) and hand them to kda_bwd_emit, which applies the in-kernel options' chain rules. */
#ifndef LS_KDA_BACKWARD_H
#define LS_KDA_BACKWARD_H

#include <stddef.h>
#include <stdint.h>

#include "kda/kda_internal.h"

struct kda_kernels;

typedef struct kda_bwd {
    const kda_plan *pl;
    const float *d_o, *d_ht;
    const linseq_kda_grads *gr;
    int64_t max_len;  /* longest sequence: sizes the checkpoint buffers */
    int64_t segment;  /* recurrent mode: tokens between state checkpoints */
    double *partials; /* per item: [G] dA_log, then [G*gK] ddt_bias, summed in double */
    int64_t partial_len;
    const struct kda_kernels *kern; /* this call's ISA (kda_kernels.h) */
    const float *saved;             /* the training forward's blocks, or NULL (recompute) */
    const int64_t *saved_at;        /* their offsets per item */
} kda_bwd;

/* This item's saved block: the states before each chunk or segment, then (chunked) the
 * deltas; NULL without one. */
static inline const float *kda_bwd_saved_block(const kda_bwd *b, int64_t n, int64_t hv)
{
    return b->saved ? b->saved + b->saved_at[n * b->pl->HV + hv] : NULL;
}

/* Gradients of one token of value head hv w.r.t. its loaded quantities: dqs, dks [K] (added
 * to the item's dq/dk rows, chained at the end of the item), dv [V], dbeta (w.r.t. beta after
 * the sigmoid) and dg [gK] (w.r.t. the decay after the gate). item_partials: this item's. */
void kda_bwd_emit(const kda_bwd *b, int64_t tok, int64_t hv, const float *dqs, const float *dks,
                  const float *dv, float dbeta, const float *dg, double *item_partials);

/* d_ht of state row (n, hv) as a K-major [K,V] (zeros without d_ht), and dh0 from one. */
void kda_bwd_load_dht(const kda_bwd *b, int64_t n, int64_t hv, float *dS);
void kda_bwd_store_dh0(const kda_bwd *b, int64_t n, int64_t hv, const float *dS);

/* dq and dk rows of tokens [tok0, tok0+len) of qk head h: from the gradients w.r.t. the
 * loaded qs and ks (the group's sum) to the gradients w.r.t. the raw q and k. */
LS_ISA_DECLARE(void, kda_bwd_chain_qk, (const kda_bwd *b, int64_t tok0, int64_t len, int64_t h));

/* Recurrent: the backward of value head hv over tokens [tok0, tok0+len) of sequence n. */
LS_ISA_DECLARE(size_t, kda_recurrent_bwd_ws_bytes, (const kda_bwd *b));
LS_ISA_DECLARE(void, kda_recurrent_bwd_item,
               (const kda_bwd *b, int64_t n, int64_t hv, int64_t tok0, int64_t len, void *ws,
                double *item_partials));

/* Chunked: the same contract (b->pl->chunk set). */
LS_ISA_DECLARE(size_t, kda_chunk_bwd_ws_bytes, (const kda_bwd *b));
LS_ISA_DECLARE(void, kda_chunk_bwd_item,
               (const kda_bwd *b, int64_t n, int64_t hv, int64_t tok0, int64_t len, void *ws,
                double *item_partials));

#endif
