/* The vector layer in portable C: one lane. The kernels written against vec.h compile to
 * plain loops here (and run on any CPU). Via vec.h. */
#include <math.h>

#define VW 1
typedef float vf;

static inline vf vf_load(const float *p) { return *p; }
static inline void vf_store(float *p, vf v) { *p = v; }
static inline vf vf_load_n(const float *p, int64_t n) { return n > 0 ? *p : 0.0f; }
static inline void vf_store_n(float *p, vf v, int64_t n)
{
    if (n > 0) *p = v;
}
static inline vf vf_set1(float x) { return x; }
static inline vf vf_zero(void) { return 0.0f; }
static inline vf vf_add(vf a, vf b) { return a + b; }
static inline vf vf_sub(vf a, vf b) { return a - b; }
static inline vf vf_mul(vf a, vf b) { return a * b; }
static inline vf vf_div(vf a, vf b) { return a / b; }
static inline vf vf_sqrt(vf a) { return sqrtf(a); }
/* Two roundings here: without hardware FMA, fmaf is a slow library call. */
static inline vf vf_fmadd(vf a, vf b, vf c) { return a * b + c; }
/* One lane of vf_fmadd, rounded as it is (here: twice; fused in the vector layers). */
static inline float vf_fmadd1(float a, float b, float c) { return a * b + c; }
static inline vf vf_fnmadd(vf a, vf b, vf c) { return c - a * b; }
static inline vf vf_max(vf lo, vf x) { return x != x ? x : (x > lo ? x : lo); }
static inline vf vf_min(vf hi, vf x) { return x != x ? x : (x < hi ? x : hi); }
static inline vf vf_abs(vf a) { return fabsf(a); }
/* Round to nearest even for |a| < 2^22 (vf_exp's range) without a libm call: adding and
 * removing 1.5 * 2^23 leaves no fraction bits. NaN stays NaN. */
static inline vf vf_round(vf a)
{
    const float magic = 12582912.0f;
    return (a + magic) - magic;
}

/* 2^k for integral k in [-126, 127], built from its exponent bits. */
static inline float vf_pow2i(int k)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)(k + 127) << 23};
    return v.f;
}

/* y * 2^n for integral n in [-254, 254], as two exact powers of two (like the AVX2 version),
 * so that subnormal results round once; NaN n gives NaN without an undefined conversion. */
static inline vf vf_ldexp(vf y, vf n)
{
    if (n != n) return n;
    const int ni = (int)n, n1 = ni >> 1, n2 = ni - n1;
    return y * vf_pow2i(n1) * vf_pow2i(n2);
}
static inline vf vf_select_nonneg(vf x, vf a, vf b) { return x >= 0.0f ? a : b; }
static inline vf vf_select_gt(vf x, vf t, vf a, vf b) { return x > t ? a : b; }
/* Whether every lane of x is <= t (false when one is NaN). */
static inline int vf_all_le(vf x, vf t) { return x <= t; }
static inline float vf_hsum(vf a) { return a; }
static inline vf vf_hsum_lanes(const vf *a) { return a[0]; }
static inline void vf_transpose_regs(vf r[1]) { (void)r; }
static inline void vf_transpose_block(const float *src, int64_t lds, float *dst, int64_t ldd)
{
    (void)lds;
    (void)ldd;
    dst[0] = src[0];
}
