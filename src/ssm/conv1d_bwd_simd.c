/* The causal depthwise conv1d backward kernel, compiled once per ISA (the algorithm is
 * described in conv1d_bwd.c): one work item is a few consecutive blocks of SSM_LANES channels
 * walking every sequence in order, the blocks side by side per token; lanes are channels.
 *
 * Per token and strip of VW channels: the pre-activation recomputed with the forward's
 * arithmetic (so bitwise the forward's), g = d_y act'(pre), the dweight and dbias sums, and
 * dxs[t] = sum_j weight[j] g_{t-j} from a ring of the latest rows of g. */
#include <string.h>

#include "ssm/ssm_kernels.h"
#include "ssm/ssm_vec.h"

/* How far ahead the rows of x, d_y and dx are prefetched: a token of a block takes tens of
 * cycles, a row from L3 or memory hundreds (see ls_prefetch_row). */
#define PREFETCH_TOKENS 8

/* Tokens summed into dweight and dbias before they join the running totals: a float32
 * running sum over T tokens drifts by up to ~T ulp, two levels by ~(SUM_SEGMENT + T /
 * SUM_SEGMENT). */
#define SUM_SEGMENT 64

/* One block's buffers, [rows][SSM_LANES] each. */
typedef struct conv_bwd_tile {
    float *taps;       /* [W] weight of the block, transposed */
    float *dw_sum;     /* [W] dweight over all tokens */
    float *dw_seg;     /* [W] over the current SUM_SEGMENT tokens */
    float *state_cols; /* [W-1] conv_state of the current sequence, transposed */
    float *db_sum, *db_seg;
    float *ring; /* [pl->ring] g of the latest tokens: g_t in row t & (pl->ring - 1) */
} conv_bwd_tile;

/* Block b of the thread's item (its rows: CONV1D_BWD_ROWS(W, ring) of SSM_LANES floats). */
static conv_bwd_tile tile_of_block(const conv1d_plan *pl, int thread, int64_t b)
{
    const int64_t W = pl->p->W;
    float *w = pl->workspace + (size_t)thread * pl->thread_floats +
               (size_t)b * (size_t)(CONV1D_BWD_ROWS(W, pl->ring) * SSM_LANES);
    conv_bwd_tile tl;
    tl.taps = w;
    tl.dw_sum = w + W * SSM_LANES;
    tl.dw_seg = w + 2 * W * SSM_LANES;
    tl.state_cols = w + 3 * W * SSM_LANES;
    tl.db_sum = w + (4 * W - 1) * SSM_LANES;
    tl.db_seg = tl.db_sum + SSM_LANES;
    tl.ring = tl.db_seg + SSM_LANES;
    return tl;
}

typedef struct conv_block {
    int64_t d0, lanes;
} conv_block;

/* xs[k] of the block's lanes, strip s: the state for k < W-1, else x. */
LS_INLINE vf padded_input(const conv1d_plan *pl, const conv_bwd_tile *tl, const conv_block *bk,
                          int64_t start, int64_t k, int64_t s)
{
    const int64_t W = pl->p->W;
    if (k < W - 1) return vf_load(tl->state_cols + k * SSM_LANES + s * VW);
    return vf_load_part(pl->p->x + (start + k - (W - 1)) * pl->p->D + bk->d0 + s * VW,
                        bk->lanes - s * VW);
}

/* Writes dxs[k] of strip s where it belongs: dconv_state for k < W-1, else dx. */
LS_INLINE void store_dxs(const conv1d_plan *pl, const conv_block *bk, int64_t seq, int64_t start,
                         int64_t k, int64_t s, vf v)
{
    const int64_t D = pl->p->D, W = pl->p->W, valid = bk->lanes - s * VW;
    if (k < W - 1) {
        float *dstate = pl->grads->dconv_state;
        if (!dstate) return;
        float lane[VW];
        vf_store(lane, v);
        for (int64_t l = 0; l < VW && l < valid; l++)
            dstate[(seq * D + bk->d0 + s * VW + l) * (W - 1) + k] = lane[l];
    } else if (pl->grads->dx) {
        vf_store_part(pl->grads->dx + (start + k - (W - 1)) * D + bk->d0 + s * VW, v, valid);
    }
}

