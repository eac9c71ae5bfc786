/* Internal: argument validation shared by every entry point.
 *
 * An entry point lists its tensor arguments (name, dims text, shape, pointer, role) in an
 * ls_args, then ls_args_validate() checks, in this order, that every required pointer is
 * non-NULL and aligned for its element type, that no byte size overflows, and that no output
 * overlaps an input or another output (except an output explicitly allowed to be the same
 * pointer as one input). The first failure is recorded with a message naming the argument
 * and its expected shape. */
#ifndef LS_CORE_VALIDATE_H
#define LS_CORE_VALIDATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "linseq.h"

#define LS_MAX_DIMS 5
#define LS_MAX_ARGS 32

typedef enum { LS_IN = 0, LS_OUT = 1 } ls_role;

typedef struct ls_tensor {
    const char *name; /* argument name as the caller knows it: "q", "h0" */
    const char *dims; /* "B,T,H,K" */
    int ndim;
    int64_t shape[LS_MAX_DIMS];
    size_t elem_size;
    size_t align; /* the pointer's required alignment; elem_size by default */
    const void *ptr;
    bool required;
    ls_role role;
    const void *may_alias; /* output only: the input pointer it may equal exactly */
    size_t bytes;          /* filled by ls_args_validate */
} ls_tensor;

typedef struct ls_args {
    const char *fn;
    int n;
    bool overflow; /* more than LS_MAX_ARGS were added: a bug, reported by validate */
    ls_tensor t[LS_MAX_ARGS];
} ls_args;

/* Adds a tensor argument; shape values follow ndim. Returns the entry. */
ls_tensor *ls_arg(ls_args *a, const char *name, const char *dims, const void *ptr, bool required,
                  ls_role role, size_t elem_size, int ndim, ...);

/* A strided input, added as the span of elements its strides reach (so that the aliasing
 * check sees every byte a kernel may read): n_axes sizes in the order of linseq_strides
 * (batch, token, channel[, state]; 3 = no state axis). Checks that every stride is >= 0,
 * that s.state is 0 without a state axis, and that the span fits in ptrdiff_t; failures name
 * strides_name. All-zero strides are the caller's business (they mean "dense"). */
linseq_status ls_arg_strided(ls_args *a, const char *name, const char *strides_name,
                             const void *ptr, bool required, linseq_strides s, size_t elem,
                             int n_axes, const int64_t *sizes);

/* The call's structs (problem; grads and exec where not NULL) as inputs of their own size: an
 * output that overlaps one is refused like an output over a tensor, since the kernels read
 * the structs' fields while they write the outputs. */
void ls_arg_structs(ls_args *a, const void *problem, size_t problem_bytes, const void *grads,
                    size_t grads_bytes, const linseq_exec *exec);

/* Null pointers, alignment, byte-size overflow, aliasing. Returns the first failure. */
linseq_status ls_args_validate(ls_args *a);

/* "[B,T,H,K] = [2,64,4,128]" */
void ls_shape_text(const ls_tensor *t, char *buf, size_t n);

/* size < min -> LINSEQ_ERR_INVALID_SIZE naming the size. */
linseq_status ls_check_min(const char *fn, const char *name, int64_t value, int64_t min);

/* exec (may be NULL): mode, chunk size, thread count, device and dtype. On the CPU,
 * LINSEQ_DTYPE_BF16 is refused (naming fn and the dtype) unless through ls_check_exec_bf16,
 * which the entry points whose CPU kernels read and write bf16 per-token tensors call. */
linseq_status ls_check_exec(const char *fn, const linseq_exec *exec);
linseq_status ls_check_exec_bf16(const char *fn, const linseq_exec *exec);

/* Offsets of n_seqs packed sequences in a time axis of T tokens (B must be 1). */
linseq_status ls_check_cu_seqlens(const char *fn, const int64_t *cu, int64_t n_seqs, int64_t B,
                                  int64_t T);

/* A decode call's map from requests to pool rows: every row < n_state_rows (negative = a
 * padding request) and no row named twice. */
linseq_status ls_check_state_rows(const char *fn, const int64_t *rows, int64_t B,
                                  int64_t n_state_rows);

/* The longest of the packed sequences (T without cu_seqlens); cu_seqlens already checked. */
int64_t ls_longest_sequence(const int64_t *cu_seqlens, int64_t n_seqs, int64_t T);

/* A 64-bit hash of the sequence lengths, in order: those of cu_seqlens (already checked), or B
 * sequences of T tokens without it. A saved training block records it, so that a backward
 * given other sequence boundaries of the same total is refused, not answered wrongly. */
uint64_t ls_seqlens_fingerprint(const int64_t *cu_seqlens, int64_t n_seqs, int64_t B, int64_t T);

/* Exact product of non-negative sizes, false if it exceeds PTRDIFF_MAX. */
bool ls_mul_ok(int64_t *out, int n, ...);

/* a * b for a shape entry built before validation (dt_bias [HV*K]): saturates at INT64_MAX
 * instead of overflowing, so that ls_args_validate reports the tensor as too large rather
 * than the product being undefined behaviour. a and b are sizes already checked >= 0. */
int64_t ls_mul_sat(int64_t a, int64_t b);

/* The thread count a call will use, capped at max_items and never below 1: exec->threads
 * when the caller sets it (> 0); otherwise the global setting, further capped at one thread
 * per LS_MIN_WORK_PER_THREAD of work (an estimate in flop-equivalents), because waking and
 * joining a team costs tens of microseconds, more than a small decode step takes, and far
 * more when another process holds a core. */
#define LS_MIN_WORK_PER_THREAD 262144.0
/* The most threads one call uses, whatever exec->threads or linseq_set_num_threads ask: the
 * pool's workers each hold a stack, and a call's bookkeeping has one slot per thread (on the
 * caller's stack); results do not depend on the count anyway. */
#define LS_MAX_THREADS 1024
int ls_resolve_threads(const linseq_exec *exec, int64_t max_items, double work);

#endif
