/* The fast float32 backward of the causal depthwise conv1d: the driver (its kernel is
 * conv1d_bwd_simd.c, compiled once per ISA).
 *
 * Per (sequence, channel), with xs the padded input (state, then x) and pre_t the
 * pre-activation (recomputed with the forward's arithmetic, so bitwise the forward's):
 *     g_t       = d_y_t act'(pre_t)
 *     dxs[k]    = sum_j weight[j] g_{k-j}  (0 <= k-j < len)  + d_conv_state_out[k - len]
 *                 (the second term for the last W-1 positions, which conv_state_out copies)
 *     dweight[j] += g_t xs[t+j],   dbias += g_t
 * dxs[k] is dconv_state[k] for k < W-1 and dx_{k-(W-1)} after. It needs g up to index k, so
 * walking t forward with the last W values of g in a ring, dxs[t] is complete as soon as g_t
 * is known, and the last W-1 positions are finished after the sequence.
 *
 * A work item is a few consecutive blocks of SSM_LANES channels that walk every sequence in
 * order: each block owns its channels of dweight and dbias and sums them in a fixed order, so
 * results are bitwise identical for every thread count. Extra memory: (4W + 1 + ring) *
 * SSM_LANES floats per block of an item (at most CONV1D_BWD_MAX_BLOCKS; ring the power of two
 * at or above W + 16), per thread. */
#include <stdlib.h>

#include "core/parallel.h"
#include "core/validate.h"
#include "ssm/ssm_internal.h"
#include "ssm/ssm_kernels.h"

linseq_status ls_conv1d_scan_backward(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                      const ssm_kernels *kern, const float *d_y,
                                      const float *d_conv_state_out,
                                      const linseq_conv1d_grads *grads)
{
    conv1d_plan pl = {.p = p,
                      .d_y = d_y,
                      .d_state_out = d_conv_state_out,
                      .grads = grads,
                      .act = conv1d_activation(p)};
    const int64_t blocks = (p->D + SSM_LANES - 1) / SSM_LANES;
    const int n_threads = ls_resolve_threads(
        exec, blocks, 6.0 * (double)p->B * (double)p->T * (double)p->D * (double)p->W);
    /* Blocks per item: up to CONV1D_BWD_MAX_BLOCKS, keeping 4 items per thread for balance.
     * Results do not depend on the grouping (each block's sums are its own). */
    pl.blocks_per_item = blocks / (4 * n_threads);
    if (pl.blocks_per_item > CONV1D_BWD_MAX_BLOCKS) pl.blocks_per_item = CONV1D_BWD_MAX_BLOCKS;
    if (pl.blocks_per_item < 1) pl.blocks_per_item = 1;
    pl.n_blocks = (blocks + pl.blocks_per_item - 1) / pl.blocks_per_item;

    /* Whole rows of SSM_LANES floats: every thread's part is a multiple of 64 bytes, so
     * threads never share a cache line. */
    int64_t thread_floats, total_bytes;
    if (p->W > INT64_MAX / SSM_LANES / 16 / CONV1D_BWD_MAX_BLOCKS) return LINSEQ_ERR_OUT_OF_MEMORY;
    for (pl.ring = 1; pl.ring < CONV1D_BWD_CHUNK + p->W; pl.ring *= 2) {
    }
    pl.x = ssm_view_of(p->x, p->x_strides, p->channel_first, p->T, p->D, 1);
    pl.x_tiled = pl.x.channel != 1;
    const bool tiled = pl.x_tiled || p->channel_first;
    thread_floats = pl.blocks_per_item *
                    (CONV1D_BWD_ROWS(p->W, pl.ring) + (tiled ? CONV1D_BWD_TILE_ROWS(p->W) : 0)) *
                    SSM_LANES;
    if (!ls_mul_ok(&total_bytes, 3, thread_floats, (int64_t)n_threads, (int64_t)sizeof(float)))
        return LINSEQ_ERR_OUT_OF_MEMORY;
    pl.thread_floats = (size_t)thread_floats;
    pl.workspace = aligned_alloc(64, (size_t)total_bytes);
    if (!pl.workspace) return LINSEQ_ERR_OUT_OF_MEMORY;

    ls_parallel_for(pl.n_blocks, n_threads, kern->conv1d_bwd_item, &pl);
    free(pl.workspace);
    return LINSEQ_OK;
}
