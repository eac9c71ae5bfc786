/* Internal: a vector's bf16 rounding as AVX512-BF16's vcvtneps2bf16, for the decode kernels
 * that round a state row as they store it (include inside a target("avx512bf16") region, where
 * LS_HAVE_BF16_DOT; the caller checks ls_cpu_has_bf16_dot before it runs such code). The
 * instruction rounds to nearest even and quiets a NaN as ls_f32_to_bf16 does, but flushes a
 * subnormal input to zero. The kernels run with FTZ and DAZ set (core/fp_mode.h), so their
 * arithmetic never yields a subnormal and its results round to the bits of every other ISA
 * (ls_store_bf16_instruction); a value moved unchanged from an input can be one, and a vector
 * holding one takes the integer rounding (ls_store_bf16_instruction_moved). The integer form
 * costs about 10 vector operations per 16 lanes, a third of a bf16 decode step's work; this
 * is 1 to 4. */
#ifndef LS_SIMD_BF16_STORE_INSTRUCTION_H
#define LS_SIMD_BF16_STORE_INSTRUCTION_H

#include "simd/bf16.h"
#include "simd/vec.h"

/* A result of the kernels' arithmetic (never subnormal under FTZ) rounded and stored. */
static inline __attribute__((always_inline)) void ls_store_bf16_instruction(uint16_t *p, __m512 x)
{
    _mm256_storeu_si256((__m256i *)(void *)p, (__m256i)_mm512_cvtneps_pbh(x));
}

/* A value moved from an input, subnormal lanes possible, rounded and stored. Subnormal lanes
 * (exponent bits 0, magnitude not 0) are found from the bits: under DAZ vfpclassps reports a
 * subnormal as a zero. */
static inline __attribute__((always_inline)) void ls_store_bf16_instruction_moved(uint16_t *p,
                                                                                  __m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    if (_mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)), u,
                                    _mm512_set1_epi32(0x7fffffff))) {
        vf_store_bf16(p, x);
        return;
    }
    ls_store_bf16_instruction(p, x);
}

#endif
