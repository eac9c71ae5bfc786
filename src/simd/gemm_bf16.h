/* Internal: matrix products with bfloat16 operands and float32 accumulation, for the *_simd.c
 * kernels (include after vec.h and bf16.h). One set of arithmetic on every ISA: where the CPU
 * has AVX512-BF16 the AVX-512 kernels run it as vdpbf16ps, elsewhere as float32 FMAs on the
 * operands widened (exactly) back to float32.
 *
 * The operands are packed once, rounded to bf16 (nearest even) with every value whose bf16 is
 * subnormal flushed to a zero of its sign, into 32-bit words that each hold two consecutive
 * elements along the inner dimension p: the even one (p = 2q) in the low half, the odd one
 * (2q + 1) in the high half, a missing odd element (p = K, K odd) a zero.
 *     rows:  A [M,K] row-major      -> [M, ceil(K/2)] words (ls_pack_bf16_rows)
 *     pairs: B [K,N] row-major      -> [ceil(K/2), N] words, rows 2q and 2q+1 interleaved
 *                                      (ls_pack_bf16_pairs); also A stored transposed
 * A product C += A B then runs, for each word q in increasing order and each element,
 *     c = c + a_odd b_odd;  c = c + a_even b_even
 * each step rounded once to nearest even (a product of two bf16 is exact in float32). That is
 * vdpbf16ps as Intel defines it and as a Zen 5 computes it (checked bit for bit by
 * tests/test_bf16_products.c), which also treats subnormal inputs and results as zeros: the
 * packing removes the subnormal operands, so the two forms differ only where a partial sum of
 * C falls below 2^-126 (the instruction flushes it to zero; FMA keeps it). */
#ifndef LS_SIMD_GEMM_BF16_H
#define LS_SIMD_GEMM_BF16_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "simd/bf16.h"
#include "simd/gemm.h"
#include "simd/vec.h"

/* Whether the AVX-512 build of a kernel carries the vdpbf16ps version (a compiler that knows
 * the instruction; the CPU is asked at run time, ls_cpu_has_bf16_dot). */
#if LS_ISA == 2 && (defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10)
#define LS_HAVE_BF16_DOT 1
#else
#define LS_HAVE_BF16_DOT 0
#endif

/* One word's halves as float32: the odd element (high half) and the even one (low half). */
static inline float bf16_word_odd(uint32_t w)
{
    const uint32_t u = w & 0xffff0000u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline float bf16_word_even(uint32_t w)
{
    const uint32_t u = w << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The bf16 bits of a float (ls_f32_to_bf16), a subnormal result flushed to a signed zero. */
static inline uint32_t bf16_bits_ftz(float x)
{
    const uint32_t h = ls_f32_to_bf16(x);
    return (h & 0x7f80u) ? h : (h & 0x8000u);
}

#if LS_ISA == 2

typedef __m512i vw; /* VW words */
static inline vw vw_load(const uint32_t *p) { return _mm512_loadu_si512(p); }
static inline vw vw_load_n(const uint32_t *p, int64_t n)
{
    return _mm512_maskz_loadu_epi32(vf_tail(n), p);
}
static inline void vw_store(uint32_t *p, vw w) { _mm512_storeu_si512(p, w); }
static inline void vw_store_n(uint32_t *p, vw w, int64_t n)
{
    _mm512_mask_storeu_epi32(p, vf_tail(n), w);
}
static inline vf vw_odd(vw w)
{
    return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u)));
}
static inline vf vw_even(vw w) { return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }
/* bf16_bits_ftz of every lane (bf16_round_lanes is ls_f32_to_bf16's arithmetic) */
static inline vw bf16_lanes_ftz(vf x)
{
    const __m512i h = bf16_round_lanes(x);
    const __mmask16 sub = _mm512_testn_epi32_mask(h, _mm512_set1_epi32(0x7f80));
    return _mm512_mask_and_epi32(h, sub, h, _mm512_set1_epi32(0x8000));
}
static inline vw bf16_pair_words(vf even, vf odd)
{
    return _mm512_or_si512(bf16_lanes_ftz(even), _mm512_slli_epi32(bf16_lanes_ftz(odd), 16));
}
/* the words of 2 VW consecutive floats x0 then x1: their bf16 halves in order */
static inline vw bf16_row_words(vf x0, vf x1)
{
    const __m256i lo = _mm512_cvtepi32_epi16(bf16_lanes_ftz(x0));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm512_cvtepi32_epi16(bf16_lanes_ftz(x1)),
                              1);
}

#elif LS_ISA == 1

