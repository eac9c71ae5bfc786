/* Internal: opens a region of a *_simd.c source whose functions are compiled for AVX512-BF16
 * (where LS_HAVE_BF16_DOT: the AVX-512 build with a compiler that has the instruction), for
 * kernels that run only where ls_cpu_has_bf16_dot. Include simd/gemm_bf16.h first; close the
 * region with simd/bf16_target_end.h. No include guard: each inclusion opens one region. */
#if LS_HAVE_BF16_DOT
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512bf16")
#endif
#endif
