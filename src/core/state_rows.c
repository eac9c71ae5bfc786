/* The conversions of state rows between a pool's element type and float32 (state_rows.h). */
#include <string.h>

#include "core/half_float.h"
#include "core/state_rows.h"

size_t ls_state_elem_bytes(linseq_pool_dtype dtype) { return dtype == LINSEQ_POOL_F32 ? 4 : 2; }

/* bf16 rows are widened and rounded in blocks of ROW_LANES elements, a constant trip count
 * the compiler vectorizes at -O2 (a loop over n with the dtype tested per element ran at a
 * few ns an element, most of a bf16 pool's decode step); the tail goes element by element.
 * The arithmetic is ls_bf16_to_f32's and ls_f32_to_bf16's, bit for bit. */
enum { ROW_LANES = 16 };

static void widen_bf16(const uint16_t *restrict h, float *restrict to, int64_t n)
{
    int64_t i = 0;
    for (; i + ROW_LANES <= n; i += ROW_LANES)
        for (int j = 0; j < ROW_LANES; j++) {
            const uint32_t u = (uint32_t)h[i + j] << 16;
            memcpy(&to[i + j], &u, sizeof u);
        }
    for (; i < n; i++) to[i] = ls_bf16_to_f32(h[i]);
}

static void narrow_bf16(const float *restrict from, uint16_t *restrict h, int64_t n)
{
    int64_t i = 0;
    for (; i + ROW_LANES <= n; i += ROW_LANES)
        for (int j = 0; j < ROW_LANES; j++) {
            uint32_t u;
            memcpy(&u, &from[i + j], sizeof u);
            const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
            const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            h[i + j] = (uint16_t)(nan ? (u >> 16) | 0x40u : rounded);
        }
    for (; i < n; i++) h[i] = ls_f32_to_bf16(from[i]);
}

void ls_state_widen(linseq_pool_dtype dtype, const void *from, float *to, int64_t n)
{
    if (dtype == LINSEQ_POOL_F32) {
        memcpy(to, from, (size_t)n * sizeof *to);
        return;
    }
    const uint16_t *h = from;
    if (dtype == LINSEQ_POOL_BF16) {
        widen_bf16(h, to, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) to[i] = ls_f16_to_f32(h[i]);
}

void ls_state_narrow(linseq_pool_dtype dtype, const float *from, void *to, int64_t n)
{
    if (dtype == LINSEQ_POOL_F32) {
        memcpy(to, from, (size_t)n * sizeof *from);
        return;
    }
    uint16_t *h = to;
    if (dtype == LINSEQ_POOL_BF16) {
        narrow_bf16(from, h, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) h[i] = ls_f32_to_f16(from[i]);
}