typedef __m256i vw;
static inline vw vw_load(const uint32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline vw vw_load_n(const uint32_t *p, int64_t n)
{
    return _mm256_maskload_epi32((const int *)(const void *)p, vf_tail(n));
}
static inline void vw_store(uint32_t *p, vw w) { _mm256_storeu_si256((__m256i *)p, w); }
static inline void vw_store_n(uint32_t *p, vw w, int64_t n)
{
    _mm256_maskstore_epi32((int *)(void *)p, vf_tail(n), w);
}
static inline vf vw_odd(vw w)
{
    return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u)));
}
static inline vf vw_even(vw w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
static inline vw bf16_lanes_ftz(vf x)
{
    const __m256i h = bf16_round_lanes32(x);
    const __m256i sub =
        _mm256_cmpeq_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x7f80)), _mm256_setzero_si256());
    return _mm256_blendv_epi8(h, _mm256_and_si256(h, _mm256_set1_epi32(0x8000)), sub);
}
static inline vw bf16_pair_words(vf even, vf odd)
{
    return _mm256_or_si256(bf16_lanes_ftz(even), _mm256_slli_epi32(bf16_lanes_ftz(odd), 16));
}
static inline vw bf16_row_words(vf x0, vf x1)
{
    /* every lane is <= 0xffff, so the unsigned saturating packs keep it as it is */
    const __m256i h0 = bf16_lanes_ftz(x0), h1 = bf16_lanes_ftz(x1);
    const __m128i lo =
        _mm_packus_epi32(_mm256_castsi256_si128(h0), _mm256_extracti128_si256(h0, 1));
    const __m128i hi =
        _mm_packus_epi32(_mm256_castsi256_si128(h1), _mm256_extracti128_si256(h1, 1));
    return _mm256_set_m128i(hi, lo);
}

#else

typedef uint32_t vw;
static inline vw vw_load(const uint32_t *p) { return *p; }
static inline vw vw_load_n(const uint32_t *p, int64_t n) { return n > 0 ? *p : 0u; }
static inline void vw_store(uint32_t *p, vw w) { *p = w; }
static inline void vw_store_n(uint32_t *p, vw w, int64_t n)
{
    if (n > 0) *p = w;
}
static inline vf vw_odd(vw w) { return bf16_word_odd(w); }
static inline vf vw_even(vw w) { return bf16_word_even(w); }
static inline vw bf16_pair_words(vf even, vf odd)
{
    return bf16_bits_ftz(even) | bf16_bits_ftz(odd) << 16;
}
static inline vw bf16_row_words(vf x0, vf x1) { return bf16_pair_words(x0, x1); }

#endif

/* dst[q*ldd + j] = the word of src rows 2q and 2q+1 (src[p*lds + j]), for the K x N block:
 * ceil(K/2) rows of N words. */
static inline void ls_pack_bf16_pairs(int64_t K, int64_t N, const float *src, int64_t lds,
                                      uint32_t *dst, int64_t ldd)
{
    for (int64_t p = 0; p < K; p += 2) {
        const float *e = src + p * lds, *o = p + 1 < K ? e + lds : NULL;
        uint32_t *d = dst + p / 2 * ldd;
        int64_t j = 0;
        for (; j + VW <= N; j += VW)
            vw_store(d + j, bf16_pair_words(vf_load(e + j), o ? vf_load(o + j) : vf_zero()));
        if (j < N)
            vw_store_n(
                d + j,
                bf16_pair_words(vf_load_n(e + j, N - j), o ? vf_load_n(o + j, N - j) : vf_zero()),
                N - j);
    }
}

/* dst[i*ldd + q] = the word of src[i*lds + 2q] and src[i*lds + 2q + 1], for M rows of K. */
static inline void ls_pack_bf16_rows(int64_t M, int64_t K, const float *src, int64_t lds,
                                     uint32_t *dst, int64_t ldd)
{
    for (int64_t i = 0; i < M; i++) {
        const float *s = src + i * lds;
        uint32_t *d = dst + i * ldd;
        int64_t p = 0;
        for (; p + 2 * VW <= K; p += 2 * VW)
            vw_store(d + p / 2, bf16_row_words(vf_load(s + p), vf_load(s + p + VW)));
        if (p < K) {
            const int64_t r = K - p, r1 = r > VW ? r - VW : 0;
            vw_store_n(d + p / 2,
                       bf16_row_words(vf_load_n(s + p, r < VW ? r : VW), vf_load_n(s + p + VW, r1)),
                       (r + 1) / 2);
        }
    }
}