/* sum_{j = j_first .. j_last} weight[j] g_{k-j}, j ascending, for strip s. */
LS_INLINE vf gather_dxs(const conv_bwd_tile *tl, int64_t mask, int64_t k, int64_t j_first,
                        int64_t j_last, int64_t s)
{
    vf acc = vf_zero();
    for (int64_t j = j_first; j <= j_last; j++)
        acc = vf_fmadd(vf_load(tl->taps + j * SSM_LANES + s * VW),
                       vf_load(tl->ring + ((k - j) & mask) * SSM_LANES + s * VW), acc);
    return acc;
}

/* dweight and dbias of the segment just finished join the running sums. */
static inline void flush_sums(const conv_bwd_tile *tl, int64_t W)
{
    for (int64_t i = 0; i < (W + 1) * SSM_LANES; i += VW) {
        /* dw_sum/dw_seg rows j, then db_sum/db_seg: the same add and clear */
        float *sum = i < W * SSM_LANES ? tl->dw_sum + i : tl->db_sum + (i - W * SSM_LANES);
        float *part = i < W * SSM_LANES ? tl->dw_seg + i : tl->db_seg + (i - W * SSM_LANES);
        vf_store(sum, vf_add(vf_load(sum), vf_load(part)));
        vf_store(part, vf_zero());
    }
}

/* Token t of a sequence, any block and any t: the general form of bwd_span's loop body. */
static void backward_token(const conv1d_plan *pl, const conv_bwd_tile *tl, const conv_block *bk,
                           int64_t seq, int64_t start, int64_t t)
{
    const linseq_conv1d_problem *p = pl->p;
    const int64_t D = p->D, W = p->W, d0 = bk->d0, lanes = bk->lanes;
    const float *d_y = pl->d_y + (start + t) * D + d0;
    float *g = tl->ring + (t & (pl->ring - 1)) * SSM_LANES;
    for (int64_t s = 0; s < STRIPS; s++) {
        const int64_t valid = lanes - s * VW;
        vf gv = vf_load_part(d_y + s * VW, valid);
        if (pl->act != LINSEQ_ACT_IDENTITY) {
            vf pre = p->bias ? vf_load_part(p->bias + d0 + s * VW, valid) : vf_zero();
            for (int64_t j = 0; j < W; j++)
                pre = vf_fmadd(vf_load(tl->taps + j * SSM_LANES + s * VW),
                               padded_input(pl, tl, bk, start, t + j, s), pre);
            gv = vf_mul(gv, vf_act_grad(pl->act, pre));
        }
        vf_store(g + s * VW, gv);
        vf_store(tl->db_seg + s * VW, vf_add(vf_load(tl->db_seg + s * VW), gv));
        for (int64_t j = 0; j < W; j++) {
            float *dw = tl->dw_seg + j * SSM_LANES + s * VW;
            vf_store(dw, vf_fmadd(gv, padded_input(pl, tl, bk, start, t + j, s), vf_load(dw)));
        }
        store_dxs(pl, bk, seq, start, t, s,
                  gather_dxs(tl, pl->ring - 1, t, 0, t < W - 1 ? t : W - 1, s));
    }
}

/* Tokens [t0, t1) of `nb` consecutive full blocks (their tiles in tls, the first at channel
 * d0) with t0 >= W-1, so that every tap reads x and every g of the ring is set: backward_token's
 * arithmetic in the same order, inlined with W and act constants (see run_full_blocks) so that
 * the taps fold and the activation's slope is straight-line code. CONV1D_BWD_CHUNK tokens at a
 * time, in two passes: g of every token first (the activation's slope, independent from token
 * to token, so its latency overlaps), then the sums and dx, which read g from the ring. The
 * blocks run side by side per token, so that a token's rows are read and written
 * contiguously. */
