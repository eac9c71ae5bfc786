/* Internal: one token of the SSD recurrence on a state in mamba's [P,N] layout (ssd_simd.c's
 * recurrent and decode kernels, and ssd_decode_bf16_simd.c's bf16 rows rounded by
 * AVX512-BF16's instruction). Include after ssd/ssd_kernel.h; define SSD_STORE_BF16 first for
 * another bf16 store of a whole vector. */
#ifndef LS_SSD_PN_TOKEN_H
#define LS_SSD_PN_TOKEN_H

#include <math.h>

#include "ssd/ssd_kernel.h"

#ifndef SSD_STORE_BF16
#define SSD_STORE_BF16 vf_store_bf16
#endif

/* One token t of the recurrence on S [P,N], read from `from` and written to `to` (the same
 * state, or a bfloat16 pool's row in place or moved): row p takes e S_p + (d x_p) B, and
 * y_p = C . S_p, the sum over n in vector lanes, then across them. A bfloat16 row is widened
 * as loaded and rounded once as stored, y taken from the float32 values: the bits of the
 * float32 step on the widened row, rounded after it (whole vectors by SSD_STORE_BF16: the
 * integer rounding, or the same bits by AVX512-BF16's instruction, ssd_decode_bf16_simd.c).
 * Always inlined, so that each caller's constant bf16 leaves no branch in the loop. */
static inline __attribute__((always_inline)) void pn_token(const ssd_plan *pl, const ssd_item *it,
                                                           int64_t t, const void *from, void *to,
                                                           bool bf16, float *ys)
{
    const int64_t P = pl->P, N = pl->N;
    const float d = step_dt(pl, it, t);
    const vf e = vf_set1(expf(d * pl->A[it->h]));
    const float *x = pl->x + at_hp(pl, it, t);
    const float *Bt = pl->Bp + at_gn(pl, it, t), *Ct = pl->Cp + at_gn(pl, it, t);
    for (int64_t p = 0; p < P; p++) {
        const vf u = vf_set1(d * x[p]);
        vf acc = vf_zero();
        for (int64_t n = 0, i = p * N; n < N; n += VW, i += VW) {
            const int64_t m = N - n < VW ? N - n : VW;
            const vf s = bf16 ? vf_load_bf16_n((const uint16_t *)from + i, m)
                              : vf_load_n((const float *)from + i, m);
            const vf v = vf_fmadd(e, s, vf_mul(vf_load_n(Bt + n, m), u));
            if (bf16 && m == VW)
                SSD_STORE_BF16((uint16_t *)to + i, v);
            else if (bf16)
                vf_store_bf16_n((uint16_t *)to + i, v, m);
            else
                vf_store_n((float *)to + i, v, m);
            acc = vf_fmadd(vf_load_n(Ct + n, m), v, acc);
        }
        ys[p] = vf_hsum(acc);
    }
    if (pl->y) finish_token(pl, it, t, ys);
}

#endif
