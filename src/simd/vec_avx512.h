/* The vector layer on AVX-512: 16 float lanes, masked tails. Included through vec.h. */
#include <immintrin.h>

#define VW 16
typedef __m512 vf;
typedef __mmask16 vmask;

static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vmask vf_tail(int64_t n) { return (vmask)((1u << n) - 1u); }
static inline vf vf_load_n(const float *p, int64_t n)
{
    return _mm512_maskz_loadu_ps(vf_tail(n), p);
}
static inline void vf_store_n(float *p, vf v, int64_t n)
{
    _mm512_mask_storeu_ps(p, vf_tail(n), v);
}
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_sqrt(vf a) { return _mm512_sqrt_ps(a); }
/* a * b + c and c - a * b, one rounding */
static inline vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vf_fmadd1(float a, float b, float c) { return fmaf(a, b, c); }
static inline vf vf_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
/* NaN in x passes through: when an operand is NaN these return the second one */
static inline vf vf_max(vf lo, vf x) { return _mm512_max_ps(lo, x); }
static inline vf vf_min(vf hi, vf x) { return _mm512_min_ps(hi, x); }
static inline vf vf_abs(vf a) { return _mm512_abs_ps(a); }
static inline vf vf_round(vf a)
{
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* y * 2^n for integral n; over- and underflow round like a multiplication */
static inline vf vf_ldexp(vf y, vf n) { return _mm512_scalef_ps(y, n); }
/* x >= 0 ? a : b, and x > t ? a : b (false for NaN x) */
static inline vf vf_select_nonneg(vf x, vf a, vf b)
{
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ), b, a);
}
static inline vf vf_select_gt(vf x, vf t, vf a, vf b)
{
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, t, _CMP_GT_OQ), b, a);
}
/* Whether every lane of x is <= t (false when one is NaN). */
static inline int vf_all_le(vf x, vf t) { return _mm512_cmp_ps_mask(x, t, _CMP_LE_OQ) == 0xffff; }
/* r[j][i] = r[i][j] for a 16 x 16 block held in registers: unpack pairs, then quadruples,
 * then 128-bit quarters twice; vf_transpose_block does the same from memory to memory. */
static inline void vf_transpose_regs(vf r[16])
{
    __m512 t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
/* r[4g + k] now holds, in each 128-bit quarter q, column 4q + k of rows 4g .. 4g+3 */
#pragma GCC unroll 16
    for (int k = 0; k < 4; k++) {
        const __m512 a = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88); /* quarters 0,2 | 0,2 */
        const __m512 b = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xDD); /* quarters 1,3 | 1,3 */
        const __m512 c = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
        const __m512 d = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xDD);
        t[k] = _mm512_shuffle_f32x4(a, c, 0x88);      /* column k */
        t[8 + k] = _mm512_shuffle_f32x4(a, c, 0xDD);  /* column 8 + k */
        t[4 + k] = _mm512_shuffle_f32x4(b, d, 0x88);  /* column 4 + k */
        t[12 + k] = _mm512_shuffle_f32x4(b, d, 0xDD); /* column 12 + k */
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

static inline void vf_transpose_block(const float *src, int64_t lds, float *dst, int64_t ldd)
{
    vf r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * lds);
    vf_transpose_regs(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ldd, r[i]);
}

/* A fixed pairwise order, the same on every call. */
static inline float vf_hsum(vf a) { return _mm512_reduce_add_ps(a); }

/* Lane i of the result = the sum of the lanes of a[i]: sixteen horizontal sums at the cost of
 * about two, by adding halves of register pairs (a transpose fused with the additions). */
static inline vf vf_hsum_lanes(const vf *v)
{
    __m512 s[8], u[4];
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++)
        s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
/* u[i], 128-bit lane L: the sums over that lane of v[4i .. 4i+3] */
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(s[2 * i]), b = _mm512_castps_pd(s[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88),
                                    _mm512_shuffle_f32x4(u[0], u[1], 0xdd));
    const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88),
                                    _mm512_shuffle_f32x4(u[2], u[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xdd));
}
