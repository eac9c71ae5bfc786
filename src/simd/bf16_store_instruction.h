/* Internal: a vector's bf16 rounding as AVX512-BF16's vcvtneps2bf16, for the decode kernels
 * that round a state row as they store it (include inside a target("avx512bf16") region, where
 * LS_HAVE_BF16_DOT; the caller checks ls_cpu_has_bf16_dot before it runs such code). The
 * instruction rounds to nearest even and quiets a NaN as ls_f32_to_bf16 does, but flushes a
 * subnormal input to zero: a vector with a subnormal lane takes the integer rounding, so the
 * bits are those of every other ISA. The integer form costs about 10 vector operations per 16
 * lanes, a third of a bf16 decode step's work; this is 2 or 3. */
#ifndef LS_SIMD_BF16_STORE_INSTRUCTION_H
#define LS_SIMD_BF16_STORE_INSTRUCTION_H

#include "simd/bf16.h"
#include "simd/vec.h"

static inline __attribute__((always_inline)) void ls_store_bf16_instruction(uint16_t *p, __m512 x)
{
    if (_mm512_fpclass_ps_mask(x, 0x20)) { /* a subnormal lane: the instruction would flush it */
        vf_store_bf16(p, x);
        return;
    }
    _mm256_storeu_si256((__m256i *)(void *)p, (__m256i)_mm512_cvtneps_pbh(x));
}

#endif
