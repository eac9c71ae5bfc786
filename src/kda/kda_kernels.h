/* Internal: KDA's kernels of one instruction set as a table, and the entry points that take
 * the instruction set as an argument.
 *
 * An entry point resolves its ISA once per call (ls_kda_kernels) and hands the table down
 * to its work items, which call through it; the kernels themselves are compiled once per ISA
 * (the *_simd.c sources, declared in kda_internal.h, kda_chunk.h and kda_backward.h). */
#ifndef LS_KDA_KERNELS_H
#define LS_KDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kda/kda_backward.h"
#include "kda/kda_chunk.h"
#include "kda/kda_internal.h"
#include "kda/kda_segment.h"
#include "simd/isa.h"

typedef struct kda_kernels {
    ls_isa isa;
    /* forward and decode (kda_internal.h) */
    void (*recurrent_item)(const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv, float *S,
                           float *o, float *scratch, int64_t j0, int64_t j1);
    void (*decode_rows_item)(const kda_plan *pl, int64_t tok, int64_t hv, const void *from,
                             void *to, bool half, float *o, float *scratch);
    void (*decode_rows_item_bf16_dot)(const kda_plan *pl, int64_t tok, int64_t hv, const void *from,
                                      void *to, bool half, float *o, float *scratch);
    void (*decode_v_first)(const kda_plan *pl, int64_t tok, int64_t hv, float *ST, float *o,
                           float *scratch);
    void (*chunk_item)(const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv, float *S,
                       float *o, void *ws, float *save);
    /* the steps of one chunk, for threads that share an item (kda_chunk.h) */
    void (*chunk_prepare)(const kda_plan *pl, const kda_chunk_ws *w, int64_t first, int64_t Lc,
                          int64_t hv);
    void (*chunk_solve)(const kda_plan *pl, const kda_chunk_ws *w, const float *S0, int64_t first,
                        int64_t Lc, int64_t hv, int64_t j0, int64_t j1);
    void (*chunk_output)(const kda_plan *pl, const kda_chunk_ws *w, const float *S0, int64_t first,
                         int64_t Lc, int64_t hv, float *o, int64_t j0, int64_t j1);
    void (*chunk_advance)(const kda_plan *pl, const kda_chunk_ws *w, float *S, int64_t Lc,
                          int64_t j0, int64_t j1);
    /* backward (kda_backward.h) */
    size_t (*recurrent_bwd_ws_bytes)(const kda_bwd *b);
    void (*recurrent_bwd_item)(const kda_bwd *b, int64_t n, int64_t hv, int64_t tok0, int64_t len,
                               void *ws, double *item_partials);
    size_t (*chunk_bwd_ws_bytes)(const kda_bwd *b);
    void (*chunk_bwd_item)(const kda_bwd *b, int64_t n, int64_t hv, int64_t tok0, int64_t len,
                           void *ws, double *item_partials);
    void (*bwd_chain_qk)(const kda_bwd *b, int64_t tok0, int64_t len, int64_t h);
    /* the segment summary (kda_segment.h) */
    void (*segment_item)(const kda_plan *pl, int64_t tok0, int64_t len, int64_t hv, float *P,
                         float *R, void *ws);
    /* the standalone gate (kda_internal.h) */
    void (*gate_rows)(const linseq_kda_gate_problem *p, int64_t gK, int64_t r0, int64_t r1,
                      float *g);
} kda_kernels;

/* The table of isa, which must be one ls_isa_available() accepts. */
const kda_kernels *ls_kda_kernels(ls_isa isa);

/* The public entry points with the instruction set as an argument: linseq_kda_X(...) is
 * ls_kda_X_isa(..., ls_isa_active()) once LINSEQ_ISA has been checked. isa must be one
 * ls_isa_available() accepts. The tests call these to run every kernel the CPU can run, each
 * through the full validation. (The gate's backward is plain C, the same on every ISA.) */
linseq_status ls_kda_forward_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                 float *o, float *ht, ls_isa isa);
linseq_status ls_kda_forward_train_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                       float *o, float *ht, void *saved, size_t saved_bytes,
                                       ls_isa isa);
linseq_status ls_kda_decode_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                float *state, int64_t n_state_rows, const int64_t *state_rows,
                                float *o, ls_isa isa);
linseq_status ls_kda_backward_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                  const float *d_o, const float *d_ht,
                                  const linseq_kda_grads *grads, ls_isa isa);
linseq_status ls_kda_backward_saved_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                        const void *saved, size_t saved_bytes, const float *d_o,
                                        const float *d_ht, const linseq_kda_grads *grads,
                                        ls_isa isa);
linseq_status ls_kda_segment_forward_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                         float *P, float *R, ls_isa isa);
linseq_status ls_kda_segment_backward_isa(const linseq_kda_problem *problem,
                                          const linseq_exec *exec, const float *d_P,
                                          const float *d_R, const linseq_kda_grads *grads,
                                          ls_isa isa);
linseq_status ls_kda_gate_forward_isa(const linseq_kda_gate_problem *p, const linseq_exec *exec,
                                      float *g, ls_isa isa);

#endif
