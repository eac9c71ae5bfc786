/* The products of gemm_bf16.h as one call (bf16_products.h); compiled once per ISA. */
#include "simd/bf16_products.h"

#include "simd/gemm_bf16.h"

void LS_ISA_FN(ls_bf16_products)(bool use_dot, int64_t M, int64_t N, int64_t K, const float *A,
                                 const float *B, float *C, bool accumulate, uint32_t *a_words,
                                 uint32_t *b_words)
{
    const int64_t Kw = (K + 1) / 2;
    ls_pack_bf16_rows(M, K, A, K, a_words, Kw);
    ls_pack_bf16_pairs(K, N, B, N, b_words, N);
    ls_gemm_bf16(use_dot, M, N, Kw, a_words, Kw, 1, b_words, N, C, N, accumulate, NULL);
}

bool LS_ISA_FN(ls_bf16_products_have_dot)(void) { return LS_HAVE_BF16_DOT; }