/* The products themselves. A(i, q) = A[i*a_rs + q*a_cs] (words), B [Kw, N] words with leading
 * dimension ldb, C as in ls_gemm_scaled: C = (accumulate ? C : 0) + A B, or with c_scale
 * C = diag(c_scale) C + A B. Kw: the words along the inner dimension, ceil(K/2). */

/* An edge tile's accumulators, mr <= GEMM_MR rows of one column of width w <= VW (masked):
 * as gemm_tile_load and gemm_tile_store for the full tiles. */
static inline void gemm_edge_load(vf acc[GEMM_MR], int64_t mr, int64_t w, const float *C,
                                  int64_t ldc, bool accumulate, const float *c_scale)
{
    for (int64_t i = 0; i < mr; i++) {
        acc[i] = accumulate ? vf_load_n(C + i * ldc, w) : vf_zero();
        if (c_scale) acc[i] = vf_mul(vf_set1(c_scale[i]), acc[i]);
    }
}

static inline void gemm_edge_store(vf acc[GEMM_MR], int64_t mr, int64_t w, float *C, int64_t ldc)
{
    for (int64_t i = 0; i < mr; i++) vf_store_n(C + i * ldc, acc[i], w);
}

/* A full GEMM_MR x (GEMM_NV*VW) tile, widened operands. */
static inline void gemm_bf16_tile_full(int64_t Kw, const uint32_t *A, int64_t a_rs, int64_t a_cs,
                                       const uint32_t *B, int64_t ldb, float *C, int64_t ldc,
                                       bool accumulate, const float *c_scale)
{
    vf acc[GEMM_MR][GEMM_NV];
    gemm_tile_load(acc, C, ldc, accumulate, c_scale);
    for (int64_t q = 0; q < Kw; q++) {
        vf bo[GEMM_NV], be[GEMM_NV];
#pragma GCC unroll 4
        for (int v = 0; v < GEMM_NV; v++) {
            const vw b = vw_load(B + q * ldb + v * VW);
            bo[v] = vw_odd(b);
            be[v] = vw_even(b);
        }
#pragma GCC unroll 8
        for (int i = 0; i < GEMM_MR; i++) {
            const uint32_t a = A[i * a_rs + q * a_cs];
            const vf ao = vf_set1(bf16_word_odd(a)), ae = vf_set1(bf16_word_even(a));
#pragma GCC unroll 4
            for (int v = 0; v < GEMM_NV; v++)
                acc[i][v] = vf_fmadd(ae, be[v], vf_fmadd(ao, bo[v], acc[i][v]));
        }
    }
    gemm_tile_store(acc, C, ldc);
}

/* mr <= GEMM_MR rows by one vector column of width w <= VW, widened operands. */
static inline void gemm_bf16_tile_edge(int64_t mr, int64_t w, int64_t Kw, const uint32_t *A,
                                       int64_t a_rs, int64_t a_cs, const uint32_t *B, int64_t ldb,
                                       float *C, int64_t ldc, bool accumulate, const float *c_scale)
{
    vf acc[GEMM_MR];
    gemm_edge_load(acc, mr, w, C, ldc, accumulate, c_scale);
    for (int64_t q = 0; q < Kw; q++) {
        const vw b = vw_load_n(B + q * ldb, w);
        const vf bo = vw_odd(b), be = vw_even(b);
        for (int64_t i = 0; i < mr; i++) {
            const uint32_t a = A[i * a_rs + q * a_cs];
            acc[i] = vf_fmadd(vf_set1(bf16_word_even(a)), be,
                              vf_fmadd(vf_set1(bf16_word_odd(a)), bo, acc[i]));
        }
    }
    gemm_edge_store(acc, mr, w, C, ldc);
}

#if LS_HAVE_BF16_DOT
#define LS_BF16_DOT_TARGET __attribute__((target("avx512bf16")))

/* The same tiles with vdpbf16ps: one instruction per word and vector does both steps. */
LS_BF16_DOT_TARGET static inline void
gemm_dot_tile_full(int64_t Kw, const uint32_t *A, int64_t a_rs, int64_t a_cs, const uint32_t *B,
                   int64_t ldb, float *C, int64_t ldc, bool accumulate, const float *c_scale)
{
    vf acc[GEMM_MR][GEMM_NV];
    gemm_tile_load(acc, C, ldc, accumulate, c_scale);
    for (int64_t q = 0; q < Kw; q++) {
        __m512bh b[GEMM_NV];
#pragma GCC unroll 4
        for (int v = 0; v < GEMM_NV; v++) b[v] = (__m512bh)vw_load(B + q * ldb + v * VW);
#pragma GCC unroll 8
        for (int i = 0; i < GEMM_MR; i++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[i * a_rs + q * a_cs]);
#pragma GCC unroll 4
            for (int v = 0; v < GEMM_NV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
        }
    }
    gemm_tile_store(acc, C, ldc);
}

