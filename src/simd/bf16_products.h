/* Internal: the bf16-operand products of gemm_bf16.h behind one call per ISA (compiled in
 * bf16_products_simd.c), for the tests and the bench: the same code the kernels inline. */
#ifndef LS_SIMD_BF16_PRODUCTS_H
#define LS_SIMD_BF16_PRODUCTS_H

#include <stdbool.h>
#include <stdint.h>

#include "simd/isa.h"

/* C[M,N] = (accumulate ? C : 0) + A B for row-major float32 A [M,K] and B [K,N], each rounded
 * once to bf16 (gemm_bf16.h), summed in float32: on vdpbf16ps when use_dot and this ISA has
 * that version (ls_cpu_has_bf16_dot must hold), else on widened operands. a_words
 * (M * ceil(K/2)) and b_words (ceil(K/2) * N) receive the packed operands. */
LS_ISA_DECLARE(void, ls_bf16_products,
               (bool use_dot, int64_t M, int64_t N, int64_t K, const float *A, const float *B,
                float *C, bool accumulate, uint32_t *a_words, uint32_t *b_words));

/* Whether this build's AVX-512 kernels carry the vdpbf16ps version. */
LS_ISA_DECLARE(bool, ls_bf16_products_have_dot, (void));

#endif
