/* Internal: what the pool entry points share (state_pool.c: decode and prefill over a pool;
 * state_pool_tokens.c: several tokens per request; state_pool_blocks.c: a prefill that keeps
 * the states at block boundaries). */
#ifndef LS_OPTABLE_STATE_POOL_H
#define LS_OPTABLE_STATE_POOL_H

#include "core/state_rows.h"
#include "optable/optable.h"

/* Elements of one request's state: the decode state's shape without its first (row) dim. */
int64_t ls_pool_state_elements(const ls_op *op, const void *p);
/* The pool struct itself: its pointers, enums, n_rows, the stride against `row` elements, the
 * span, alignment; CPU only. */
linseq_status ls_pool_check(const char *fn, const linseq_state_pool *pool, int64_t row,
                            const linseq_exec *exec);
/* The op's own checks of the problem's sizes and input tensors (their byte sizes too), before
 * the pool layer sizes any work by them: a negative size would make the state's size
 * negative, and a B whose tensors overflow would size the indices' work past any memory. */
linseq_status ls_pool_check_problem(const char *fn, const ls_op *op, const void *p,
                                    const linseq_exec *exec);
/* What a prefill over the pool checks first: a problem, without the initial states (they
 * come from the pool's rows), its sizes and inputs (ls_pool_check_problem), and the pool for
 * states of *row elements (set here). */
linseq_status ls_pool_check_prefill(const char *fn, const ls_op *op, const void *p,
                                    const linseq_exec *exec, const linseq_state_pool *pool,
                                    int64_t *row);
/* The work of `per` int64 indices for each of n requests must be addressable: an absurd n
 * (the op's own tensors overflow too) is refused before the product overflows. */
linseq_status ls_pool_check_index_count(const char *fn, const char *what, int64_t n, int per);
/* Entry i of an index array of the pool's index type. */
int64_t ls_pool_index_at(const linseq_state_pool *pool, const void *rows, int64_t i);
/* No row (>= 0) named twice among dst[0..n), entry k being request k / tokens (token
 * k % tokens) in the message; work holds n int64. */
linseq_status ls_pool_check_distinct(const char *fn, const int64_t *dst, int64_t n, int64_t tokens,
                                     int64_t *work);
/* The rows of each of the B requests (or sequences) as int64 (src -1: padding), checked in
 * range; dst is the row its new state goes to (-1 for padding). */
linseq_status ls_pool_read_rows(const char *fn, const linseq_state_pool *pool, int64_t B,
                                int64_t *src, int64_t *dst);
/* The float32 block of n states a prefill starts from (zeros where a sequence has no initial
 * state or is padding) into *block (the caller frees it). */
linseq_status ls_pool_gather_initial(const char *fn, const linseq_state_pool *pool, int64_t n,
                                     int64_t row, const int64_t *src, const bool *has_initial_state,
                                     float **block);
/* The forward on a copy of problem p whose initial and final states are `block`, updated in
 * place; out as the op's forward (the final state's slot ignored). */
linseq_status ls_pool_forward_from(const char *fn, const ls_op *op, const void *p,
                                   const linseq_exec *exec, float *const *out, float *block);
void *ls_pool_row(const linseq_state_pool *pool, int64_t r, int64_t stride);

#endif
