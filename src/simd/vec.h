/* Internal: the vector layer the hot kernels are written against, one implementation per
 * ISA (LS_ISA, see isa.h), plus the vector math built on it. Include only from sources the
 * Makefile compiles once per ISA. Every function is static inline: a kernel and its helpers
 * compile into one body per ISA.
 *
 * Vector math and its maximum errors (tests/test_simd.c measures them against double):
 *     vf_exp       cephes-style degree-5 polynomial after n ln2 range reduction, scaled by
 *                  2^n with correct over/underflow: <= 1.5 ulp (measured 1.24) on [-87, 88.7],
 *                  subnormal results to 1 ulp, 0 below -104, inf above 88.73, NaN kept.
 *     vf_log1p01   log(1 + y) for y in [0, 1] through 2 atanh(y / (2 + y)): <= 3 ulp (2.83).
 *     vf_softplus  x above LS_SOFTPLUS_THRESHOLD (20, as torch), else max(x,0) + log1p(exp(-|x|)): <= 4 ulp (3.61).
 *     vf_sigmoid   1/(1+e^-x) for x >= 0, e^x/(1+e^x) below: <= 3 ulp (2.72), no overflow.
 *     vf_silu      x / (1 + e^-x) for |x| <= 80, x sigmoid(x) beyond: <= 4 ulp (2.97).
 *     vf_rsqrt     1/sqrt(x) with an IEEE sqrt and divide: <= 1.5 ulp (1.48).
 * (ulp of the float nearest the exact value, over dense sweeps; subnormal results, which hold
 * few bits, are checked to an absolute 1e-40 instead.) */
#ifndef LS_SIMD_VEC_H
#define LS_SIMD_VEC_H

#include <stdint.h>

#include "core/activation.h"
#include "simd/isa.h"

#if LS_ISA == 2
#include "simd/vec_avx512.h"
#elif LS_ISA == 1
#include "simd/vec_avx2.h"
#else
#include "simd/vec_scalar.h"
#endif

/* vf_exp's arithmetic for x in [-104, 88.8] (or NaN): no clamp. */
static inline vf vf_exp_core(vf x)
{
    const vf n = vf_round(vf_mul(x, vf_set1(1.44269504088896341f)));
    vf r = vf_fnmadd(n, vf_set1(0.693359375f), x); /* ln 2 in two parts: r is exact */
    r = vf_fnmadd(n, vf_set1(-2.12194440e-4f), r);
    vf p = vf_set1(1.9875691500e-4f);
    p = vf_fmadd(p, r, vf_set1(1.3981999507e-3f));
    p = vf_fmadd(p, r, vf_set1(8.3334519073e-3f));
    p = vf_fmadd(p, r, vf_set1(4.1665795894e-2f));
    p = vf_fmadd(p, r, vf_set1(1.6666665459e-1f));
    p = vf_fmadd(p, r, vf_set1(5.0000001201e-1f));
    p = vf_fmadd(p, vf_mul(r, r), vf_add(r, vf_set1(1.0f)));
    return vf_ldexp(p, n);
}

static inline vf vf_exp(vf x)
{
    /* Arguments past these bounds give inf or 0 anyway; the clamp keeps n finite. */
    return vf_exp_core(vf_min(vf_set1(88.8f), vf_max(vf_set1(-104.0f), x)));
}

static inline vf vf_log1p01(vf y)
{
    /* log(1+y) = 2 atanh(s), s = y/(2+y) in [0, 1/3]: the odd series in s converges
     * geometrically (s^2 <= 1/9) and needs no exponent split or 1+y rounding fix. */
    const vf s = vf_div(y, vf_add(vf_set1(2.0f), y));
    const vf z = vf_mul(s, s);
    vf p = vf_set1(1.0f / 17.0f);
    p = vf_fmadd(p, z, vf_set1(1.0f / 15.0f));
    p = vf_fmadd(p, z, vf_set1(1.0f / 13.0f));
    p = vf_fmadd(p, z, vf_set1(1.0f / 11.0f));
    p = vf_fmadd(p, z, vf_set1(1.0f / 9.0f));
    p = vf_fmadd(p, z, vf_set1(1.0f / 7.0f));
    p = vf_fmadd(p, z, vf_set1(1.0f / 5.0f));
    p = vf_fmadd(p, z, vf_set1(1.0f / 3.0f));
    p = vf_fmadd(p, z, vf_set1(1.0f));
    return vf_mul(vf_add(s, s), p);
}

static inline vf vf_softplus(vf x)
{
    const vf smooth =
        vf_add(vf_max(vf_zero(), x), vf_log1p01(vf_exp(vf_sub(vf_zero(), vf_abs(x)))));
    return vf_select_gt(x, vf_set1(LS_SOFTPLUS_THRESHOLD), x, smooth);
}

static inline vf vf_sigmoid(vf x)
{
    const vf e = vf_exp(vf_sub(vf_zero(), vf_abs(x)));
    const vf inv = vf_div(vf_set1(1.0f), vf_add(vf_set1(1.0f), e));
    return vf_select_nonneg(x, inv, vf_mul(e, inv));
}

/* x / (1 + e^-x) where |x| <= LS_SILU_DIRECT (e^-x finite and normal, no clamp needed): 7
 * fewer operations than x sigmoid(x), which only vectors holding a larger |x|, an infinity
 * or a NaN also compute, for those lanes. Each lane's value depends on that lane alone. */
#define LS_SILU_DIRECT 80.0f
static inline vf vf_silu(vf x)
{
    const vf direct = vf_div(x, vf_add(vf_set1(1.0f), vf_exp_core(vf_sub(vf_zero(), x))));
    const vf ax = vf_abs(x), bound = vf_set1(LS_SILU_DIRECT);
    if (vf_all_le(ax, bound)) return direct;
    return vf_select_gt(ax, bound, vf_mul(x, vf_sigmoid(x)), direct);
}

static inline vf vf_rsqrt(vf x) { return vf_div(vf_set1(1.0f), vf_sqrt(x)); }

#endif
