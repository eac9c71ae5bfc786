/* The fast SSM1 backward driver: reverse mode of the recurrence with checkpointed states. The
 * kernels (one work item per block of channels, and the pass adding the dB/dC partials) are
 * in ssm1_scan_bwd_simd.c, compiled once per ISA.
 *
 * Per channel d and state n, with a_t = exp(A dt_t), gy_t = d_y_t act(gate_t) and dh the
 * gradient of L with respect to a state:
 *     adj_t     = dh_t + C_t gy_t               (dh_T = d_hT; everything L gets from h_t)
 *     dh_{t-1}  = a_t adj_t                     (dh0 = what is left at the sequence start)
 *     dx_t      = dt_t sum_n adj_t B_t + D gy_t
 *     ddt_t     = x_t sum_n adj_t B_t + sum_n adj_t A a_t h_{t-1}
 *                                               (times softplus' with dt_softplus)
 *     dA       += adj_t dt_t a_t h_{t-1}
 *     dB_t[g]  += adj_t dt_t x_t,   dC_t[g] += gy_t h_t     (over the channels of group g)
 *     dgate_t   = d_y_t (sum_n h_t C_t + D x_t) act'(gate_t)
 * The reverse walk needs h_{t-1} and a_t for every token. Storing one state per token would
 * take T D N floats (6 GiB at T = 64k for one Mamba-130m layer), so a forward pass keeps only
 * the state before every segment of SSM_BWD_SEGMENT tokens; the reverse walk then recomputes
 * one segment at a time into a SEGMENT-deep buffer of states and decays, from its checkpoint,
 * with the forward's arithmetic (so the states are bitwise the forward's). h_{t-1} is read
 * from that buffer, never recovered by dividing h_t by a_t: a_t underflows to 0 for
 * A dt < -104.
 *
 * Work items are blocks of up to SSM_LANES channels inside one group of B_proj/C_proj (the
 * blocks of group 0, then of group 1, ...), each walking every sequence in order. A block then
 * owns its rows of dx, ddt, dgate, dh0 and its channels of dA, dD_skip, ddt_bias, which it sums
 * over all tokens in a fixed order; B_t and C_t are one scalar per state for the whole block.
 * dB_proj and dC_proj sum over the channels of a group: a group of one block writes them
 * directly, otherwise each block writes its own partial rows ([tokens][N] each) and a second
 * pass adds the partials of each group in block order, in parallel over tokens. No result
 * depends on which thread ran which item, so results are bitwise identical for every thread
 * count.
 *
 * Extra memory (floats):
 *     2 * n_blocks * B*T * N      dB/dC partials, only for groups of more than SSM_LANES
 *                                 channels (n_blocks = G * ceil((D/G) / SSM_LANES)) or with
 *                                 channel_first (the reduce pass writes [B,G,N,T])
 *   + n_threads * (ceil(L / SEGMENT) + 2 * SEGMENT) * SSM_LANES * N
 *                                 checkpoints of the longest sequence L, and the segment's
 *                                 states and decays (about 4.7 MB per thread at L = 64k,
 *                                 N = 16), plus O(SSM_LANES * (N + SEGMENT)) small buffers.
 * Keeping the decays costs one extra segment buffer and saves recomputing one exp per state
 * update in the reverse walk, the dominant cost.
 *
 * Training (linseq_ssm1_forward_train, then linseq_ssm1_backward_saved): the forward writes
 * the checkpoints as it passes them (ssm1_saved.c), with the same arithmetic, so the backward
 * reads them instead of running its checkpoint pass (one exp per token, channel and state)
 * and keeps a single checkpoint tile per thread. */
#include <stdbool.h>
#include <stdlib.h>

#include "core/parallel.h"
#include "core/scratch.h"
#include "core/validate.h"
#include "ssm/ssm_internal.h"
#include "ssm/ssm_kernels.h"

/* The per-thread workspace in floats (its layout: ssm1_bwd_plan); false when the count does
 * not fit in int64_t. */
static bool thread_floats_of(int64_t N, int64_t max_segments, int64_t *floats)
{
    const int64_t rows16 = (N + 15) / 16 * 16;
    /* the [SEGMENT][L] rows, and the dB/dC sums and B/C tiles (multiples of rows16) */
    const int64_t lane_rows =
        ((SSM1_BWD_SEG_ROWS + SSM1_BWD_LAYOUT_ROWS) * SSM_BWD_SEGMENT + 4) * SSM_LANES;
    int64_t tiles, tile_floats;
    if (max_segments > INT64_MAX / 4 - 2 * SSM_BWD_SEGMENT - 4) return false;
    if (!ls_mul_ok(&tiles, 2, max_segments + 2 * SSM_BWD_SEGMENT + 4, N) ||
        !ls_mul_ok(&tile_floats, 2, tiles, (int64_t)SSM_LANES) ||
        rows16 > INT64_MAX / (4 * SSM_BWD_SEGMENT) ||
        tile_floats > INT64_MAX - (32 + 2 * SSM_BWD_SEGMENT) * rows16 - lane_rows)
        return false;
    *floats = tile_floats + (32 + 2 * SSM_BWD_SEGMENT) * rows16 + lane_rows;
    return true;
}

