/* The peak-measuring kernels of peak.h; compiled once per ISA. */
#include "simd/peak.h"

#include "simd/vec.h"

/* Enough independent chains to cover the FMA latency times the FMA ports (Zen 4/5 and recent
 * Intel: 4 cycles x 2 ports = 8 in flight) with margin, while leaving registers for mul and
 * add: 16 of AVX-512's 32 registers, 12 of the 16 that AVX2 and SSE have. */
#if VW >= 16
#define CHAINS 16
#else
#define CHAINS 12
#endif

/* Written out by hand rather than as an array, so that no compiler is tempted to keep the
 * accumulators in memory. */
#define STEP4(i0, i1, i2, i3)                                                                      \
    a##i0 = vf_fmadd(a##i0, m, c);                                                                 \
    a##i1 = vf_fmadd(a##i1, m, c);                                                                 \
    a##i2 = vf_fmadd(a##i2, m, c);                                                                 \
    a##i3 = vf_fmadd(a##i3, m, c)

/* The result lands here, so the chains are live and cannot be removed or folded. */
static volatile float sink;

double LS_ISA_FN(ls_peak_fma)(int64_t iters, float mul, float add)
{
    const vf m = vf_set1(mul), c = vf_set1(add);
    /* Distinct starting values: identical chains could be merged into one. */
    vf a0 = vf_set1(0.10f), a1 = vf_set1(0.11f), a2 = vf_set1(0.12f), a3 = vf_set1(0.13f);
    vf a4 = vf_set1(0.14f), a5 = vf_set1(0.15f), a6 = vf_set1(0.16f), a7 = vf_set1(0.17f);
    vf a8 = vf_set1(0.18f), a9 = vf_set1(0.19f), a10 = vf_set1(0.20f), a11 = vf_set1(0.21f);
#if CHAINS == 16
    vf a12 = vf_set1(0.22f), a13 = vf_set1(0.23f), a14 = vf_set1(0.24f), a15 = vf_set1(0.25f);
#endif
    for (int64_t i = 0; i < iters; i++) {
        /* Two rounds per iteration keep the loop counter's share of the issue slots small. */
        for (int r = 0; r < 2; r++) {
            STEP4(0, 1, 2, 3);
            STEP4(4, 5, 6, 7);
            STEP4(8, 9, 10, 11);
#if CHAINS == 16
            STEP4(12, 13, 14, 15);
#endif
        }
    }
    vf s = vf_add(vf_add(vf_add(a0, a1), vf_add(a2, a3)), vf_add(vf_add(a4, a5), vf_add(a6, a7)));
    s = vf_add(s, vf_add(vf_add(a8, a9), vf_add(a10, a11)));
#if CHAINS == 16
    s = vf_add(s, vf_add(vf_add(a12, a13), vf_add(a14, a15)));
#endif
    sink = vf_hsum(s);
    return (double)iters * 2.0 * CHAINS * VW * 2.0;
}

void LS_ISA_FN(ls_peak_triad)(int64_t n, float *a, const float *b, const float *c, float s)
{
    const vf vs = vf_set1(s);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vf_store(a + i, vf_fmadd(vf_load(c + i), vs, vf_load(b + i)));
    if (i < n)
        vf_store_n(a + i, vf_fmadd(vf_load_n(c + i, n - i), vs, vf_load_n(b + i, n - i)), n - i);
}
