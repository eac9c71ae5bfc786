/* Internal: the state rows of a serving engine's pool as a decode step reads and writes them
 * one request at a time (the pool layer resolves linseq_state_pool into this), and the
 * conversions of a row between the pool's element type and the float32 the kernels compute
 * in. Widening is exact; narrowing rounds once to nearest even (core/half_float.h). */
#ifndef LS_CORE_STATE_ROWS_H
#define LS_CORE_STATE_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "linseq.h"

/* Request b reads row src[b] of `from` and writes row dst[b] of `to` (src[b] < 0: padding,
 * nothing read or written); rows are `stride` elements of `dtype` apart, from and to may be
 * the same pool. The pool layer hands an op these only when no request writes a row another
 * request reads, so each request's state can be advanced on its own, in any order. */
typedef struct ls_state_rows {
    const void *from;
    void *to;
    linseq_pool_dtype dtype;
    int64_t stride;
    const int64_t *src, *dst;
} ls_state_rows;

size_t ls_state_elem_bytes(linseq_pool_dtype dtype);
/* Element `at` of row r of a pool at `base` (the rows' `stride` apart). */
static inline void *ls_state_row_at(const void *base, const ls_state_rows *rows, int64_t r,
                                    int64_t at)
{
    return (unsigned char *)base +
           (size_t)(r * rows->stride + at) * ls_state_elem_bytes(rows->dtype);
}
/* n elements of `dtype` to float32, and float32 back to `dtype` rounded once. */
void ls_state_widen(linseq_pool_dtype dtype, const void *from, float *to, int64_t n);
void ls_state_narrow(linseq_pool_dtype dtype, const float *from, void *to, int64_t n);
/* True when request b's state is read and written where it lies: a float32 row that is its
 * own destination (the kernels advance it in place, no copy). */
static inline int ls_state_rows_in_place(const ls_state_rows *rows, int64_t b)
{
    return rows->dtype == LINSEQ_POOL_F32 && rows->from == rows->to && rows->src[b] == rows->dst[b];
}

#endif
