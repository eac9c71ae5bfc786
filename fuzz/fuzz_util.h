/* Shared by the libFuzzer targets: reading the fuzzer's bytes as a stream of decisions, and
 * checking the library's contract around one call.
 *
 * Decisions come from the input's bytes while they last and are 0 after; tensor contents
 * come from the bytes too, then from a generator seeded by the input, so that short inputs
 * still give varied data and the fuzzer can steer the first values of every tensor.
 *
 * The contract checked around a call (fz_call_*): an input is never written; a call that
 * fails leaves every output byte as it was (outputs are poisoned with 0xFF first, a NaN
 * pattern); a call that succeeds on "nice" inputs (finite, moderate, within the op's stable
 * range) writes only finite values to every output it was given, which also catches an
 * output left partly unwritten. Every violation abort()s with a message. */
#ifndef LS_FUZZ_UTIL_H
#define LS_FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "linseq.h"

/* Tensors of a problem the harness allocates, in floats: keeps every exec fast. */
#define FZ_MAX_FLOATS (1 << 18)

typedef struct fz_in {
    const uint8_t *p;
    size_t n;
    uint64_t rng; /* for data once the bytes are used up */
    bool weird;   /* data may hold NaN, Inf, huge and subnormal values */
} fz_in;

void fz_init(fz_in *in, const uint8_t *data, size_t size);
uint8_t fz_u8(fz_in *in);
uint32_t fz_u32(fz_in *in);
bool fz_bit(fz_in *in);
/* 0 .. n-1 */
unsigned fz_pick(fz_in *in, unsigned n);

/* A size: mostly 1 .. cap, sometimes 0, negative, or one far beyond any buffer (so large
 * that a product of sizes overflows). The caller decides what is valid. */
int64_t fz_size(fz_in *in, int64_t cap);
/* A size that is huge enough to overflow any byte count it takes part in. */
bool fz_is_huge(int64_t v);

/* Value ranges of tensor data. */
typedef enum fz_range {
    FZ_SIGNED, /* [-4, 4] */
    FZ_NONPOS, /* [-8, 0]: log decays */
    FZ_UNIT,   /* [0, 1]: probabilities */
    FZ_NONNEG, /* [0, 4]: time steps */
    FZ_SMALL   /* [-1, 1] */
} fz_range;

/* Fills n floats; with in->weird some become NaN, +-Inf, +-1e30, subnormals or -0 (and
 * *nice turns false when one does). */
void fz_fill(fz_in *in, float *x, size_t n, fz_range r, bool *nice);

/* a * b * ... with overflow and sign checks: false when a factor is negative or the product
 * exceeds the int64 range. */
bool fz_count(int64_t *out, int n, ...);

/* The elements of the op table's tensor `name` of op `op` (an input, output or upstream
 * gradient: "x", "conv_state", "d_y") under problem p, by the shape the table gives it (the
 * one linseq.h documents): a buffer of exactly that many floats is what the library may
 * touch. -1 when a dim is negative or the count overflows int64; 0 when the tensor does not
 * exist under p's options (then the library must refuse one that is passed). */
int64_t fz_tensor_count(const char *op, const char *name, const void *p);

/* ---------------------------------------------------------------------------------- */
/* Buffers                                                                            */
/* ---------------------------------------------------------------------------------- */

/* A float buffer of exactly n floats (n may be 0: a valid pointer with no usable byte, so
 * the sanitizer flags any access). Freed by fz_free_all. */
float *fz_alloc(size_t n);
void *fz_alloc_bytes(size_t n);
float *fz_dup(const float *x, size_t n);
void fz_free_all(void);

/* ---------------------------------------------------------------------------------- */
/* One call                                                                            */
/* ---------------------------------------------------------------------------------- */

/* Starts the argument list of the next call. */
void fz_call_begin(const char *what);
/* An input: must be byte-identical after the call. NULL is ignored. */
void fz_arg_in(const void *p, size_t bytes);
/* An output: poisoned now; untouched on failure; finite (floats) on success when nice. */
void fz_arg_out(void *p, size_t bytes);
/* An output that is also read (in-place state): keeps its content; untouched on failure,
 * finite on success when nice. */
void fz_arg_inout(void *p, size_t bytes);
/* Raw bytes written by the call (the saved block): untouched on failure, never checked for
 * finiteness. */
void fz_arg_out_raw(void *p, size_t bytes);
/* The one documented exception to "a failed call writes nothing": a refusal the library
 * finds while computing (KDA's positive log decay, found in the kernels' own pass over g)
 * may leave the outputs written. Call after fz_call_begin, for a call whose inputs hold
 * such a value; a failure with status st then skips the outputs-untouched check. */
void fz_call_may_write_on_failure(linseq_status st);
/* After the call: the contract checks; must_fail: the arguments break a documented rule, so
 * LINSEQ_OK is a bug too. Returns st. */
linseq_status fz_call_end(linseq_status st, bool nice, bool must_fail);

/* abort() with a message naming the check. */
__attribute__((noreturn, format(printf, 1, 2))) void fz_die(const char *fmt, ...);

/* Bitwise equal, except that any NaN equals any NaN. */
bool fz_same(const float *a, const float *b, size_t n);
void fz_expect_same(const float *a, const float *b, size_t n, const char *what);

/* A pseudo-random but valid partition of T tokens into n sequences (cu has n + 1 entries);
 * with corrupt > 0 it is spoiled in one of several ways and the function returns true. */
bool fz_cu_seqlens(fz_in *in, int64_t *cu, int64_t n, int64_t T, unsigned corrupt);

/* An exec from the input (or NULL): mode, chunk size, threads, sometimes out of range.
 * *bad is set when a field is invalid. */
const linseq_exec *fz_exec(fz_in *in, linseq_exec *storage, bool *bad);

#endif
