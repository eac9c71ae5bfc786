/* The causal depthwise conv1d backward kernel, compiled once per ISA (the algorithm is
 * described in conv1d_bwd.c): one work item is a few consecutive blocks of SSM_LANES channels
 * walking every sequence in order, the blocks side by side per token; lanes are channels.
 *
 * Per token and strip of VW channels: the pre-activation recomputed with the forward's
 * arithmetic (so bitwise the forward's), g = d_y act'(pre), the dweight and dbias sums, and
 * dxs[t] = sum_j weight[j] g_{t-j} from a ring of the latest rows of g.
 *
 * A sequence is walked CONV1D_BWD_PACK tokens at a time (bwd_rows): x, d_y and dx are read and
 * written as token rows of the item's channels, in place when their channels are contiguous,
 * else through tiles packed before the chunk (x and a channel-first d_y) and written back
 * after it (a channel-first dx); the arithmetic and its order do not depend on the chunking. */
#include <string.h>

#include "ssm/ssm_kernels.h"
#include "ssm/ssm_layout.h"
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
    int64_t col; /* the block's first column in the item's rows */
} conv_block;

/* The item's rows of one chunk of a sequence (column 0 = the item's first channel): x of
 * sequence token u at x + (u - x_first) * x_stride, likewise d_y and dx. */
typedef struct bwd_rows {
    const float *x, *dy;
    float *dx;
    int64_t x_first, x_stride, dy_first, dy_stride, dx_first, dx_stride;
    bool in_place; /* x, d_y and dx all in the tensors themselves */
} bwd_rows;

static inline const float *x_row(const bwd_rows *r, int64_t u)
{
    return r->x + (u - r->x_first) * r->x_stride;
}
static inline const float *dy_row(const bwd_rows *r, int64_t u)
{
    return r->dy + (u - r->dy_first) * r->dy_stride;
}
static inline float *dx_row(const bwd_rows *r, int64_t u)
{
    return r->dx + (u - r->dx_first) * r->dx_stride;
}

/* xs[k] of the block's lanes, strip s: the state for k < W-1, else x. */
LS_INLINE vf padded_input(const conv1d_plan *pl, const bwd_rows *r, const conv_bwd_tile *tl,
                          const conv_block *bk, int64_t k, int64_t s)
{
    const int64_t W = pl->p->W;
    if (k < W - 1) return vf_load(tl->state_cols + k * SSM_LANES + s * VW);
    return vf_load_part(x_row(r, k - (W - 1)) + bk->col + s * VW, bk->lanes - s * VW);
}

