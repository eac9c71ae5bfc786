/* The pool of the decode-over-rows tests (rows_pool.h). */
#include "rows_pool.h"

#include <stdlib.h>
#include <string.h>

#include "core/half_float.h"
#include "testutil.h"

static float widen(linseq_pool_dtype dtype, const void *data, int64_t i)
{
    if (dtype == LINSEQ_POOL_F32) return ((const float *)data)[i];
    const uint16_t h = ((const uint16_t *)data)[i];
    return dtype == LINSEQ_POOL_BF16 ? ls_bf16_to_f32(h) : ls_f16_to_f32(h);
}

/* x rounded once to the pool's type, written at element i. */
static void put(linseq_pool_dtype dtype, void *data, int64_t i, float x)
{
    if (dtype == LINSEQ_POOL_F32)
        ((float *)data)[i] = x;
    else
        ((uint16_t *)data)[i] = dtype == LINSEQ_POOL_BF16 ? ls_f32_to_bf16(x) : ls_f32_to_f16(x);
}

void rows_pool_make(rows_pool *p, linseq_pool_dtype dtype, int64_t n_rows, int64_t row, int64_t gap,
                    uint64_t seed)
{
    *p = (rows_pool){.dtype = dtype, .n_rows = n_rows, .row = row, .stride = row + gap};
    const size_t n = (size_t)(n_rows * p->stride), elem = ls_state_elem_bytes(dtype);
    p->data = malloc(n * elem), p->before = malloc(n * elem);
    p->dense = tu_alloc((size_t)(n_rows * row));
    tu_rng r = {seed};
    for (size_t i = 0; i < n; i++) put(dtype, p->data, (int64_t)i, (float)tu_normal(&r));
    memcpy(p->before, p->data, n * elem);
    for (int64_t q = 0; q < n_rows; q++)
        for (int64_t i = 0; i < row; i++)
            p->dense[q * row + i] = widen(dtype, p->data, q * p->stride + i);
}

ls_state_rows rows_pool_rows(const rows_pool *p, const int64_t *src, const int64_t *dst)
{
    return (ls_state_rows){.from = p->data,
                           .to = p->data,
                           .dtype = p->dtype,
                           .stride = p->stride,
                           .src = src,
                           .dst = dst};
}

bool rows_pool_holds(const rows_pool *p, const float *new_states, const int64_t *src,
                     const int64_t *dst, int64_t B)
{
    const size_t elem = ls_state_elem_bytes(p->dtype);
    unsigned char *want = malloc((size_t)(p->n_rows * p->stride) * elem);
    memcpy(want, p->before, (size_t)(p->n_rows * p->stride) * elem);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; src[b] >= 0 && i < p->row; i++)
            put(p->dtype, want, dst[b] * p->stride + i, new_states[src[b] * p->row + i]);
    const bool same = memcmp(want, p->data, (size_t)(p->n_rows * p->stride) * elem) == 0;
    free(want);
    return same;
}

void rows_pool_free(rows_pool *p) { free(p->data), free(p->before), free(p->dense); }
