/* A state row between a pool's element type and float32 on one ISA (simd/state_rows.h). */
#include "simd/state_rows.h"

#include "core/state_rows.h"
#include "simd/bf16.h"

void LS_ISA_FN(ls_state_widen_isa)(linseq_pool_dtype dtype, const void *from, float *to, int64_t n)
{
    if (dtype == LINSEQ_POOL_BF16)
        ls_widen_bf16(n, from, to);
    else
        ls_state_widen(dtype, from, to, n);
}

void LS_ISA_FN(ls_state_narrow_isa)(linseq_pool_dtype dtype, const float *from, void *to, int64_t n)
{
    if (dtype == LINSEQ_POOL_BF16)
        ls_round_bf16(n, from, to);
    else
        ls_state_narrow(dtype, from, to, n);
}
