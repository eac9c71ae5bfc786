/* A tiny test harness: checks that count failures, a deterministic RNG, error metrics. */
#ifndef LS_TESTUTIL_H
#define LS_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "linseq.h"

extern int tu_failures;
extern int tu_checks;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        tu_checks++;                                                                               \
        if (!(cond)) {                                                                             \
            tu_failures++;                                                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* Checks status == LINSEQ_OK and prints the library's message otherwise. */
#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        linseq_status st_ = (expr);                                                                \
        CHECK(st_ == LINSEQ_OK, "%s -> %s (%s)", #expr, linseq_status_string(st_),                 \
              linseq_last_error());                                                                \
    } while (0)

/* A call that fails with status st and a message that contains `name`. */
#define CHECK_FAILS(expr, st, name)                                                                \
    do {                                                                                           \
        const linseq_status got_ = (expr);                                                         \
        CHECK(got_ == (st) && strstr(linseq_last_error(), name),                                   \
              "%s -> %s (%s); expected %s naming '%s'", #expr, linseq_status_string(got_),         \
              linseq_last_error(), linseq_status_string(st), name);                                \
    } while (0)

/* Prints a summary line and returns the process exit code. */
int tu_finish(const char *suite);

/* Checks counted by part of a test (one ISA's share), to report each part on its own line:
 * tu_tally_add adds the checks made since `since` (a tu_mark_now()) to *tally. */
typedef struct {
    int checks, failures;
} tu_mark;
tu_mark tu_mark_now(void);
void tu_tally_add(tu_mark *tally, tu_mark since);
/* "<label>: N checks ok" or "<label>: M of N checks FAILED", then ", <detail>" unless detail
 * is NULL. */
void tu_report(const char *label, tu_mark tally, const char *detail);

/* Deterministic xoshiro-style generator. */
typedef struct {
    uint64_t s;
} tu_rng;
uint64_t tu_next(tu_rng *r);
double tu_uniform(tu_rng *r, double lo, double hi);
double tu_normal(tu_rng *r);
void tu_fill_normal(tu_rng *r, float *x, size_t n, double sd);
void tu_fill_uniform(tu_rng *r, float *x, size_t n, double lo, double hi);

/* Allocation that aborts the test on failure (zeroed). */
float *tu_alloc(size_t n);

/* max|a-b| / max|ref| (max|a-b| when ref is all zero); NaN/Inf in a gives +inf. */
double tu_rel_err(const float *a, const float *ref, size_t n);
/* Same with a double-precision reference. */
double tu_rel_err_d(const float *a, const double *ref, size_t n);

/* Bitwise equality of n floats (true for n == 0). */
bool tu_same_bits(const float *a, const float *b, size_t n);

/* An output buffer that starts as garbage, so that a region a kernel never writes cannot
 * match a zero-initialised baseline by accident. */
float *tu_alloc_poisoned(size_t n);

/* Tokens [t0, t0+len) of every batch row: [B,T,width] -> out [B,len,width]. */
void tu_slice_tokens(const float *src, int64_t B, int64_t T, int64_t width, int64_t t0, int64_t len,
                     float *out);
/* The inverse: [B,len,width] -> tokens [t0, t0+len) of dst [B,T,width]. */
void tu_place_tokens(const float *src, int64_t B, int64_t T, int64_t width, int64_t t0, int64_t len,
                     float *dst);

/* n blocks of [D][L] floats (the default conv state and weight layout) into dst in the layout
 * tap_major names, [n][L][D] (a copy when false), or from that layout back with back = true. */
void tu_tap_layout(float *dst, const float *src, int64_t n, int64_t D, int64_t L, bool tap_major,
                   bool back);

/* Fills with a byte pattern and checks it is intact (poisoned outputs on error). */
void tu_poison(void *p, size_t bytes);
bool tu_is_poisoned(const void *p, size_t bytes);

#endif
