/* The SSM1 and conv1d kernel tables, one per instruction set this build compiles (see
 * ssm_kernels.h). */
#include "ssm/ssm_kernels.h"

#define SSM_KERNELS(ISA, sfx)                                                                      \
    {                                                                                              \
        .isa = ISA, .ssm1_scan_item = ls_ssm1_scan_item_##sfx,                                     \
        .ssm1_bwd_item = ls_ssm1_bwd_item_##sfx,                                                   \
        .ssm1_bwd_reduce_item = ls_ssm1_bwd_reduce_item_##sfx,                                     \
        .conv1d_item = ls_conv1d_item_##sfx, .conv1d_bwd_item = ls_conv1d_bwd_item_##sfx,          \
        .conv1d_decode_item = ls_conv1d_decode_item_##sfx,                                         \
        .conv1d_decode_span_item = ls_conv1d_decode_span_item_##sfx,                               \
        .conv1d_decode_span_item_bf16 = ls_conv1d_decode_span_item_bf16_##sfx,                     \
        .vmath_n = ls_ssm_vmath_n_##sfx,                                                           \
    }

/* Indexed by ls_isa; other targets compile the portable kernels only. */
static const ssm_kernels tables[] = {
    SSM_KERNELS(LS_ISA_SCALAR, scalar),
#if LS_HAVE_X86_KERNELS
    SSM_KERNELS(LS_ISA_AVX2, avx2),
    SSM_KERNELS(LS_ISA_AVX512, avx512),
#endif
};

const ssm_kernels *ls_ssm_kernels(ls_isa isa)
{
    return &tables[LS_HAVE_X86_KERNELS ? isa : LS_ISA_SCALAR];
}
