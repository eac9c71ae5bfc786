/* SSD's decode over bf16 state rows in mamba's [P,N] layout with AVX512-BF16's rounding: the
 * AVX-512 kernel compiled for vcvtneps2bf16 (simd/bf16_store_instruction.h), which a decode
 * uses where the CPU has it (ssd_plan.round_by_instruction): the bits of the integer rounding,
 * in less time (24 heads of 64 x 128 on an Intel Xeon: 35 -> 29 us at batch 1, 321 -> 233 us
 * at batch 8). Other ISAs and compilers without the instruction compile the plain kernel under
 * this name. */
#include "simd/gemm_bf16.h" /* LS_HAVE_BF16_DOT */
#include "ssd/ssd_kernel.h"

#include "simd/bf16_target_begin.h"

#if LS_HAVE_BF16_DOT
#include "simd/bf16_store_instruction.h"

#define SSD_STORE_BF16 ls_store_bf16_instruction
#endif

#include "ssd/ssd_pn_token.h"

void LS_ISA_FN(ls_ssd_decode_bf16_row)(const ssd_plan *pl, const ssd_item *it, const void *from,
                                       void *to, float *ys)
{
    pn_token(pl, it, 0, from, to, true, ys);
}

#include "simd/bf16_target_end.h"
