/* Internal: the validation every entry point runs, driven by its op's description (optable.h).
 *
 * An entry point checks the problem (ls_op_check_problem: the struct, sizes, enum options,
 * n_seqs, the exec), then its own rules (HV % H, G | D, ...), then lists the call's tensors
 * with ls_op_add_tensors, one role at a time, plus any argument of its own (a decode pool, a
 * saved block), and validates the list once (ls_args_validate: NULLs, alignment, byte sizes,
 * aliasing). Shapes, dims texts, element types and the aliasing each output may do come from
 * the description alone, so they are written once, in the op's <op>_op.c. */
#ifndef LS_OPTABLE_CHECK_H
#define LS_OPTABLE_CHECK_H

#include "core/validate.h"
#include "optable/optable.h"

/* The op's problem without its tensors: p not NULL, every size in range (a required size
 * >= 1, any other >= 0), every enum option one of its named values, n_seqs >= 1 when the op
 * is varlen and cu_seqlens is given, then the exec (bf16 on the CPU only with cpu_bf16). */
linseq_status ls_op_check_problem(const char *fn, const ls_op *op, const void *p,
                                  const linseq_exec *exec, bool cpu_bf16);

/* cu_seqlens of a varlen op's problem, when given: n_seqs + 1 int64 entries (saturated, so
 * that an absurd n_seqs is reported as a size overflow). Part of the INPUT role below; alone
 * for a call that reads only the sizes and the offsets (the saved-block size queries). */
void ls_op_add_cu_seqlens(ls_args *a, const ls_op *op, const void *p);

/* Appends to `a` the tensors of `role` that exist under p (rank > 0), in table order:
 *   INPUT    pointers from the problem struct p; for a varlen op cu_seqlens comes first (an
 *            absurd n_seqs is then reported as its own size); a strided input is checked as
 *            the span of memory its strides reach;
 *   OUTPUT   src is an array `float *const *` of the outputs in table order; an output with
 *            alias_of may be exactly that input's buffer;
 *   UPSTREAM src is an array `const float *const *` in table order;
 *   GRAD     src is the op's grads struct.
 * Per-token tensors have token_bytes per element (ls_token_bytes), the others float32.
 * Fails (naming the strides field) only on strides that are negative or reach too far. */
linseq_status ls_op_add_tensors(ls_args *a, const ls_op *op, const void *p, ls_op_role role,
                                const void *src, size_t token_bytes);

/* The values of every bounded input (LS_VALUES_IN) that is given: each in [lo, hi], else
 * LINSEQ_ERR_INVALID_VALUE naming the input, the index and the range. Reads the tensors, so it
 * runs after ls_args_validate, on host memory (a CUDA call skips it: the op's device code
 * must then hold the contract itself). */
linseq_status ls_op_check_values(const char *fn, const ls_op *op, const void *p,
                                 const linseq_exec *exec);

/* A decode call's own arguments (op->decode's contract, optable.h), after the problem's
 * inputs: one token per request (T = 1), no decode_state input and no cu_seqlens in the
 * problem (the pool holds the states), n_rows >= 1 and, without a row map, >= B; then the row
 * map `rows` [B] (NULL: request b uses row b; negative: a padding request), the pool (n_rows
 * rows, each shaped as the decode_state input at B = 1, read and written) and the outputs
 * (out in table order, the state's own output NULL) are appended to a. After
 * ls_args_validate, ls_op_check_decode_rows checks the map's values. */
linseq_status ls_op_add_decode(ls_args *a, const ls_op *op, const void *p, float *pool,
                               int64_t n_rows, const int64_t *rows, float *const *out,
                               size_t token_bytes);
/* The same for a step over rows where a serving engine's pool holds them (ls_op.decode_rows):
 * the pool added as the span of its n_rows rows (and the destination's, where it is another
 * buffer), its indices already checked by the pool layer. */
linseq_status ls_op_add_decode_rows(ls_args *a, const ls_op *op, const void *p,
                                    const ls_state_rows *rows, int64_t n_rows, float *const *out,
                                    size_t token_bytes);
/* The size of that name under problem p (0 when the op has none). */
int64_t ls_op_size_named(const ls_op *op, const void *p, const char *name);
/* A decode step over a serving engine's pool (linseq_op_decode_pool, state_pool.c). */
linseq_status ls_op_decode_pool(const char *fn, const ls_op *op, const void *p,
                                const linseq_exec *exec, const linseq_state_pool *pool,
                                float *const *out);
/* A prefill whose sequences start from and end in the pool's rows (linseq_op_forward_pool). */
linseq_status ls_op_forward_pool(const char *fn, const ls_op *op, const void *p,
                                 const linseq_exec *exec, const linseq_state_pool *pool,
                                 const bool *has_initial_state, float *const *out);
/* A prefill over the pool that keeps each block boundary's state (state_pool_blocks.c). */
linseq_status ls_op_forward_pool_blocks(const char *fn, const ls_op *op, const void *p,
                                        const linseq_exec *exec, const linseq_state_pool *pool,
                                        const bool *has_initial_state, int64_t block_size,
                                        const void *block_rows, int64_t max_blocks,
                                        const void *computed_tokens, float *const *out);
/* Several tokens per request over the pool, each token's state kept (state_pool_tokens.c). */
linseq_status ls_op_decode_tokens_pool(const char *fn, const ls_op *op, const void *p,
                                       const linseq_exec *exec, const linseq_state_pool *pool,
                                       float *const *out);
linseq_status ls_op_check_decode_rows(const char *fn, const ls_op *op, const void *p,
                                      int64_t n_rows, const int64_t *rows);

#endif
