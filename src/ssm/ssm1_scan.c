/* The SSM1 forward driver: splits a validated problem into (sequence, block of SSM_LANES
 * channels) items, sizes the per-thread tiles and runs the kernel of the requested ISA
 * (ssm1_scan_simd.c) over the items. Every item runs the same arithmetic whichever thread
 * takes it, so the result does not depend on the thread count. */
#include <stdlib.h>

#include "core/parallel.h"
#include "core/scratch.h"
#include "core/validate.h"
#include "ssm/ssm_internal.h"
#include "ssm/ssm_kernels.h"

/* Tokens per sequence below which blocks are grouped into larger work items. */
#define SHORT_TOKENS 16

/* The views of the per-token inputs, and how many groups a B/C tile holds (0: none). */
static void plan_layouts(ssm1_scan_plan *pl)
{
    const linseq_ssm1_problem *p = pl->p;
    const bool cf = p->channel_first;
    pl->x = ssm_view_of(p->x, p->x_strides, cf, p->T, p->D, 1);
    pl->dt = ssm_view_of(p->dt, p->dt_strides, cf, p->T, p->D, 1);
    pl->gate = ssm_view_of(p->gate, p->gate_strides, cf, p->T, p->D, 1);
    pl->B = ssm_view_of(p->B_proj, p->B_strides, cf, p->T, pl->G, p->N);
    pl->C = ssm_view_of(p->C_proj, p->C_strides, cf, p->T, pl->G, p->N);
    /* A block of SSM_LANES channels spans at most this many groups. */
    const int64_t spanned = pl->channels_per_group >= SSM_LANES ? 2 : SSM_LANES;
    const bool packed = pl->B.state != 1 || pl->C.state != 1;
    pl->bc_groups = packed ? (pl->G < spanned ? pl->G : spanned) : 0;
}

static linseq_status scan(ssm1_scan_plan pl, const linseq_exec *exec, const ssm_kernels *kern)
{
    const linseq_ssm1_problem *p = pl.p;
    pl.G = p->G ? p->G : 1;
    pl.channels_per_group = p->D / pl.G;
    pl.n_blocks = (p->D + SSM_LANES - 1) / SSM_LANES;
    pl.gate_act = ssm1_gate_activation(p);
    plan_layouts(&pl);
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    const int n_threads =
        ls_resolve_threads(exec, n_seqs * pl.n_blocks,
                           16.0 * (double)p->B * (double)p->T * (double)p->D * (double)p->N);
    /* A block of few tokens (decode) takes about as long as handing out a work item (an atomic
     * on a counter the threads share): such calls group blocks, keeping 4 items per thread
     * for balance. Results do not depend on the grouping. */
    pl.blocks_per_item = 1;
    if (p->T < SHORT_TOKENS && n_threads > 1)
        pl.blocks_per_item = pl.n_blocks / (4 * n_threads) > 1 ? pl.n_blocks / (4 * n_threads) : 1;
    const int64_t n_items = n_seqs * ((pl.n_blocks + pl.blocks_per_item - 1) / pl.blocks_per_item);

    /* Per thread: the tiles and step inputs, a multiple of 64 bytes so that threads never share
     * a cache line. A size this cannot represent could not be allocated either. */
    int64_t thread_floats, total_bytes;
    if (p->N > INT64_MAX / (8 * SSM_LANES) / (2 * SSM1_SCAN_PACK + 4))
        return LINSEQ_ERR_OUT_OF_MEMORY;
    thread_floats = SSM1_SCAN_FLOATS(p->N, pl.bc_groups);
    if (!ls_mul_ok(&total_bytes, 3, thread_floats, (int64_t)n_threads, (int64_t)sizeof(float)))
        return LINSEQ_ERR_OUT_OF_MEMORY;
    pl.thread_floats = (size_t)thread_floats;
    pl.workspace = ls_scratch_alloc((size_t)total_bytes);
    if (!pl.workspace) return LINSEQ_ERR_OUT_OF_MEMORY;

    /* decode: the same channels on the same core every call, so the state stays in its cache */
    if (p->T < SHORT_TOKENS)
        ls_parallel_for_static(n_items, n_threads, kern->ssm1_scan_item, &pl);
    else
        ls_parallel_for(n_items, n_threads, kern->ssm1_scan_item, &pl);
    ls_scratch_free(pl.workspace); /* kept for the next call (core/scratch.h) */
    return LINSEQ_OK;
}

linseq_status ls_ssm1_scan(const linseq_ssm1_problem *p, const linseq_exec *exec,
                           const ssm_kernels *kern, float *y, float *hT)
{
    return scan((ssm1_scan_plan){.p = p, .y = y, .hT = hT}, exec, kern);
}

linseq_status ls_ssm1_scan_train(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                 const ssm_kernels *kern, float *y, float *hT, float *saved,
                                 const int64_t *first)
{
    return scan((ssm1_scan_plan){.p = p, .y = y, .hT = hT, .saved = saved, .saved_first = first},
                exec, kern);
}

linseq_status ls_ssm1_scan_pool(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                const ssm_kernels *kern, float *y, float *pool, const int64_t *rows)
{
    return scan((ssm1_scan_plan){.p = p, .y = y, .pool = pool, .pool_rows = rows}, exec, kern);
}
