/* Internal: what the KDA entry points hand to the recurrent and chunked kernels.
 *
 * The entry points (kda.c) validate the problem and split it into independent items, one
 * per (sequence, value head). A kernel sees one item: its token range in the flattened
 * [B*T] time axis, its value head, and a K-major working state S [K,V] that it advances. */
#ifndef LS_KDA_INTERNAL_H
#define LS_KDA_INTERNAL_H

#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/activation.h"
#include "core/kda_math.h"
#include "linseq.h"
#include "simd/isa.h"

/* A validated problem with its defaults resolved. */
typedef struct kda_plan {
    const linseq_kda_problem *p;
    int64_t HV;     /* value heads (p->HV, or H when 0) */
    int64_t group;  /* value heads per qk head: value head hv reads qk head hv / group */
    int64_t n_seqs; /* state rows: B, or the varlen sequence count */
    int64_t gK;     /* decay values per token and head: K, or 1 (per head / none) */
    float scale;
    double l2norm_eps; /* of the q/k l2norm: the problem's, or the default */
    int chunk;         /* chunk size (chunked mode), 0 in recurrent mode */
    int segment;       /* recurrent mode: tokens between saved states */
    /* The delta rule (beta given). Without it the op is gated linear attention: the update
     * S <- diag(a) S + k v^T writes v itself, nothing is predicted or solved, and beta is 1
     * wherever a kernel reads it. */
    bool delta;
    bool bf16; /* the per-token tensors (q, k, v, beta, g, o) are bfloat16: the kernels
                  * widen them as they load them and round o once as they store it */
    /* exec->products = BF16 (simd/gemm_bf16.h). bf16_products: the chunked forward's products
     * that only the output reads take bf16 operands (kda_chunk_simd.c); bf16_grad_products:
     * the chunked backward's products that only the per-token gradients read do
     * (kda_chunk_bwd_simd.c). bf16_dot: on vdpbf16ps (the AVX-512 kernels on a CPU with
     * AVX512-BF16), else on widened operands, with the same bits. */
    bool bf16_products, bf16_grad_products, bf16_dot;
    /* Set (to 1) by a kernel whose pass over g met a positive log decay, outside the
     * contract g <= 0 (kda_positive_g_status); NULL: not watched. */
    atomic_int *positive_g;
} kda_plan;

/* LINSEQ_OK, or the refusal of a call whose kernels met g > 0 (pl->positive_g set). */
linseq_status kda_positive_g_status(const char *fn, const kda_plan *pl);

/* Bytes per element of the per-token tensors. */
static inline size_t kda_token_bytes(const kda_plan *pl) { return pl->bf16 ? 2 : 4; }

/* The mode, chunk size and dtype of exec (NULL: defaults) into the plan. */
void kda_exec_plan(kda_plan *pl, const linseq_exec *exec);

/* Validates everything but the tensor pointers, as op (KDA's or its segment summary's
 * description) and KDA's own rules say, with the exec (bf16 on the CPU only with cpu_bf16),
 * and fills the plan (chunk = 0). */
struct ls_op;
linseq_status kda_check_problem(const char *fn, const struct ls_op *op, const linseq_kda_problem *p,
                                const linseq_exec *exec, bool cpu_bf16, kda_plan *pl);
/* A backward's rules for the grads that exist only with some options: no dg without decay,
 * no dA_log or ddt_bias without gate_in_kernel (kda_backward.c). */
linseq_status kda_check_option_grads(const char *fn, const linseq_kda_problem *p,
                                     const linseq_kda_grads *gr);

/* The saved forward of training (kda_saved.c): a header, then per item (n*HV + hv) a block at
 * offsets[item] floats after it: the states before each chunk or segment, then (chunked)
 * the item's deltas. */
#define KDA_SAVED_HEADER_BYTES 128
linseq_status kda_saved_layout(const char *fn, const kda_plan *pl, int64_t *offsets, size_t *bytes);
void kda_saved_write_header(const kda_plan *pl, void *saved);
/* The item offsets of kda_saved_layout in a new array (the caller frees it), after checking
 * that saved_bytes holds the layout. */
linseq_status kda_saved_offsets(const char *fn, const kda_plan *pl, size_t saved_bytes,
                                int64_t **offsets);
