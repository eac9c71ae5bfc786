/* Internal: what kda_op.c shares of KDA's description with the other ops on a
 * linseq_kda_problem (kda_segment_op.c): the shapes of its tensors, its sizes and options, and
 * the options a benchmark runs with. */
#ifndef LS_KDA_KDA_OP_H
#define LS_KDA_KDA_OP_H

#include <stdint.h>

#include "optable/optable.h"
#include "simd/isa.h"

/* The descriptions of the ops on KDA's problems, which their entry points validate through. */
extern const ls_op ls_op_kda, ls_op_kda_segment, ls_op_kda_gate;

/* The value heads: HV, or H when HV is 0. */
static inline int64_t ls_op_kda_value_heads(const linseq_kda_problem *p)
{
    return p->HV ? p->HV : p->H;
}

/* The state rows: one per batch row, or per sequence with cu_seqlens. */
static inline int64_t ls_op_kda_state_rows(const linseq_kda_problem *p)
{
    return p->cu_seqlens ? p->n_seqs : p->B;
}

/* Shape functions (ls_shape_fn) of the problem's tensors, with their dims for messages. */
int ls_op_kda_shape_qk(const void *p, int64_t *d);          /* "[B,T,H,K]" */
int ls_op_kda_shape_token_value(const void *p, int64_t *d); /* "[B,T,HV,V]" */
int ls_op_kda_shape_beta(const void *p, int64_t *d);        /* "[B,T,HV]" */
int ls_op_kda_shape_g(const void *p, int64_t *d);           /* LS_OP_KDA_G_DIMS */
int ls_op_kda_shape_state(const void *p, int64_t *d);       /* LS_OP_KDA_STATE_DIMS */
int ls_op_kda_shape_a_log(const void *p, int64_t *d);       /* "[HV]" */
int ls_op_kda_shape_dt_bias(const void *p, int64_t *d);     /* LS_OP_KDA_DT_BIAS_DIMS */

#define LS_OP_KDA_G_DIMS "[B,T,HV,K] per channel, [B,T,HV] per head"
#define LS_OP_KDA_STATE_DIMS "[N,HV,K,V] ([N,HV,V,K] V-first)"
#define LS_OP_KDA_DT_BIAS_DIMS "[HV*K] per channel, [HV] per head"

/* The sizes and options of linseq_kda_problem, declared with their lengths so that LS_COUNT
 * sees them (kda_op.c defines them with the same: a row too many draws a warning). */
#define LS_OP_KDA_N_SIZES 6
#define LS_OP_KDA_N_OPTIONS 8
extern const ls_size_desc ls_op_kda_sizes[LS_OP_KDA_N_SIZES];
extern const ls_option_desc ls_op_kda_options[LS_OP_KDA_N_OPTIONS];

/* Per-channel decay and l2norm on: what a KDA layer runs with. */
void ls_op_kda_bench_options(void *p);

/* linseq_kda_decode over a serving engine's rows (ls_op.decode_rows) on one ISA: each
 * head's state read and written where the pool holds it, through the thread's scratch where
 * the row is not float32 or not its own destination. */
linseq_status ls_kda_decode_rows_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                     const ls_state_rows *rows, int64_t n_rows, float *o,
                                     ls_isa isa);

#endif
