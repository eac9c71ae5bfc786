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

#else

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