LS_BF16_DOT_TARGET static inline void gemm_dot_tile_edge(int64_t mr, int64_t w, int64_t Kw,
                                                         const uint32_t *A, int64_t a_rs,
                                                         int64_t a_cs, const uint32_t *B,
                                                         int64_t ldb, float *C, int64_t ldc,
                                                         bool accumulate, const float *c_scale)
{
    vf acc[GEMM_MR];
    gemm_edge_load(acc, mr, w, C, ldc, accumulate, c_scale);
    for (int64_t q = 0; q < Kw; q++) {
        const __m512bh b = (__m512bh)vw_load_n(B + q * ldb, w);
        for (int64_t i = 0; i < mr; i++)
            acc[i] = _mm512_dpbf16_ps(acc[i],
                                      (__m512bh)_mm512_set1_epi32((int)A[i * a_rs + q * a_cs]), b);
    }
    gemm_edge_store(acc, mr, w, C, ldc);
}
#endif

/* Tiles of C: full GEMM_MR x (GEMM_NV*VW) tiles, then edges of one vector column each. TILE
 * names the pair of tile functions (gemm_bf16 or gemm_dot). */
#define LS_GEMM_BF16_TILES(TILE)                                                                   \
    do {                                                                                           \
        const int64_t panel = GEMM_NV * VW;                                                        \
        const int64_t m_full = M - M % GEMM_MR, n_full = N - N % panel;                            \
        for (int64_t j = 0; j < n_full; j += panel)                                                \
            for (int64_t i = 0; i < m_full; i += GEMM_MR)                                          \
                TILE##_tile_full(Kw, A + i * a_rs, a_rs, a_cs, B + j, ldb, C + i * ldc + j, ldc,   \
                                 accumulate, c_scale ? c_scale + i : NULL);                        \
        for (int64_t j = 0; j < N; j += VW) {                                                      \
            const int64_t w = N - j < VW ? N - j : VW;                                             \
            for (int64_t i = j < n_full ? m_full : 0; i < M; i += GEMM_MR)                         \
                TILE##_tile_edge(M - i < GEMM_MR ? M - i : GEMM_MR, w, Kw, A + i * a_rs, a_rs,     \
                                 a_cs, B + j, ldb, C + i * ldc + j, ldc, accumulate,               \
                                 c_scale ? c_scale + i : NULL);                                    \
        }                                                                                          \
    } while (0)

static inline void ls_gemm_bf16_widened(int64_t M, int64_t N, int64_t Kw, const uint32_t *A,
                                        int64_t a_rs, int64_t a_cs, const uint32_t *B, int64_t ldb,
                                        float *C, int64_t ldc, bool accumulate,
                                        const float *c_scale)
{
    LS_GEMM_BF16_TILES(gemm_bf16);
}

#if LS_HAVE_BF16_DOT
LS_BF16_DOT_TARGET static void ls_gemm_bf16_dot(int64_t M, int64_t N, int64_t Kw, const uint32_t *A,
                                                int64_t a_rs, int64_t a_cs, const uint32_t *B,
                                                int64_t ldb, float *C, int64_t ldc, bool accumulate,
                                                const float *c_scale)
{
    LS_GEMM_BF16_TILES(gemm_dot);
}
#endif

/* The product on the instruction when use_dot (the caller has checked ls_cpu_has_bf16_dot;
 * ignored where this build has no such version), else on widened operands: the same bits. */
static inline void ls_gemm_bf16(bool use_dot, int64_t M, int64_t N, int64_t Kw, const uint32_t *A,
                                int64_t a_rs, int64_t a_cs, const uint32_t *B, int64_t ldb,
                                float *C, int64_t ldc, bool accumulate, const float *c_scale)
{
    if (M <= 0 || N <= 0) return;
    if (c_scale) accumulate = true;
#if LS_HAVE_BF16_DOT
    if (use_dot) {
        ls_gemm_bf16_dot(M, N, Kw, A, a_rs, a_cs, B, ldb, C, ldc, accumulate, c_scale);
        return;
    }
#else
    (void)use_dot;
#endif
    ls_gemm_bf16_widened(M, N, Kw, A, a_rs, a_cs, B, ldb, C, ldc, accumulate, c_scale);
}

#endif
