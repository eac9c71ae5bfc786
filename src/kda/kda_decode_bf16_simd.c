/* KDA's decode over bf16 state rows with AVX512-BF16's rounding: the AVX-512 kernels compiled
 * for vcvtneps2bf16 (simd/bf16_store_instruction.h), which a decode uses where the CPU has it
 * (ls_cpu_has_bf16_dot). Other ISAs and compilers without the instruction compile the plain
 * kernel under this name. */
#include "simd/gemm_bf16.h" /* LS_HAVE_BF16_DOT */

#include "simd/bf16_target_begin.h"

#if LS_HAVE_BF16_DOT

#include "simd/bf16_store_instruction.h"

#define KDA_STORE_BF16 ls_store_bf16_instruction

/* vf_store_bf16_pair with the instruction: both vectors rounded by one vcvtne2ps2bf16 (even
 * elements in the lower 16 words, odd in the upper), interleaved back by one word permutation.
 * The state's values are results of the kernel's arithmetic, never subnormal under FTZ
 * (simd/bf16_store_instruction.h), so the instruction gives the integer rounding's bits. */
static inline __attribute__((always_inline)) void store_bf16_pair_instruction(uint16_t *p, vf even,
                                                                              vf odd)
{
    const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(odd, even);
    /* word 2m is word m (even), word 2m + 1 is word 16 + m (odd) */
    const __m512i interleave =
        _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    _mm512_storeu_si512(p, _mm512_permutexvar_epi16(interleave, halves));
}
#define KDA_STORE_BF16_PAIR store_bf16_pair_instruction
#endif

#include "kda/kda_columns.h"

void LS_ISA_FN(kda_decode_rows_item_bf16_dot)(const kda_plan *pl, int64_t tok, int64_t hv,
                                              const void *from, void *to, bool half, float *o,
                                              float *scratch)
{
    decode_rows_token(pl, tok, hv, from, to, half, o, scratch);
}

#include "simd/bf16_target_end.h"
