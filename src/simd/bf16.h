/* Internal: bfloat16 storage for the *_simd.c kernels (include after vec.h): loads that widen
 * bf16 to float32 and stores that round float32 to bf16, one small implementation per ISA.
 *
 * A bf16 is the upper half of a float32, so widening is exact (the 16 bits shifted up). A
 * store rounds once, to nearest even; a NaN stays a NaN (quieted, sign kept) and subnormals
 * are rounded like any other value. The rounding is integer arithmetic on every ISA, not
 * AVX512-BF16's vcvtneps2bf16, which flushes subnormal inputs to zero: every ISA then gives
 * the same bits as ls_f32_to_bf16.
 *
 * Besides those, vbf holds VW bf16 values as their stored bits, for data that moves from one
 * bf16 row to another without arithmetic: vbf_load, vbf_load_n (n lanes, the others zero),
 * vbf_widen (to float32, exact), vbf_store, vbf_store_n, and vbf_rounded, the bits
 * vf_store_bf16 writes for vbf_widen(h): h itself (the widened value is exact and rounds to
 * itself) but for a NaN, quieted as the rounding quiets it. Moving bits this way gives what
 * widening and rounding give, in 4 integer operations instead of about 10. */
#ifndef LS_SIMD_BF16_H
#define LS_SIMD_BF16_H

#include <stdint.h>
#include <string.h>

#include "core/half_float.h"
#include "simd/vec.h"

#if LS_ISA == 2

static inline vf vf_load_bf16(const uint16_t *p)
{
    const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline vf vf_load_bf16_n(const uint16_t *p, int64_t n)
{
    const __m256i h = _mm256_maskz_loadu_epi16(vf_tail(n), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
/* The bf16 bits of each lane in the low half of its 32 bits (ls_f32_to_bf16's arithmetic). */
static inline __m512i bf16_round_lanes(vf x)
{
    const __m512i u = _mm512_castps_si512(x), hi = _mm512_srli_epi32(u, 16);
    const __m512i bias =
        _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
}
static inline void vf_store_bf16(uint16_t *p, vf x)
{
    _mm256_storeu_si256((__m256i *)(void *)p, _mm512_cvtepi32_epi16(bf16_round_lanes(x)));
}
static inline void vf_store_bf16_n(uint16_t *p, vf x, int64_t n)
{
    _mm512_mask_cvtepi32_storeu_epi16(p, vf_tail(n), bf16_round_lanes(x));
}

typedef __m256i vbf;
static inline vbf vbf_load(const uint16_t *p)
{
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}
static inline vbf vbf_load_n(const uint16_t *p, int64_t n)
{
    return _mm256_maskz_loadu_epi16(vf_tail(n), p);
}
static inline vf vbf_widen(vbf h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline void vbf_store(uint16_t *p, vbf h) { _mm256_storeu_si256((__m256i *)(void *)p, h); }
static inline void vbf_store_n(uint16_t *p, vbf h, int64_t n)
{
    _mm256_mask_storeu_epi16(p, vf_tail(n), h);
}
static inline vbf vbf_rounded(vbf h)
{
    const __m256i magnitude = _mm256_and_si256(h, _mm256_set1_epi16(0x7fff));
    const __m256i nan = _mm256_cmpgt_epi16(magnitude, _mm256_set1_epi16(0x7f80));
    return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x40)));
}

#define LS_HAVE_BF16_PAIR 1
/* 32 bf16 as two vectors of their even and odd elements (lane m: element 2m, 2m + 1): one
 * operation a vector, where widening in order takes two (a lane-crossing zero extension, then
 * a shift). A kernel whose lanes are independent columns computes in this order as well as in
 * any other, and puts its few per-column vectors (v, o) through a permutation instead. */
static inline void vf_load_bf16_pair(const uint16_t *p, vf *even, vf *odd)
{
    const __m512i w = _mm512_loadu_si512(p);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u)));
}
/* Each lane's bf16 bits (bf16_round_lanes's arithmetic) in the upper half of its 32 bits, the
 * lower half garbage. */
