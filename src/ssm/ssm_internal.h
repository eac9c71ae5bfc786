/* Internal: what the SSM1 and conv1d entry points share with their kernels and references.
 *
 * The entry points (ssm1.c, conv1d.c) validate the problem; the fast paths split it into
 * independent items, one per (sequence, block of SSM_LANES channels). Both ops walk time in
 * the outer loop and channels in the inner loop, so the reads of x along D are contiguous. */
#ifndef LS_SSM_INTERNAL_H
#define LS_SSM_INTERNAL_H

#include <stdint.h>

#include "core/status.h"
#include "core/validate.h"
#include "linseq.h"

/* Channels per work item. A full block runs loops with this constant trip count, which gcc
 * vectorises at -O2; 64 channels x N states (N = 16 in Mamba checkpoints) stay in L1. */
#define SSM_LANES 64

/* Tokens [*start, *start + *len) of sequence n in the flattened [B*T] time axis. */
static inline void ssm_seq_range(const int64_t *cu_seqlens, int64_t T, int64_t n, int64_t *start,
                                 int64_t *len)
{
    if (cu_seqlens) {
        *start = cu_seqlens[n];
        *len = cu_seqlens[n + 1] - cu_seqlens[n];
    } else {
        *start = n * T;
        *len = T;
    }
}

/* The number of state rows: B, or the varlen sequence count. */
static inline int64_t ssm_seq_count(const int64_t *cu_seqlens, int64_t n_seqs, int64_t B)
{
    return cu_seqlens ? n_seqs : B;
}

/* The checks both entry points make before building their argument table: the exec, and
 * n_seqs when cu_seqlens is given (n_seqs is ignored without it). cu_seqlens itself is read
 * only after its byte size has been validated, by ls_check_cu_seqlens. */
static inline linseq_status ssm_check_common(const char *fn, const linseq_exec *exec,
                                             const int64_t *cu_seqlens, int64_t n_seqs)
{
    linseq_status st = ls_check_exec(fn, exec);
    if (st) return st;
    if (cu_seqlens) return ls_check_min(fn, "n_seqs", n_seqs, 1);
    return LINSEQ_OK;
}

/* The entry count of cu_seqlens for its argument-table row; saturates so that an absurd n_seqs
 * is reported as a size overflow instead of overflowing here. */
static inline int64_t ssm_cu_entries(const int64_t *cu_seqlens, int64_t n_seqs)
{
    if (!cu_seqlens) return 0;
    return n_seqs < INT64_MAX ? n_seqs + 1 : INT64_MAX;
}

static inline linseq_activation ssm1_gate_activation(const linseq_ssm1_problem *p)
{
    return p->gate_activation == LINSEQ_ACT_DEFAULT ? LINSEQ_ACT_SILU : p->gate_activation;
}

static inline linseq_activation conv1d_activation(const linseq_conv1d_problem *p)
{
    return p->activation == LINSEQ_ACT_DEFAULT ? LINSEQ_ACT_IDENTITY : p->activation;
}

/* The fast float32 forward of a validated problem (arguments as in linseq_ssm1_forward).
 * Returns LINSEQ_ERR_OUT_OF_MEMORY, having written nothing, when its workspace cannot be
 * allocated. */
linseq_status ls_ssm1_scan(const linseq_ssm1_problem *p, const linseq_exec *exec, float *y,
                           float *hT);

/* The readable references: the header's formulas transcribed literally, computed in double,
 * rounded to float32 on store. They assume a validated problem and accept the same in-place
 * state (hT == h0, state_out == conv_state) as the entry points. ls_ssm1_reference returns
 * LINSEQ_ERR_OUT_OF_MEMORY, having written nothing, if its state row cannot be allocated. */
linseq_status ls_ssm1_reference(const linseq_ssm1_problem *p, float *y, float *hT);
void ls_conv1d_reference(const linseq_conv1d_problem *p, float *y, float *state_out);

#endif