/* Writes dxs[k] of strip s where it belongs: dconv_state for k < W-1, else dx. */
LS_INLINE void store_dxs(const conv1d_plan *pl, const bwd_rows *r, const conv_block *bk,
                         int64_t seq, int64_t k, int64_t s, vf v)
{
    const int64_t W = pl->p->W, valid = bk->lanes - s * VW;
    if (k < W - 1) {
        float *dstate = pl->grads->dconv_state;
        if (!dstate) return;
        float lane[VW];
        vf_store(lane, v);
        for (int64_t l = 0; l < VW && l < valid; l++)
            dstate[conv1d_state_at(pl->p, seq, bk->d0 + s * VW + l, k, W - 1)] = lane[l];
    } else if (pl->grads->dx) {
        vf_store_part(dx_row(r, k - (W - 1)) + bk->col + s * VW, v, valid);
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
static void backward_token(const conv1d_plan *pl, const bwd_rows *r, const conv_bwd_tile *tl,
                           const conv_block *bk, int64_t seq, int64_t t)
{
    const linseq_conv1d_problem *p = pl->p;
    const int64_t W = p->W, d0 = bk->d0, lanes = bk->lanes;
    const float *d_y = dy_row(r, t) + bk->col;
    float *g = tl->ring + (t & (pl->ring - 1)) * SSM_LANES;
    for (int64_t s = 0; s < STRIPS; s++) {
        const int64_t valid = lanes - s * VW;
        vf gv = vf_load_part(d_y + s * VW, valid);
        if (pl->act != LINSEQ_ACT_IDENTITY) {
            vf pre = p->bias ? vf_load_part(p->bias + d0 + s * VW, valid) : vf_zero();
            for (int64_t j = 0; j < W; j++)
                pre = vf_fmadd(vf_load(tl->taps + j * SSM_LANES + s * VW),
                               padded_input(pl, r, tl, bk, t + j, s), pre);
            gv = vf_mul(gv, vf_act_grad(pl->act, pre));
        }
        vf_store(g + s * VW, gv);
        vf_store(tl->db_seg + s * VW, vf_add(vf_load(tl->db_seg + s * VW), gv));
        for (int64_t j = 0; j < W; j++) {
            float *dw = tl->dw_seg + j * SSM_LANES + s * VW;
            vf_store(dw, vf_fmadd(gv, padded_input(pl, r, tl, bk, t + j, s), vf_load(dw)));
        }
        store_dxs(pl, r, bk, seq, t, s,
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
LS_INLINE void bwd_span(const conv1d_plan *pl, const bwd_rows *r, const conv_bwd_tile *tls,
                        int64_t nb, int64_t W, linseq_activation act, int64_t t0, int64_t t1,
                        int64_t len, int64_t d0)
{
    const linseq_conv1d_problem *p = pl->p;
    const int64_t mask = pl->ring - 1, xs = r->x_stride;
    const bool dx = pl->grads->dx != NULL;
    for (int64_t c0 = t0; c0 < t1; c0 += CONV1D_BWD_CHUNK) {
        const int64_t c1 = t1 - c0 < CONV1D_BWD_CHUNK ? t1 : c0 + CONV1D_BWD_CHUNK;
        for (int64_t t = c0; t < c1; t++) {
            if (r->in_place && t + PREFETCH_TOKENS < t1) {
                const int64_t ahead = t + PREFETCH_TOKENS;
                for (int64_t b = 0; b < nb; b++) {
                    ls_prefetch_row(x_row(r, ahead) + b * SSM_LANES);
                    ls_prefetch_row(dy_row(r, ahead) + b * SSM_LANES);
                    if (dx) ls_prefetch_row_for_write(dx_row(r, ahead - (W - 1)) + b * SSM_LANES);
                }
            }
            for (int64_t b = 0; b < nb; b++) {
                const conv_bwd_tile *tl = &tls[b];
                const int64_t c = b * SSM_LANES;
                const float *x0 = x_row(r, t - (W - 1)) + c; /* xs[t]: tap 0's row */
                const float *d_y = dy_row(r, t) + c;
                float *g = tl->ring + (t & mask) * SSM_LANES;
                LS_UNROLL_STRIPS
                for (int64_t s = 0; s < STRIPS; s++) {
                    vf gv = vf_load(d_y + s * VW);
                    if (act != LINSEQ_ACT_IDENTITY) {
                        vf pre = p->bias ? vf_load(p->bias + d0 + c + s * VW) : vf_zero();
                        for (int64_t j = 0; j < W; j++)
                            pre = vf_fmadd(vf_load(tl->taps + j * SSM_LANES + s * VW),
                                           vf_load(x0 + j * xs + s * VW), pre);
                        gv = vf_mul(gv, vf_act_grad(act, pre));
                    }
                    vf_store(g + s * VW, gv);
                }
            }
        }
        for (int64_t t = c0; t < c1; t++) {
            for (int64_t b = 0; b < nb; b++) {
                const conv_bwd_tile *tl = &tls[b];
                const int64_t c = b * SSM_LANES;
                const float *x0 = x_row(r, t - (W - 1)) + c;
                const float *g = tl->ring + (t & mask) * SSM_LANES;
                LS_UNROLL_STRIPS
                for (int64_t s = 0; s < STRIPS; s++) {
                    const vf gv = vf_load(g + s * VW);
                    vf_store(tl->db_seg + s * VW, vf_add(vf_load(tl->db_seg + s * VW), gv));
                    vf acc = vf_zero();
                    for (int64_t j = 0; j < W; j++) {
                        float *dw = tl->dw_seg + j * SSM_LANES + s * VW;
                        vf_store(dw, vf_fmadd(gv, vf_load(x0 + j * xs + s * VW), vf_load(dw)));
                        acc = vf_fmadd(vf_load(tl->taps + j * SSM_LANES + s * VW),
                                       vf_load(tl->ring + ((t - j) & mask) * SSM_LANES + s * VW),
                                       acc);
                    }
                    if (dx) vf_store(dx_row(r, t - (W - 1)) + c + s * VW, acc);
                }
                if ((t + 1) % SUM_SEGMENT == 0 || t + 1 == len) flush_sums(tl, W);
            }
        }
    }
}

/* bwd_span with W == 4 (Mamba's width) and the activation as constants. */
static void run_full_blocks(const conv1d_plan *pl, const bwd_rows *r, const conv_bwd_tile *tls,
                            int64_t nb, int64_t t0, int64_t t1, int64_t len, int64_t d0)
{
    const int64_t W = pl->p->W;
#define BWD_SPAN_FOR(ACT)                                                                          \
    if (W == 4)                                                                                    \
        bwd_span(pl, r, tls, nb, 4, ACT, t0, t1, len, d0);                                         \
    else                                                                                           \
        bwd_span(pl, r, tls, nb, W, ACT, t0, t1, len, d0);                                         \
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

/* The thread's tiles after its blocks' rows: x [CONV1D_BWD_PACK + W-1][wide], d_y
 * [CONV1D_BWD_PACK][wide], dx [max(CONV1D_BWD_PACK, W-1)][wide] (wide: the widest item). */
typedef struct bwd_tiles {
    float *x, *dy, *dx;
    int64_t wide;
} bwd_tiles;

/* dx rows from sequence token `first` on: in place when token-major, else the dx tile. */
static void dx_rows_of(const conv1d_plan *pl, const bwd_tiles *tt, int64_t start, int64_t first,
                       int64_t d0, bwd_rows *r)
{
    const linseq_conv1d_problem *p = pl->p;
    float *dx = pl->grads->dx;
    if (dx && p->channel_first)
        r->dx = tt->dx, r->dx_first = first, r->dx_stride = tt->wide;
    else
        r->dx = dx ? dx + start * p->D + d0 : NULL, r->dx_first = 0, r->dx_stride = p->D;
}

/* The rows of tokens [c0, c1) of the sequence from `start`, for the item's `width` channels
 * from d0: x (tokens c0 - (W-1) .. c1 - 1 that exist) and d_y packed when their channels are
 * not contiguous, dx rows c0 - (W-1) .. c1 - W in a tile when channel-first. */
static bwd_rows chunk_rows(const conv1d_plan *pl, const bwd_tiles *tt, int64_t start, int64_t c0,
                           int64_t c1, int64_t d0, int64_t width)
{
    const linseq_conv1d_problem *p = pl->p;
    const int64_t W = p->W, T = p->T, D = p->D;
    const ssm_view *v = &pl->x;
    bwd_rows r;
    r.in_place = !pl->x_tiled && !p->channel_first;
    if (pl->x_tiled) {
        const int64_t lo = c0 > W - 1 ? c0 - (W - 1) : 0, count = c1 - lo;
        const float *src = ssm_view_at(v, T, start + lo, d0);
        if (v->token == 1) {
            ls_transpose_copy(tt->x, tt->wide, src, v->channel, width, count);
        } else {
            for (int64_t k = 0; k < count; k++)
                for (int64_t l = 0; l < width; l++)
                    tt->x[k * tt->wide + l] = src[k * v->token + l * v->channel];
        }
        r.x = tt->x, r.x_first = lo, r.x_stride = tt->wide;
    } else {
        r.x = ssm_view_at(v, T, start, d0), r.x_first = 0, r.x_stride = v->token;
    }
    if (p->channel_first) {
        const float *src = pl->d_y + ((start / T) * D + d0) * T + start % T + c0;
        ls_transpose_copy(tt->dy, tt->wide, src, T, width, c1 - c0);
        r.dy = tt->dy, r.dy_first = c0, r.dy_stride = tt->wide;
    } else {
        r.dy = pl->d_y + start * D + d0, r.dy_first = 0, r.dy_stride = D;
    }
    dx_rows_of(pl, tt, start, c0 - (W - 1), d0, &r);
    return r;
}

/* Writes dx rows [u0, u1) of a tile back to the channel-first dx (nothing in place). */
static void flush_dx(const conv1d_plan *pl, const bwd_rows *r, int64_t start, int64_t u0,
                     int64_t u1, int64_t d0, int64_t width)
{
    const linseq_conv1d_problem *p = pl->p;
    if (!pl->grads->dx || !p->channel_first || u0 >= u1) return;
    const int64_t T = p->T;
    float *dst = pl->grads->dx + ((start / T) * p->D + d0) * T + start % T + u0;
    ls_transpose_copy(dst, T, dx_row(r, u0), r->dx_stride, u1 - u0, width);
}

/* One sequence for the item's blocks, CONV1D_BWD_PACK tokens at a time: each block's first
 * W-1 tokens (whose taps may read the state and whose dxs sums fewer taps), and every token of
 * a ragged block, in the general form; the rest of the whole blocks side by side in bwd_span;
 * then each block's last W-1 positions of xs. Every block meets its tokens in order. */
static void backward_sequence(const conv1d_plan *pl, const bwd_tiles *tt, const conv_bwd_tile *tls,
                              const conv_block *bks, int64_t nb, int64_t seq)
{
    const linseq_conv1d_problem *p = pl->p;
    const int64_t W = p->W, d0 = bks[0].d0;
    const int64_t width = bks[nb - 1].col + bks[nb - 1].lanes;
    int64_t start, len;
    ssm_seq_range(p->cu_seqlens, p->T, seq, &start, &len);
    const int64_t full = bks[nb - 1].lanes == SSM_LANES ? nb : nb - 1;
    const int64_t head = W - 1 < len ? W - 1 : len;
    for (int64_t b = 0; b < nb; b++) {
        const conv_bwd_tile *tl = &tls[b];
        const conv_block *bk = &bks[b];
        if (W > 1) {
            const conv1d_state_strides ss = conv1d_state_layout(p, W - 1);
            const float *state =
                p->conv_state ? p->conv_state + conv1d_state_at(p, seq, bk->d0, 0, W - 1) : NULL;
            if (!state || bk->lanes < SSM_LANES)
                memset(tl->state_cols, 0, (size_t)(W - 1) * SSM_LANES * sizeof(float));
            for (int64_t i = 0; state && i < W - 1; i++)
                for (int64_t l = 0; l < bk->lanes; l++)
                    tl->state_cols[i * SSM_LANES + l] = state[l * ss.channel + i * ss.position];
        }
    }
    for (int64_t c0 = 0; c0 < len; c0 += CONV1D_BWD_PACK) {
        const int64_t c1 = len - c0 < CONV1D_BWD_PACK ? len : c0 + CONV1D_BWD_PACK;
        const bwd_rows r = chunk_rows(pl, tt, start, c0, c1, d0, width);
        for (int64_t b = 0; b < nb; b++) {
            const int64_t last = b < full ? head : len, end = c1 < last ? c1 : last;
            for (int64_t t = c0; t < end; t++) {
                backward_token(pl, &r, &tls[b], &bks[b], seq, t);
                if ((t + 1) % SUM_SEGMENT == 0 || t + 1 == len) flush_sums(&tls[b], W);
            }
        }
        const int64_t lo = c0 > head ? c0 : head;
        if (full && lo < c1) run_full_blocks(pl, &r, tls, full, lo, c1, len, d0);
        flush_dx(pl, &r, start, c0 > W - 1 ? c0 - (W - 1) : 0, c1 - (W - 1), d0, width);
    }

    /* The last W-1 positions of xs: what remains of the sum, then the gradient of
     * conv_state_out, which copies them. */
    bwd_rows tail;
    const conv1d_state_strides ss = conv1d_state_layout(p, W - 1);
    dx_rows_of(pl, tt, start, len - (W - 1), d0, &tail);
    for (int64_t b = 0; b < nb; b++) {
        const conv_bwd_tile *tl = &tls[b];
        const conv_block *bk = &bks[b];
        const float *d_state_out =
            pl->d_state_out ? pl->d_state_out + conv1d_state_at(p, seq, bk->d0, 0, W - 1) : NULL;
        for (int64_t k = len; k < len + W - 1; k++)
            for (int64_t s = 0; s < STRIPS; s++) {
                vf v = gather_dxs(tl, pl->ring - 1, k, k - len + 1, k < W - 1 ? k : W - 1, s);
                if (d_state_out) {
                    float lane[VW];
                    const int64_t valid = bk->lanes - s * VW;
                    for (int64_t l = 0; l < VW; l++)
                        lane[l] =
                            l < valid
                                ? d_state_out[(s * VW + l) * ss.channel + (k - len) * ss.position]
                                : 0.0f;
                    v = vf_add(v, vf_load(lane));
                }
                store_dxs(pl, &tail, bk, seq, k, s, v);
            }
    }
    flush_dx(pl, &tail, start, len > W - 1 ? len - (W - 1) : 0, len, d0, width);
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
    /* the blocks' rows start at zero; the layout tiles after them are written before read */
    const size_t block_floats =
        (size_t)(pl->blocks_per_item * CONV1D_BWD_ROWS(W, pl->ring)) * SSM_LANES;
    float *own = pl->workspace + (size_t)thread * pl->thread_floats;
    memset(own, 0, block_floats * sizeof(float));
    const int64_t wide = pl->blocks_per_item * SSM_LANES;
    const bwd_tiles tt = {own + block_floats, own + block_floats + (CONV1D_BWD_PACK + W - 1) * wide,
                          own + block_floats + (2 * CONV1D_BWD_PACK + W - 1) * wide, wide};
    for (int64_t b = 0; b < nb; b++) {
        tls[b] = tile_of_block(pl, thread, b);
        bks[b].col = b * SSM_LANES;
        bks[b].d0 = (b0 + b) * SSM_LANES;
        bks[b].lanes = D - bks[b].d0 < SSM_LANES ? D - bks[b].d0 : SSM_LANES;
        conv1d_taps_in(tls[b].taps, SSM_LANES, p, bks[b].d0, bks[b].lanes);
    }

    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    for (int64_t seq = 0; seq < n_seqs; seq++) backward_sequence(pl, &tt, tls, bks, nb, seq);

    for (int64_t b = 0; b < nb; b++) {
        if (pl->grads->dweight)
            conv1d_taps_out(pl->grads->dweight, p, bks[b].d0, bks[b].lanes, tls[b].dw_sum,
                            SSM_LANES);
        if (pl->grads->dbias)
            memcpy(pl->grads->dbias + bks[b].d0, tls[b].db_sum,
                   (size_t)bks[b].lanes * sizeof(float));
    }
}
