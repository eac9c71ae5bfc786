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

/* A decode call's pool: n_rows rows, each shaped as the op's decode_state input at B = 1 (the
 * pool's dims are that input's with its first replaced by n_rows), read and written. */
void ls_op_add_pool(ls_args *a, const ls_op *op, const void *p, const float *pool, int64_t n_rows);

#endif
