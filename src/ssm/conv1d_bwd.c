/* The fast float32 backward of the causal depthwise conv1d.
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
 * A work item is a block of SSM_LANES channels that walks every sequence in order: it owns its
 * channels of dweight and dbias and sums them in a fixed order, so results are bitwise
 * identical for every thread count. Extra memory: (5W + 3) * SSM_LANES floats per
 * thread. */
#include <stdlib.h>
#include <string.h>

#include "core/activation.h"
#include "core/parallel.h"
#include "core/validate.h"
#include "ssm/ssm_internal.h"

/* Tokens summed into dweight and dbias before they join the running totals: a float32
 * running sum over T tokens drifts by up to ~T ulp, two levels by ~(SUM_SEGMENT + T /
 * SUM_SEGMENT). */
#define SUM_SEGMENT 64

typedef struct conv_bwd_plan {
    const linseq_conv1d_problem *p;
    const float *d_y, *d_state_out;
    const linseq_conv1d_grads *grads;
    int64_t n_blocks;
    linseq_activation act;
    float *workspace;
    size_t thread_floats;
} conv_bwd_plan;

/* One thread's buffers, [rows][SSM_LANES] each. */
typedef struct conv_bwd_tile {
    float *taps;       /* [W] weight of the block, transposed                            */
    float *ring;       /* [W] g of the last W tokens: g_t in row t % W                   */
    float *dw_sum;     /* [W] dweight over all tokens                                    */
    float *dw_seg;     /* [W] over the current SUM_SEGMENT tokens                        */
    float *state_cols; /* [W-1] conv_state of the current sequence, transposed           */
    float *pre, *dxs, *db_sum, *db_seg;
} conv_bwd_tile;

static conv_bwd_tile tile_of_thread(const conv_bwd_plan *pl, int thread)
{
    const int64_t W = pl->p->W;
    float *w = pl->workspace + (size_t)thread * pl->thread_floats;
    conv_bwd_tile tl;
    tl.taps = w;
    tl.ring = w + W * SSM_LANES;
    tl.dw_sum = w + 2 * W * SSM_LANES;
    tl.dw_seg = w + 3 * W * SSM_LANES;
    tl.state_cols = w + 4 * W * SSM_LANES;
    w += (5 * W - 1) * SSM_LANES;
    tl.pre = w;
    tl.dxs = w + SSM_LANES;
    tl.db_sum = w + 2 * SSM_LANES;
    tl.db_seg = w + 3 * SSM_LANES;
    return tl;
}

/* acc += a * b over the lanes. Called with lanes == SSM_LANES (a literal) for full blocks: a
 * constant trip count after inlining, which gcc vectorises at -O2. */
static inline void add_products(int64_t lanes, float *restrict acc, const float *restrict a,
                                const float *restrict b)
{
    for (int64_t l = 0; l < lanes; l++) acc[l] += a[l] * b[l];
}

static inline void add_and_clear(int64_t lanes, float *restrict sum, float *restrict part)
{
    for (int64_t l = 0; l < lanes; l++) {
        sum[l] += part[l];
        part[l] = 0.0f;
    }
}

typedef struct conv_block {
    int64_t d0, lanes;
    bool full;
} conv_block;

static void add_block(const conv_block *bk, float *acc, const float *a, const float *b)
{
    if (bk->full)
        add_products(SSM_LANES, acc, a, b);
    else
        add_products(bk->lanes, acc, a, b);
}

/* xs[k] of the block's lanes in sequence `seq` starting at token `start`. */
static const float *padded_row(const conv_bwd_plan *pl, const conv_bwd_tile *tl,
                               const conv_block *bk, int64_t start, int64_t k)
{
    const int64_t W = pl->p->W;
    if (k < W - 1) return tl->state_cols + k * SSM_LANES;
    return pl->p->x + (start + k - (W - 1)) * pl->p->D + bk->d0;
}

/* Writes dxs[k] (tl->dxs) where it belongs: dconv_state for k < W-1, else dx. */
static void store_dxs(const conv_bwd_plan *pl, const conv_bwd_tile *tl, const conv_block *bk,
                      int64_t seq, int64_t start, int64_t k)
{
    const int64_t D = pl->p->D, W = pl->p->W;
    if (k < W - 1) {
        float *dstate = pl->grads->dconv_state;
        if (dstate)
            for (int64_t l = 0; l < bk->lanes; l++)
                dstate[(seq * D + bk->d0 + l) * (W - 1) + k] = tl->dxs[l];
    } else if (pl->grads->dx) {
        memcpy(pl->grads->dx + (start + k - (W - 1)) * D + bk->d0, tl->dxs,
               (size_t)bk->lanes * sizeof(float));
    }
}

/* dxs[k] = sum over j in [j_first, j_last] of weight[j] g_{k-j}, j ascending. */
static void gather_dxs(const conv_bwd_plan *pl, const conv_bwd_tile *tl, const conv_block *bk,
                       int64_t k, int64_t j_first, int64_t j_last)
{
    const int64_t W = pl->p->W;
    memset(tl->dxs, 0, SSM_LANES * sizeof(float));
    for (int64_t j = j_first; j <= j_last; j++)
        add_block(bk, tl->dxs, tl->taps + j * SSM_LANES, tl->ring + (k - j) % W * SSM_LANES);
}