static inline __m512i bf16_round_lanes_high(vf x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(rounded, nan, u, _mm512_set1_epi32(0x400000));
}
/* The inverse of vf_load_bf16_pair, each lane rounded once as vf_store_bf16 rounds it. */
static inline void vf_store_bf16_pair(uint16_t *p, vf even, vf odd)
{
    const __m512i lo = _mm512_srli_epi32(bf16_round_lanes_high(even), 16);
    const __m512i hi = bf16_round_lanes_high(odd);
    /* 0xea: (hi & mask) | lo */
    _mm512_storeu_si512(
        p, _mm512_ternarylogic_epi32(hi, _mm512_set1_epi32((int)0xffff0000u), lo, 0xea));
}
/* Float32 columns [0, 32) at p as vf_load_bf16_pair orders them, and back. */
static inline void vf_load_pair(const float *p, vf *even, vf *odd)
{
    const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    const vf a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + VW);
    *even = _mm512_permutex2var_ps(a, ie, b);
    *odd = _mm512_permutex2var_ps(a, io, b);
}
static inline void vf_store_pair(float *p, vf even, vf odd)
{
    /* column c of each half: lane c / 2 of even (c even) or of odd (index + 16) */
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    _mm512_storeu_ps(p, _mm512_permutex2var_ps(even, lo, odd));
    _mm512_storeu_ps(p + VW, _mm512_permutex2var_ps(even, hi, odd));
}

#elif LS_ISA == 1

static inline vf vf_load_bf16(const uint16_t *p)
{
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
/* AVX2 has no 16-bit masked load: the tail goes through a zeroed copy. */
static inline vf vf_load_bf16_n(const uint16_t *p, int64_t n)
{
    uint16_t tail[8] = {0};
    memcpy(tail, p, (size_t)n * sizeof *p);
    return vf_load_bf16(tail);
}
/* The bf16 bits of each lane in the low half of its 32 bits (ls_f32_to_bf16's arithmetic). */
static inline __m256i bf16_round_lanes32(vf x)
{
    const __m256i u = _mm256_castps_si256(x), hi = _mm256_srli_epi32(u, 16);
    const __m256i bias =
        _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    return _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan));
}
/* The same packed to 16 bits a lane. */
static inline __m128i bf16_round_lanes(vf x)
{
    const __m256i bits = bf16_round_lanes32(x);
    /* every lane is <= 0xffff, so the unsigned saturating pack keeps it as it is */
    return _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
}
static inline void vf_store_bf16(uint16_t *p, vf x)
{
    _mm_storeu_si128((__m128i *)(void *)p, bf16_round_lanes(x));
}
static inline void vf_store_bf16_n(uint16_t *p, vf x, int64_t n)
{
    uint16_t tail[8];
    _mm_storeu_si128((__m128i *)(void *)tail, bf16_round_lanes(x));
    memcpy(p, tail, (size_t)n * sizeof *p);
}

typedef __m128i vbf;
static inline vbf vbf_load(const uint16_t *p)
{
    return _mm_loadu_si128((const __m128i *)(const void *)p);
}
static inline vbf vbf_load_n(const uint16_t *p, int64_t n)
{
    uint16_t tail[8] = {0};
    memcpy(tail, p, (size_t)n * sizeof *p);
    return vbf_load(tail);
}
static inline vf vbf_widen(vbf h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline void vbf_store(uint16_t *p, vbf h) { _mm_storeu_si128((__m128i *)(void *)p, h); }
static inline void vbf_store_n(uint16_t *p, vbf h, int64_t n)
{
    uint16_t tail[8];
    vbf_store(tail, h);
    memcpy(p, tail, (size_t)n * sizeof *p);
}
static inline vbf vbf_rounded(vbf h)
{
    const __m128i magnitude = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
    const __m128i nan = _mm_cmpgt_epi16(magnitude, _mm_set1_epi16(0x7f80));
    return _mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x40)));
}