LS_INLINE void bwd_span(const conv1d_plan *pl, const conv_bwd_tile *tls, int64_t nb, int64_t W,
                        linseq_activation act, int64_t start, int64_t t0, int64_t t1, int64_t len,
                        int64_t d0)
{
    const linseq_conv1d_problem *p = pl->p;
    const int64_t D = p->D, mask = pl->ring - 1;
    float *dx = pl->grads->dx;
    for (int64_t c0 = t0; c0 < t1; c0 += CONV1D_BWD_CHUNK) {
        const int64_t c1 = t1 - c0 < CONV1D_BWD_CHUNK ? t1 : c0 + CONV1D_BWD_CHUNK;
        for (int64_t t = c0; t < c1; t++) {
            if (t + PREFETCH_TOKENS < t1) {
                for (int64_t b = 0; b < nb; b++) {
                    const int64_t ahead = (start + t + PREFETCH_TOKENS) * D + d0 + b * SSM_LANES;
                    ls_prefetch_row(p->x + ahead);
                    ls_prefetch_row(pl->d_y + ahead);
                    if (dx) ls_prefetch_row_for_write(dx + ahead - (W - 1) * D);
                }
            }
            for (int64_t b = 0; b < nb; b++) {
                const conv_bwd_tile *tl = &tls[b];
                const int64_t c = d0 + b * SSM_LANES;
                const float *x0 = p->x + (start + t - (W - 1)) * D + c; /* xs[t]: tap 0's row */
                const float *d_y = pl->d_y + (start + t) * D + c;
                float *g = tl->ring + (t & mask) * SSM_LANES;
                LS_UNROLL_STRIPS
                for (int64_t s = 0; s < STRIPS; s++) {
                    vf gv = vf_load(d_y + s * VW);
                    if (act != LINSEQ_ACT_IDENTITY) {
                        vf pre = p->bias ? vf_load(p->bias + c + s * VW) : vf_zero();
                        for (int64_t j = 0; j < W; j++)
                            pre = vf_fmadd(vf_load(tl->taps + j * SSM_LANES + s * VW),
                                           vf_load(x0 + j * D + s * VW), pre);
                        gv = vf_mul(gv, vf_act_grad(act, pre));
                    }
                    vf_store(g + s * VW, gv);
                }
            }
        }
        for (int64_t t = c0; t < c1; t++) {
            for (int64_t b = 0; b < nb; b++) {
                const conv_bwd_tile *tl = &tls[b];
                const int64_t c = d0 + b * SSM_LANES;
                const float *x0 = p->x + (start + t - (W - 1)) * D + c;
                const float *g = tl->ring + (t & mask) * SSM_LANES;
                LS_UNROLL_STRIPS
                for (int64_t s = 0; s < STRIPS; s++) {
                    const vf gv = vf_load(g + s * VW);
                    vf_store(tl->db_seg + s * VW, vf_add(vf_load(tl->db_seg + s * VW), gv));
                    vf acc = vf_zero();
                    for (int64_t j = 0; j < W; j++) {
                        float *dw = tl->dw_seg + j * SSM_LANES + s * VW;
                        vf_store(dw, vf_fmadd(gv, vf_load(x0 + j * D + s * VW), vf_load(dw)));
                        acc = vf_fmadd(vf_load(tl->taps + j * SSM_LANES + s * VW),
                                       vf_load(tl->ring + ((t - j) & mask) * SSM_LANES + s * VW),
                                       acc);
                    }
                    if (dx) vf_store(dx + (start + t - (W - 1)) * D + c + s * VW, acc);
                }
                if ((t + 1) % SUM_SEGMENT == 0 || t + 1 == len) flush_sums(tl, W);
            }
        }
    }
}

/* bwd_span with W == 4 (Mamba's width) and the activation as constants. */
static void run_full_blocks(const conv1d_plan *pl, const conv_bwd_tile *tls, int64_t nb,
                            int64_t start, int64_t t0, int64_t t1, int64_t len, int64_t d0)
{
    const int64_t W = pl->p->W;
#define BWD_SPAN_FOR(ACT)                                                                          \
    if (W == 4)                                                                                    \
        bwd_span(pl, tls, nb, 4, ACT, start, t0, t1, len, d0);                                     \
    else                                                                                           \
        bwd_span(pl, tls, nb, W, ACT, start, t0, t1, len, d0);                                     \
    break
    switch (pl->act) {
    case LINSEQ_ACT_SILU: BWD_SPAN_FOR(LINSEQ_ACT_SILU);
    case LINSEQ_ACT_SIGMOID: BWD_SPAN_FOR(LINSEQ_ACT_SIGMOID);
    case LINSEQ_ACT_GELU_TANH: BWD_SPAN_FOR(LINSEQ_ACT_GELU_TANH);
    case LINSEQ_ACT_RELU: BWD_SPAN_FOR(LINSEQ_ACT_RELU);
    default: BWD_SPAN_FOR(LINSEQ_ACT_IDENTITY);
    }
#undef BWD_SPAN_FOR
}

/* One sequence for the item's blocks: each block's first W-1 tokens (whose taps may read the
 * state and whose dxs sums fewer taps), and every token of a ragged block, in the general form;
 * the rest of the whole blocks side by side in bwd_span; then each block's last W-1
 * positions of xs. */
