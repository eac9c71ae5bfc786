/* Internal: the KDA segment summary (linseq_kda_segment_forward / _backward, kda_segment.c)
 * and its per-ISA kernel (kda_segment_simd.c).
 *
 * A segment maps its start state affinely, S_end = P S_start + R: per (sequence, value head)
 * P [K,K] is the product of the tokens' (I - beta k k^T) diag(e^g), latest on the left, and R
 * [K,V] the end state from zeros. The kernel advances both through the chunked form's steps. */
#ifndef LS_KDA_SEGMENT_H
#define LS_KDA_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "kda/kda_chunk.h"
#include "kda/kda_internal.h"
#include "simd/isa.h"

/* One item's workspace: kda_chunk_ws_layout(pl) bytes for the chunk, then a [C,K] block for
 * the chunk's rows of the transition. */
static inline size_t kda_segment_ws_bytes(const kda_plan *pl)
{
    return kda_align64(kda_chunk_ws_layout(pl, NULL, NULL)) +
           kda_align64((size_t)pl->chunk * (size_t)pl->p->K * sizeof(float));
}

/* Tokens [tok0, tok0+len) of value head hv: P [K,K] <- the segment's transition, R [K,V] <-
 * its end state from zeros. pl->chunk set; ws holds kda_segment_ws_bytes(pl), 64-aligned. */
LS_ISA_DECLARE(void, kda_segment_item,
               (const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv, float *P, float *R,
                void *ws));

#endif