/* The backward; with saved (the forward's checkpoints, laid out by `first`) it skips the
 * checkpoint pass and keeps one checkpoint tile per thread. */
static linseq_status scan_backward(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                   const ssm_kernels *kern, const float *saved,
                                   const int64_t *first, const float *d_y, const float *d_hT,
                                   const linseq_ssm1_grads *grads)
{
    ssm1_bwd_plan pl = {
        .p = p, .d_y = d_y, .d_hT = d_hT, .grads = grads, .saved = saved, .saved_first = first};
    pl.G = p->G ? p->G : 1;
    pl.channels_per_group = p->D / pl.G;
    pl.blocks_per_group = (pl.channels_per_group + SSM_LANES - 1) / SSM_LANES;
    pl.n_blocks = pl.G * pl.blocks_per_group;
    pl.n_tokens = p->B * p->T;
    pl.gate_act = ssm1_gate_activation(p);
    const bool cf = p->channel_first;
    pl.x = ssm_view_of(p->x, p->x_strides, cf, p->T, p->D, 1);
    pl.dt = ssm_view_of(p->dt, p->dt_strides, cf, p->T, p->D, 1);
    pl.gate = ssm_view_of(p->gate, p->gate_strides, cf, p->T, p->D, 1);
    pl.B = ssm_view_of(p->B_proj, p->B_strides, cf, p->T, pl.G, p->N);
    pl.C = ssm_view_of(p->C_proj, p->C_strides, cf, p->T, pl.G, p->N);
    pl.dy = ssm_view_of(d_y, (linseq_strides){0}, cf, p->T, p->D, 1);
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    const int64_t longest = ls_longest_sequence(p->cu_seqlens, n_seqs, p->T);
    pl.max_segments = longest > 0 && !saved ? (longest + SSM_BWD_SEGMENT - 1) / SSM_BWD_SEGMENT : 1;

    const int n_threads = ls_resolve_threads(
        exec, pl.n_blocks, 40.0 * (double)p->B * (double)p->T * (double)p->D * (double)p->N);

    /* Per thread, rounded up to 64 bytes so that threads never share a cache line (every
     * part is a multiple of 16 floats). A size this cannot represent could not be allocated
     * either. */
    int64_t thread_floats, total_bytes, partial_bytes = 0;
    if (!thread_floats_of(p->N, pl.max_segments, &thread_floats) ||
        !ls_mul_ok(&total_bytes, 3, thread_floats, (int64_t)n_threads, (int64_t)sizeof(float)))
        return LINSEQ_ERR_OUT_OF_MEMORY;
    /* channel_first: the blocks write [tokens][N] partials, and the reduce pass lays them out */
    const bool partials = pl.blocks_per_group > 1 || cf;
    if (partials &&
        !ls_mul_ok(&partial_bytes, 4, pl.n_blocks, pl.n_tokens, p->N, (int64_t)sizeof(float)))
        return LINSEQ_ERR_OUT_OF_MEMORY;

    pl.thread_floats = (size_t)thread_floats;
    pl.workspace = ls_scratch_alloc((size_t)total_bytes);
    if (partials && grads->dB_proj) pl.dB_partial = ls_scratch_alloc((size_t)partial_bytes);
    if (partials && grads->dC_proj) pl.dC_partial = ls_scratch_alloc((size_t)partial_bytes);
    if (!pl.workspace || (partials && grads->dB_proj && !pl.dB_partial) ||
        (partials && grads->dC_proj && !pl.dC_partial)) {
        /* not kept: a failed call's memory is what a caller short of it needs back */
        ls_scratch_discard(pl.workspace);
        ls_scratch_discard(pl.dB_partial);
        ls_scratch_discard(pl.dC_partial);
        return LINSEQ_ERR_OUT_OF_MEMORY;
    }

    ls_parallel_for(pl.n_blocks, n_threads, kern->ssm1_bwd_item, &pl);
    if (pl.dB_partial || pl.dC_partial) {
        const int64_t n_chunks = (pl.n_tokens + SSM1_REDUCE_TOKENS - 1) / SSM1_REDUCE_TOKENS;
        const int reduce_threads = ls_resolve_threads(
            exec, n_chunks, 2.0 * (double)pl.n_tokens * (double)p->D / SSM_LANES * p->N);
        ls_parallel_for(n_chunks, reduce_threads, kern->ssm1_bwd_reduce_item, &pl);
    }
    /* kept for the next call: a training step's backward follows the last one's */
    ls_scratch_free(pl.workspace);
    ls_scratch_free(pl.dB_partial);
    ls_scratch_free(pl.dC_partial);
    return LINSEQ_OK;
}

linseq_status ls_ssm1_scan_backward(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                    const ssm_kernels *kern, const float *d_y, const float *d_hT,
                                    const linseq_ssm1_grads *grads)
{
    return scan_backward(p, exec, kern, NULL, NULL, d_y, d_hT, grads);
}

linseq_status ls_ssm1_scan_backward_saved(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                          const ssm_kernels *kern, const float *saved,
                                          const int64_t *first, const float *d_y, const float *d_hT,
                                          const linseq_ssm1_grads *grads)
{
    return scan_backward(p, exec, kern, saved, first, d_y, d_hT, grads);
}
