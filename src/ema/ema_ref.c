/* The EMA's reference (ema.h): the definition in double, one token at a time, for the tests. */
#include "ema/ema.h"

void ls_ema_ref(const linseq_ema_problem *p, double *y, double *hT)
{
    const int64_t T = p->T, D = p->D;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t d = 0; d < D; d++) {
            const double a = p->a[d];
            double s = p->h0 ? p->h0[b * D + d] : 0.0;
            for (int64_t t = 0; t < T; t++) {
                s = a * s + (1.0 - a) * p->x[(b * T + t) * D + d];
                if (y) y[(b * T + t) * D + d] = s;
            }
            if (hT) hT[b * D + d] = s;
        }
}