static void backward_sequence(const conv_bwd_plan *pl, const conv_bwd_tile *tl,
                              const conv_block *bk, int64_t seq)
{
    const linseq_conv1d_problem *p = pl->p;
    const int64_t D = p->D, W = p->W, d0 = bk->d0, lanes = bk->lanes;
    int64_t start, len;
    ssm_seq_range(p->cu_seqlens, p->T, seq, &start, &len);
    const float *state = W > 1 && p->conv_state ? p->conv_state + (seq * D + d0) * (W - 1) : NULL;
    for (int64_t l = 0; l < lanes; l++)
        for (int64_t k = 0; k < W - 1; k++)
            tl->state_cols[k * SSM_LANES + l] = state ? state[l * (W - 1) + k] : 0.0f;

    for (int64_t t = 0; t < len; t++) {
        const float *d_y = pl->d_y + (start + t) * D + d0;
        float *g = tl->ring + t % W * SSM_LANES;
        if (pl->act == LINSEQ_ACT_IDENTITY) {
            memcpy(g, d_y, (size_t)lanes * sizeof(float));
        } else {
            for (int64_t l = 0; l < lanes; l++) tl->pre[l] = p->bias ? p->bias[d0 + l] : 0.0f;
            for (int64_t j = 0; j < W; j++)
                add_block(bk, tl->pre, tl->taps + j * SSM_LANES,
                          padded_row(pl, tl, bk, start, t + j));
            for (int64_t l = 0; l < lanes; l++)
                g[l] = d_y[l] * ls_activate_gradf(pl->act, tl->pre[l]);
        }
        for (int64_t l = 0; l < lanes; l++) tl->db_seg[l] += g[l];
        for (int64_t j = 0; j < W; j++)
            add_block(bk, tl->dw_seg + j * SSM_LANES, g, padded_row(pl, tl, bk, start, t + j));
        gather_dxs(pl, tl, bk, t, 0, t < W - 1 ? t : W - 1);
        store_dxs(pl, tl, bk, seq, start, t);
        if ((t + 1) % SUM_SEGMENT == 0 || t + 1 == len) {
            for (int64_t j = 0; j < W; j++)
                add_and_clear(lanes, tl->dw_sum + j * SSM_LANES, tl->dw_seg + j * SSM_LANES);
            add_and_clear(lanes, tl->db_sum, tl->db_seg);
        }
    }

    /* The last W-1 positions of xs: what remains of the sum, then the gradient of
     * conv_state_out, which copies them. */
    const float *d_state_out = pl->d_state_out ? pl->d_state_out + (seq * D + d0) * (W - 1) : NULL;
    for (int64_t k = len; k < len + W - 1; k++) {
        gather_dxs(pl, tl, bk, k, k - len + 1, k < W - 1 ? k : W - 1);
        if (d_state_out)
            for (int64_t l = 0; l < lanes; l++) tl->dxs[l] += d_state_out[l * (W - 1) + k - len];
        store_dxs(pl, tl, bk, seq, start, k);
    }
}

static void backward_item(void *ctx, int64_t item, int thread)
{
    const conv_bwd_plan *pl = ctx;
    const linseq_conv1d_problem *p = pl->p;
    const int64_t D = p->D, W = p->W;
    const conv_bwd_tile tl = tile_of_thread(pl, thread);
    conv_block bk;
    bk.d0 = item * SSM_LANES;
    bk.lanes = D - bk.d0 < SSM_LANES ? D - bk.d0 : SSM_LANES;
    bk.full = bk.lanes == SSM_LANES;

    memset(tl.taps, 0, pl->thread_floats * sizeof(float));
    for (int64_t l = 0; l < bk.lanes; l++)
        for (int64_t j = 0; j < W; j++) tl.taps[j * SSM_LANES + l] = p->weight[(bk.d0 + l) * W + j];

    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    for (int64_t seq = 0; seq < n_seqs; seq++) backward_sequence(pl, &tl, &bk, seq);

    for (int64_t l = 0; l < bk.lanes; l++) {
        const int64_t d = bk.d0 + l;
        if (pl->grads->dweight)
            for (int64_t j = 0; j < W; j++)
                pl->grads->dweight[d * W + j] = tl.dw_sum[j * SSM_LANES + l];
        if (pl->grads->dbias) pl->grads->dbias[d] = tl.db_sum[l];
    }
}

linseq_status ls_conv1d_scan_backward(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                      const float *d_y, const float *d_conv_state_out,
                                      const linseq_conv1d_grads *grads)
{
    conv_bwd_plan pl = {.p = p, .d_y = d_y, .d_state_out = d_conv_state_out, .grads = grads,
                        .act = conv1d_activation(p)};
    pl.n_blocks = (p->D + SSM_LANES - 1) / SSM_LANES;
    const int n_threads = ls_resolve_threads(
        exec, pl.n_blocks, 6.0 * (double)p->B * (double)p->T * (double)p->D * (double)p->W);

    /* Rounded up to 64 bytes so that threads never share a cache line. */
    int64_t thread_floats, total_bytes;
    if (p->W > INT64_MAX / SSM_LANES / 5 - 4) return LINSEQ_ERR_OUT_OF_MEMORY;
    thread_floats = ((5 * p->W + 3) * SSM_LANES + 15) / 16 * 16;
    if (!ls_mul_ok(&total_bytes, 3, thread_floats, (int64_t)n_threads, (int64_t)sizeof(float)))
        return LINSEQ_ERR_OUT_OF_MEMORY;
    pl.thread_floats = (size_t)thread_floats;
    pl.workspace = aligned_alloc(64, (size_t)total_bytes);
    if (!pl.workspace) return LINSEQ_ERR_OUT_OF_MEMORY;

    ls_parallel_for(pl.n_blocks, n_threads, backward_item, &pl);
    free(pl.workspace);
    return LINSEQ_OK;
}