linseq_status kda_saved_check_header(const char *fn, const kda_plan *pl, const void *saved);

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

/* Rows [r0, r1) of the standalone gate's output (row = (b*T + t)*H + h, gK values each). */
LS_ISA_DECLARE(void, kda_gate_rows,
               (const linseq_kda_gate_problem *p, int64_t gK, int64_t r0, int64_t r1, float *g));

/* S [K,V] <- the stored state row (K-major or V-first), or zeros when src is NULL. */
void kda_state_load(const kda_plan *pl, const float *src, float *S);
/* The stored state row <- S [K,V]. */
void kda_state_store(const kda_plan *pl, const float *S, float *dst);

/* Recurrent mode: advances S over tokens [tok0, tok0+len) of value head hv and writes their
 * outputs (none when o is NULL), for the columns [j0, j1) of S and o only: columns are
 * independent in the recurrence, so threads may split one item's columns. scratch holds
 * kda_recurrent_scratch_floats(pl) floats: six K-rows of token factors, then (bf16) the
 * token's v row widened and its o row before rounding. */
static inline size_t kda_recurrent_scratch_floats(const kda_plan *pl)
{
    return (size_t)(6 * pl->p->K + 2 * pl->p->V + 64);
}
LS_ISA_DECLARE(void, kda_recurrent_item,
               (const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv, float *S, float *o,
                float *scratch, int64_t j0, int64_t j1));

/* Decode of one token (request tok) on a [K,V]-first state read from `from` and written to
 * `to` (the same row, or another), float32 or, with half, bf16 (widened as loaded, rounded
 * once as stored); scratch as kda_recurrent_item's. */
LS_ISA_DECLARE(void, kda_decode_rows_item,
               (const kda_plan *pl, int64_t tok, int64_t hv, const void *from, void *to, bool half,
                float *o, float *scratch));

/* The same with AVX512-BF16's rounding of the bf16 state (kda_decode_bf16_simd.c; the same
 * bits; other ISAs: the same kernel). */
LS_ISA_DECLARE(void, kda_decode_rows_item_bf16_dot,
               (const kda_plan *pl, int64_t tok, int64_t hv, const void *from, void *to, bool half,
                float *o, float *scratch));

/* Decode of one token where a V-first state row [V,K] lives (no transposed copy). */
LS_ISA_DECLARE(void, kda_decode_v_first,
               (const kda_plan *pl, int64_t tok, int64_t hv, float *ST, float *o, float *scratch));

/* Chunked mode: same contract; ws holds kda_chunk_ws_layout(pl, NULL, NULL) bytes (see
 * kda_chunk.h), 64-aligned, with pl->chunk set. save (NULL: nothing) receives the state
 * before every chunk, then the deltas of every token (the saved block of training). */
LS_ISA_DECLARE(void, kda_chunk_item,
               (const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv, float *S, float *o,
                void *ws, float *save));

/* The readable reference: the recurrence of the header comment, token by token, in double,
 * with every option applied literally. Assumes a validated problem; test-only (slow).
 * _f64 keeps the double results (finite differences need them). */
linseq_status ls_kda_reference(const linseq_kda_problem *p, float *o, float *ht);
linseq_status ls_kda_reference_f64(const linseq_kda_problem *p, double *o, double *ht);

/* The reference backward, in double, storing every state. All pointers but dh0 are required
 * (dA_log and ddt_bias only with gate_in_kernel); shapes as in linseq_kda_grads. */
typedef struct ls_kda_ref_grads {
    double *dq, *dk, *dv, *dbeta, *dg, *dh0, *dA_log, *ddt_bias;
} ls_kda_ref_grads;
linseq_status ls_kda_reference_backward(const linseq_kda_problem *p, const float *d_o,
                                        const float *d_ht, const ls_kda_ref_grads *grads);

/* Reference of the standalone gate and of its backward, in double. */
void ls_kda_gate_reference(const linseq_kda_gate_problem *p, float *g);
void ls_kda_gate_reference_f64(const linseq_kda_gate_problem *p, double *g);
void ls_kda_gate_reference_backward(const linseq_kda_gate_problem *p, const float *d_g,
                                    double *dg_raw, double *dA_log, double *ddt_bias);

#endif
