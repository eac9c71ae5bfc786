/* A serving engine's state pool for the tests of decode over rows where they lie
 * (ls_op.decode_rows): rows a stride apart in float32, bf16 or half, random values, their
 * widened copy for the plain decode, and the check of what a step left in the pool. */
#ifndef LS_TESTS_ROWS_POOL_H
#define LS_TESTS_ROWS_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/state_rows.h"
#include "linseq.h"

typedef struct rows_pool {
    linseq_pool_dtype dtype;
    int64_t n_rows, row, stride;  /* elements of a state, and from one row to the next */
    unsigned char *data, *before; /* the pool, and a copy of it as made */
    float *dense;                 /* [n_rows, row]: the rows widened to float32 */
} rows_pool;

/* n_rows rows of `row` elements, `gap` elements of filler after each, N(0,1) values of the
 * pool's type. */
void rows_pool_make(rows_pool *p, linseq_pool_dtype dtype, int64_t n_rows, int64_t row, int64_t gap,
                    uint64_t seed);
/* The rows as the op reads them: from and to the pool itself. */
ls_state_rows rows_pool_rows(const rows_pool *p, const int64_t *src, const int64_t *dst);
/* Whether each live request b (src[b] >= 0) left new[src[b]] (the plain decode's states,
 * [n_rows, row]) rounded once to the pool's type in row dst[b], and every other byte of the
 * pool (other rows, the gaps) is as made. */
bool rows_pool_holds(const rows_pool *p, const float *new_states, const int64_t *src,
                     const int64_t *dst, int64_t B);
void rows_pool_free(rows_pool *p);

#endif
