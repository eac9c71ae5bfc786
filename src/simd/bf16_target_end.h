/* Internal: closes the region simd/bf16_target_begin.h opened. No include guard. */
#if LS_HAVE_BF16_DOT
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
