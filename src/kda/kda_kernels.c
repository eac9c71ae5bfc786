/* KDA's kernel tables, one per instruction set this build compiles (see kda_kernels.h). */
#include "kda/kda_kernels.h"

#define KDA_KERNELS(ISA, sfx)                                                                      \
    {                                                                                              \
        .isa = ISA, .recurrent_item = kda_recurrent_item_##sfx,                                    \
        .decode_v_first = kda_decode_v_first_##sfx,                                                \
        .decode_rows_item = kda_decode_rows_item_##sfx,                                            \
        .decode_rows_item_bf16_dot = kda_decode_rows_item_bf16_dot_##sfx,                          \
        .chunk_item = kda_chunk_item_##sfx, .chunk_prepare = kda_chunk_prepare_##sfx,              \
        .chunk_solve = kda_chunk_solve_##sfx, .chunk_output = kda_chunk_output_##sfx,              \
        .chunk_advance = kda_chunk_advance_##sfx,                                                  \
        .recurrent_bwd_ws_bytes = kda_recurrent_bwd_ws_bytes_##sfx,                                \
        .recurrent_bwd_item = kda_recurrent_bwd_item_##sfx,                                        \
        .chunk_bwd_ws_bytes = kda_chunk_bwd_ws_bytes_##sfx,                                        \
        .chunk_bwd_item = kda_chunk_bwd_item_##sfx, .bwd_chain_qk = kda_bwd_chain_qk_##sfx,        \
        .segment_item = kda_segment_item_##sfx, .gate_rows = kda_gate_rows_##sfx,                  \
    }

/* Indexed by ls_isa; other targets compile the portable kernels only. */
static const kda_kernels tables[] = {
    KDA_KERNELS(LS_ISA_SCALAR, scalar),
#if LS_HAVE_X86_KERNELS
    KDA_KERNELS(LS_ISA_AVX2, avx2),
    KDA_KERNELS(LS_ISA_AVX512, avx512),
#endif
};

const kda_kernels *ls_kda_kernels(ls_isa isa)
{
    return &tables[LS_HAVE_X86_KERNELS ? isa : LS_ISA_SCALAR];
}