static void backward_sequence(const conv1d_plan *pl, const conv_bwd_tile *tls,
                              const conv_block *bks, int64_t nb, int64_t seq)
{
    const linseq_conv1d_problem *p = pl->p;
    const int64_t D = p->D, W = p->W;
    int64_t start, len;
    ssm_seq_range(p->cu_seqlens, p->T, seq, &start, &len);
    const int64_t full = bks[nb - 1].lanes == SSM_LANES ? nb : nb - 1;
    const int64_t head = W - 1 < len ? W - 1 : len;
    for (int64_t b = 0; b < nb; b++) {
        const conv_bwd_tile *tl = &tls[b];
        const conv_block *bk = &bks[b];
        if (W > 1) {
            const float *state =
                p->conv_state ? p->conv_state + (seq * D + bk->d0) * (W - 1) : NULL;
            if (!state || bk->lanes < SSM_LANES)
                memset(tl->state_cols, 0, (size_t)(W - 1) * SSM_LANES * sizeof(float));
            if (state) ls_transpose_copy(tl->state_cols, SSM_LANES, state, W - 1, bk->lanes, W - 1);
        }
        const int64_t last = b < full ? head : len;
        for (int64_t t = 0; t < last; t++) {
            backward_token(pl, tl, bk, seq, start, t);
            if ((t + 1) % SUM_SEGMENT == 0 || t + 1 == len) flush_sums(tl, W);
        }
    }
    if (full && head < len) run_full_blocks(pl, tls, full, start, head, len, len, bks[0].d0);

    /* The last W-1 positions of xs: what remains of the sum, then the gradient of
     * conv_state_out, which copies them. */
    for (int64_t b = 0; b < nb; b++) {
        const conv_bwd_tile *tl = &tls[b];
        const conv_block *bk = &bks[b];
        const float *d_state_out =
            pl->d_state_out ? pl->d_state_out + (seq * D + bk->d0) * (W - 1) : NULL;
        for (int64_t k = len; k < len + W - 1; k++)
            for (int64_t s = 0; s < STRIPS; s++) {
                vf v = gather_dxs(tl, pl->ring - 1, k, k - len + 1, k < W - 1 ? k : W - 1, s);
                if (d_state_out) {
                    float lane[VW];
                    const int64_t valid = bk->lanes - s * VW;
                    for (int64_t l = 0; l < VW; l++)
                        lane[l] = l < valid ? d_state_out[(s * VW + l) * (W - 1) + k - len] : 0.0f;
                    v = vf_add(v, vf_load(lane));
                }
                store_dxs(pl, bk, seq, start, k, s, v);
            }
    }
}

void LS_ISA_FN(ls_conv1d_bwd_item)(void *ctx, int64_t item, int thread)
{
    const conv1d_plan *pl = ctx;
    const linseq_conv1d_problem *p = pl->p;
    const int64_t D = p->D, W = p->W;
    const int64_t b0 = item * pl->blocks_per_item, total = (D + SSM_LANES - 1) / SSM_LANES;
    const int64_t nb = total - b0 < pl->blocks_per_item ? total - b0 : pl->blocks_per_item;
    conv_bwd_tile tls[CONV1D_BWD_MAX_BLOCKS];
    conv_block bks[CONV1D_BWD_MAX_BLOCKS];
    memset(pl->workspace + (size_t)thread * pl->thread_floats, 0,
           pl->thread_floats * sizeof(float));
    for (int64_t b = 0; b < nb; b++) {
        tls[b] = tile_of_block(pl, thread, b);
        bks[b].d0 = (b0 + b) * SSM_LANES;
        bks[b].lanes = D - bks[b].d0 < SSM_LANES ? D - bks[b].d0 : SSM_LANES;
        ls_transpose_copy(tls[b].taps, SSM_LANES, p->weight + bks[b].d0 * W, W, bks[b].lanes, W);
    }

    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    for (int64_t seq = 0; seq < n_seqs; seq++) backward_sequence(pl, tls, bks, nb, seq);

    for (int64_t b = 0; b < nb; b++) {
        if (pl->grads->dweight)
            ls_transpose_copy(pl->grads->dweight + bks[b].d0 * W, W, tls[b].dw_sum, SSM_LANES, W,
                              bks[b].lanes);
        if (pl->grads->dbias)
            memcpy(pl->grads->dbias + bks[b].d0, tls[b].db_sum,
                   (size_t)bks[b].lanes * sizeof(float));
    }
}
