/* The EMA kernel (ema.h), compiled once per ISA: one item is one request over up to EMA_SPAN
 * channels, a vector of channels at a time, token by token. Every lane runs the same
 * arithmetic whatever its position, so decode (one token from a pool row) gives the bits of a
 * one-token forward. */
#include <string.h>

#include "ema/ema.h"
#include "simd/vec.h"

void LS_ISA_FN(ls_ema_item)(void *ctx, int64_t item, int thread)
{
    (void)thread;
    const ema_plan *pl = ctx;
    const int64_t T = pl->T, D = pl->D;
    const int64_t b = item / pl->n_blocks, d0 = item % pl->n_blocks * EMA_SPAN;
    const int64_t n = D - d0 < EMA_SPAN ? D - d0 : EMA_SPAN;
    const int64_t row = pl->rows ? pl->rows[b] : b;
    const float *x = pl->x + b * T * D + d0;
    float *y = pl->y + b * T * D + d0;
    if (row < 0) { /* padding: no state is touched */
        for (int64_t t = 0; t < T; t++) memset(y + t * D, 0, (size_t)n * sizeof(float));
        return;
    }
    const float *s0 = pl->s0 ? pl->s0 + row * D + d0 : NULL;
    float *sT = pl->sT ? pl->sT + row * D + d0 : NULL;
    for (int64_t j = 0; j < n; j += VW) {
        const int64_t m = n - j < VW ? n - j : VW; /* lanes of this vector */
        const vf a = vf_load_n(pl->a + d0 + j, m);
        const vf one_minus_a = vf_sub(vf_set1(1.0f), a);
        vf s = s0 ? vf_load_n(s0 + j, m) : vf_zero();
        for (int64_t t = 0; t < T; t++) {
            s = vf_fmadd(a, s, vf_mul(one_minus_a, vf_load_n(x + t * D + j, m)));
            vf_store_n(y + t * D + j, s, m);
        }
        if (sT) vf_store_n(sT + j, s, m); /* after s0 was read: sT may be s0 */
    }
}
