/* Internal: the EMA op (linseq_ema_forward, linseq_ema_decode): its plan, its kernel (one per
 * ISA, ema_simd.c) and the entry points per ISA (for the tests). */
#ifndef LS_EMA_EMA_H
#define LS_EMA_EMA_H

#include <stdint.h>

#include "linseq.h"
#include "simd/isa.h"

/* The op's description (ema.c), which its entry points validate through. */
struct ls_op;
extern const struct ls_op ls_op_ema;

/* Channels per work item: whole 64-byte lines for every ISA, so threads never share one. */
#define EMA_SPAN 64

/* One call's work. Item i is request i / n_blocks over channels [EMA_SPAN * (i % n_blocks),
 * + EMA_SPAN). Request b's state is row rows[b] (NULL: row b) of s0 (read; NULL: zeros) and of
 * sT (written; NULL: not written); a negative row is a padding request (y = 0). The forward
 * passes h0 and hT (possibly the same buffer), decode the pool as both. */
typedef struct ema_plan {
    int64_t T, D, n_blocks;
    const float *x, *a;
    float *y;
    const float *s0;
    float *sT;
    const int64_t *rows;
} ema_plan;

/* The item function of ls_parallel_for over an ema_plan. */
LS_ISA_DECLARE(void, ls_ema_item, (void *ctx, int64_t item, int thread));

/* The entry points with the ISA chosen (linseq_ema_* resolve it from the CPU). */
linseq_status ls_ema_forward_isa(const linseq_ema_problem *p, const linseq_exec *exec, float *y,
                                 float *hT, ls_isa isa);
linseq_status ls_ema_decode_isa(const linseq_ema_problem *p, const linseq_exec *exec, float *state,
                                int64_t n_state_rows, const int64_t *state_rows, float *y,
                                ls_isa isa);

#endif
