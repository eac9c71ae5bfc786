/* The standalone KDA gate's rows, compiled once per ISA: the same kda_gate_row the kernels
 * apply in kernel, so the two agree bit for bit. */
#include "kda/kda_simd.h"

/* Rows [r0, r1) of g, row = (b*T + t)*H + h, gK values each. */
void LS_ISA_FN(kda_gate_rows)(const linseq_kda_gate_problem *p, int64_t gK, int64_t r0, int64_t r1,
                              float *g)
{
    for (int64_t row = r0; row < r1; row++) {
        const int64_t h = row % p->H;
        kda_gate_row(gK, p->g_raw + row * gK, p->dt_bias ? p->dt_bias + h * gK : NULL,
                     p->A_log ? p->A_log[h] : 0.0f, p->lower_bound, g + row * gK);
    }
}