#define LS_HAVE_BF16_PAIR 1
/* The AVX-512 section's pair forms on 16 bf16 (lane m: element 2m, 2m + 1). */
static inline void vf_load_bf16_pair(const uint16_t *p, vf *even, vf *odd)
{
    const __m256i w = _mm256_loadu_si256((const __m256i *)(const void *)p);
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u)));
}
/* Each lane's bf16 bits in the upper half of its 32 bits, the lower half garbage. */
static inline __m256i bf16_round_lanes_high(vf x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    return _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan));
}
static inline void vf_store_bf16_pair(uint16_t *p, vf even, vf odd)
{
    const __m256i lo = _mm256_srli_epi32(bf16_round_lanes_high(even), 16);
    /* 0xaa: the odd words (each lane's upper half) from odd's rounding */
    const __m256i w = _mm256_blend_epi16(lo, bf16_round_lanes_high(odd), 0xaa);
    _mm256_storeu_si256((__m256i *)(void *)p, w);
}
/* Float32 columns [0, 16) at p as vf_load_bf16_pair orders them, and back. */
static inline void vf_load_pair(const float *p, vf *even, vf *odd)
{
    const vf a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + VW);
    /* per 128-bit half: a0 a2 b0 b2 | a4 a6 b4 b6; the middle 64-bit pairs swapped */
    *even = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), 0xd8));
    *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), 0xd8));
}
static inline void vf_store_pair(float *p, vf even, vf odd)
{
    /* e0 o0 e1 o1 | e4 o4 e5 o5 and e2 o2 e3 o3 | e6 o6 e7 o7 */
    const vf lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
    _mm256_storeu_ps(p, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(p + VW, _mm256_permute2f128_ps(lo, hi, 0x31));
}

#else

#define LS_HAVE_BF16_PAIR 0 /* one lane: no order to gain from */

static inline vf vf_load_bf16(const uint16_t *p) { return ls_bf16_to_f32(*p); }
static inline vf vf_load_bf16_n(const uint16_t *p, int64_t n)
{
    return n > 0 ? ls_bf16_to_f32(*p) : 0.0f;
}
static inline void vf_store_bf16(uint16_t *p, vf x) { *p = ls_f32_to_bf16(x); }
static inline void vf_store_bf16_n(uint16_t *p, vf x, int64_t n)
{
    if (n > 0) *p = ls_f32_to_bf16(x);
}

typedef uint16_t vbf;
static inline vbf vbf_load(const uint16_t *p) { return *p; }
static inline vbf vbf_load_n(const uint16_t *p, int64_t n) { return n > 0 ? *p : 0; }
static inline vf vbf_widen(vbf h) { return ls_bf16_to_f32(h); }
static inline void vbf_store(uint16_t *p, vbf h) { *p = h; }
static inline void vbf_store_n(uint16_t *p, vbf h, int64_t n)
{
    if (n > 0) *p = h;
}
static inline vbf vbf_rounded(vbf h) { return (h & 0x7fff) > 0x7f80 ? (vbf)(h | 0x40) : h; }

#endif

/* dst[0..n) = src[0..n) widened (exact). */
static inline void ls_widen_bf16(int64_t n, const uint16_t *src, float *dst)
{
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vf_store(dst + i, vf_load_bf16(src + i));
    if (i < n) vf_store_n(dst + i, vf_load_bf16_n(src + i, n - i), n - i);
}

/* dst[0..n) = src[0..n) rounded to nearest even. */
static inline void ls_round_bf16(int64_t n, const float *src, uint16_t *dst)
{
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vf_store_bf16(dst + i, vf_load(src + i));
    if (i < n) vf_store_bf16_n(dst + i, vf_load_n(src + i, n - i), n - i);
}

#endif
