/* The vector layer on AVX2 + FMA: 8 float lanes, tails through maskload. Via vec.h. */
#include <immintrin.h>

#define VW 8
typedef __m256 vf;

static inline __m256i vf_tail(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vf_load_n(const float *p, int64_t n) { return _mm256_maskload_ps(p, vf_tail(n)); }
static inline void vf_store_n(float *p, vf v, int64_t n) { _mm256_maskstore_ps(p, vf_tail(n), v); }
static inline vf vf_set1(float x) { return _mm256_set1_ps(x); }
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vf_sqrt(vf a) { return _mm256_sqrt_ps(a); }
static inline vf vf_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline float vf_fmadd1(float a, float b, float c) { return fmaf(a, b, c); }
static inline vf vf_fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline vf vf_max(vf lo, vf x) { return _mm256_max_ps(lo, x); }
static inline vf vf_min(vf hi, vf x) { return _mm256_min_ps(hi, x); }
static inline vf vf_abs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
static inline vf vf_round(vf a)
{
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* y * 2^n for integral n in [-254, 254]: two exact powers of two, so that results in the
 * subnormal range round once and overflow still gives inf. */
static inline vf vf_ldexp(vf y, vf n)
{
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const vf p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const vf p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
}
static inline vf vf_select_nonneg(vf x, vf a, vf b)
{
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ));
}
static inline vf vf_select_gt(vf x, vf t, vf a, vf b)
{
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, t, _CMP_GT_OQ));
}
/* Whether every lane of x is <= t (false when one is NaN). */
static inline int vf_all_le(vf x, vf t)
{
    return _mm256_movemask_ps(_mm256_cmp_ps(x, t, _CMP_LE_OQ)) == 0xff;
}
/* Lane i of the result = the sum of the lanes of a[i] (eight horizontal sums at once). */
static inline vf vf_hsum_lanes(const vf *v)
{
    __m256 s[4], u[2];
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++)
        s[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 16
    for (int i = 0; i < 2; i++) {
        const __m256d a = _mm256_castps_pd(s[2 * i]), b = _mm256_castps_pd(s[2 * i + 1]);
        u[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20),
                         _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

/* r[j][i] = r[i][j] for an 8 x 8 block held in registers, and dst[j][i] = src[i][j] in memory. */
static inline void vf_transpose_regs(vf r[8])
{
    __m256 t[8];
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 2; i++) {
        r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
#pragma GCC unroll 16
    for (int k = 0; k < 4; k++) {
        t[k] = _mm256_permute2f128_ps(r[k], r[4 + k], 0x20);
        t[4 + k] = _mm256_permute2f128_ps(r[k], r[4 + k], 0x31);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++) r[i] = t[i];
}

static inline void vf_transpose_block(const float *src, int64_t lds, float *dst, int64_t ldd)
{
    vf r[8];
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
    vf_transpose_regs(r);
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++) _mm256_storeu_ps(dst + i * ldd, r[i]);
}

static inline float vf_hsum(vf a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
