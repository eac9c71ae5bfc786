/* The conv1d decode's span kernel rounding bf16 rows with AVX512-BF16's instruction: the
 * AVX-512 kernel compiled for vcvtneps2bf16 (simd/bf16_store_instruction.h), which a decode
 * uses where the CPU has it (conv1d.c, decode_run): the bits of the integer rounding, in less
 * time (8192 channels of bf16 x and rows on an Intel Xeon, one thread: 37 -> 34 us at batch 8,
 * 190 -> 175 us at batch 32). Other ISAs and compilers without the instruction compile the
 * plain kernel under this name. */
#include "simd/gemm_bf16.h" /* LS_HAVE_BF16_DOT */
#include "ssm/ssm_kernels.h"

#include "simd/bf16_target_begin.h"

#if LS_HAVE_BF16_DOT
#include "simd/bf16_store_instruction.h"

#define CONV1D_STORE_BF16 ls_store_bf16_instruction
#define CONV1D_STORE_BF16_MOVED ls_store_bf16_instruction_moved
#endif

#include "ssm/conv1d_decode_span.h"

void LS_ISA_FN(ls_conv1d_decode_span_item_bf16)(void *ctx, int64_t item, int thread)
{
    conv1d_span_item(ctx, item, thread);
}

#include "simd/bf16_target_end.h"
