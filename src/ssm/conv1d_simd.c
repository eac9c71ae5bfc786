/* The causal depthwise conv1d forward kernel, compiled once per ISA: one work item is
 * (sequence, span of CONV1D_SPAN channels, chunk of tokens); lanes are channels.
 *
 * y[t] = act(bias + sum_j tap[j] xs[t + j]): each strip of VW channels starts from the bias
 * and adds the W taps in order with one fma each, then applies the activation in vector form
 * and stores y. The span is swept in blocks of CONV_U tokens: for each strip, the block's
 * CONV_U + W-1 input vectors and the W taps are loaded into registers once, the CONV_U sums
 * (independent chains, which the out-of-order core overlaps through the activation's long
 * dependency) computed, then stored. Rows are read and written in order, strip after strip,
 * so the op moves x and y once; and no load of the block follows a store at the same offset
 * of a page (x and y rows D elements apart alias there whenever D is a multiple of 1024).
 * The taps that reach back before the sequence read the conv state, copied (transposed)
 * into [W-1][span] columns by the item of the sequence's first chunk, which also writes
 * conv_state_out after it has read the state (so conv_state_out == conv_state is safe; no
 * other item reads the state); the first W-1 tokens of a sequence, and any W above REG_W, go
 * one token at a time. A chained call (starting from the previous call's conv_state_out)
 * computes the same sums in the same order as one call.
 *
 * Other layouts: an x whose channels are not contiguous (channel-first, a strided view) is
 * packed for the item's tokens (and the W-1 before them) into a token-major tile first, and a
 * channel-first y is computed into a tile and transposed into place after the item, so the
 * loops below always read and write token rows (conv_rows). A bfloat16 x and y (dense
 * [B,T,D]) are read and written in place: x widened as it is loaded (exactly), y rounded to
 * nearest even as it is stored, the bits of the float32 call on the widened x, rounded. */
#include <string.h>

#include "simd/bf16.h"
#include "ssm/ssm_kernels.h"
#include "ssm/ssm_layout.h"
#include "ssm/ssm_vec.h"

#define SPAN CONV1D_SPAN

/* An item's rows: x of sequence token k (k >= 0) at x + (k - x_first) * x_stride, y of token t
 * at y + (t - y_first) * y_stride; column 0 is the span's first channel. A bfloat16 call reads
 * and writes its [B,T,D] rows in place, through xh and yh (x and y unused). */
typedef struct conv_rows {
    const float *x;
    int64_t x_first, x_stride;
    float *y;
    int64_t y_first, y_stride;
    const uint16_t *xh;
    uint16_t *yh;
} conv_rows;

/* Columns [c, c + VW) of x's row of token k, widened from bf16 when bf16; of a ragged strip
 * (part) the first `valid` lanes, zeros past them. */
LS_INLINE vf load_x(const conv_rows *r, bool bf16, bool part, int64_t k, int64_t c, int64_t valid)
{
    const int64_t at = (k - r->x_first) * r->x_stride + c;
    if (bf16) return part ? vf_load_bf16_n(r->xh + at, valid) : vf_load_bf16(r->xh + at);
    return part ? vf_load_n(r->x + at, valid) : vf_load(r->x + at);
}

LS_INLINE void store_y(const conv_rows *r, bool bf16, bool part, int64_t t, int64_t c,
                       int64_t valid, vf v)
{
    const int64_t at = (t - r->y_first) * r->y_stride + c;
    if (bf16) {
        if (part)
            vf_store_bf16_n(r->yh + at, v, valid);
        else
            vf_store_bf16(r->yh + at, v);
    } else if (part) {
        vf_store_n(r->y + at, v, valid);
    } else {
        vf_store(r->y + at, v);
    }
}

/* Input j of token t's window, the sequence's inputs xs = [conv state (W-1), x]: xs[t + j],
 * from the state's columns cols while t + j < W - 1. */
LS_INLINE vf load_xs(const conv_rows *r, const float *cols, int64_t W, bool bf16, bool part,
                     int64_t i, int64_t c, int64_t valid)
{
    return i < W - 1 ? vf_load(cols + i * SPAN + c) : load_x(r, bf16, part, i - (W - 1), c, valid);
}

#define LS_UNROLL_ALL _Pragma("GCC unroll 16")

/* The widest W whose taps and window stay in registers, and the tokens of one block. */
#define REG_W 4
#define CONV_U 4

/* Tokens [t, t + U) of the strip of VW channels at column c (valid lanes; part: a ragged
 * strip): y[t] = act(bias + sum_j tap[j] xs[t + j]), the taps added in order j = 0 .. W-1 by
 * one fma each. W <= REG_W is a compile-time constant: the U + W-1 inputs the block reads are
 * loaded (and widened from bf16) once, into registers, before any of its U results is
 * stored; the U sums are independent chains for the out-of-order core to overlap. */
LS_INLINE void conv_block(const conv_rows *r, const float *taps, vf b, int64_t W, int64_t U,
                          linseq_activation act, bool bf16, bool part, int64_t t, int64_t c,
                          int64_t valid)
{
    vf in[CONV_U + REG_W - 1], tap[REG_W], acc[CONV_U];
    /* Token t >= W-1: every input is x's, from row t - (W-1) on. */
    const int64_t xs = r->x_stride, x_at = (t - (W - 1) - r->x_first) * xs + c;
    LS_UNROLL_ALL
    for (int64_t i = 0; i < U + W - 1; i++) {
        if (bf16)
            in[i] = part ? vf_load_bf16_n(r->xh + x_at + i * xs, valid)
                         : vf_load_bf16(r->xh + x_at + i * xs);
        else
            in[i] = part ? vf_load_n(r->x + x_at + i * xs, valid) : vf_load(r->x + x_at + i * xs);
    }
    LS_UNROLL_ALL
    for (int64_t j = 0; j < W; j++) tap[j] = vf_load(taps + j * SPAN + c);
    LS_UNROLL_ALL
    for (int64_t u = 0; u < U; u++) {
        acc[u] = b;
        LS_UNROLL_ALL
        for (int64_t j = 0; j < W; j++) acc[u] = vf_fmadd(tap[j], in[u + j], acc[u]);
    }
    LS_UNROLL_ALL
    for (int64_t u = 0; u < U; u++) store_y(r, bf16, part, t + u, c, valid, vf_act(act, acc[u]));
}

/* conv_block's sums for any W, one token, the taps and inputs read from memory. */
LS_INLINE void conv_token_any(const conv_rows *r, const float *taps, const float *cols, vf b,
                              int64_t W, linseq_activation act, bool bf16, bool part, int64_t t,
                              int64_t c, int64_t valid)
{
    vf acc = b;
    for (int64_t j = 0; j < W; j++)
        acc = vf_fmadd(vf_load(taps + j * SPAN + c),
                       load_xs(r, cols, W, bf16, part, t + j, c, valid), acc);
    store_y(r, bf16, part, t, c, valid, vf_act(act, acc));
}

/* Token t over every strip of the item's `width` channels (full: the whole strips' lanes),
 * one token at a time (conv_token_any): the first W-1 tokens of a sequence, which read its
 * state, and the tokens a block of CONV_U leaves over. */
LS_INLINE void conv_token_strips(const conv_rows *r, const float *taps, const float *cols,
                                 const float *bias, int64_t W, linseq_activation act, bool bf16,
                                 int64_t t, int64_t full, int64_t width)
{
    for (int64_t c = 0; c < full; c += VW)
        conv_token_any(r, taps, cols, bias ? vf_load(bias + c) : vf_zero(), W, act, bf16, false, t,
                       c, VW);
    if (full < width)
        conv_token_any(r, taps, cols, bias ? vf_load_n(bias + full, width - full) : vf_zero(), W,
                       act, bf16, true, t, full, width - full);
}

/* Every strip of an item's `width` channels, tokens [t0, t1), with act, W (W_fixed: when it
 * is at most REG_W, else 0) and the storage type as constants. Blocks of CONV_U tokens sweep
 * the span strip by strip, so that the rows are read and written in order (the hardware
 * prefetchers follow them) and a strip's stores never precede loads at the same offset
 * within a page; the tokens left over go one at a time. */
LS_INLINE void conv_item_strips(const conv_rows *r, const float *taps, const float *cols,
                                const float *bias, int64_t W_fixed, int64_t W,
                                linseq_activation act, bool bf16, int64_t t0, int64_t t1,
                                int64_t width)
{
    const int64_t full = width / VW * VW;
    int64_t t = t0;
    /* The first W-1 tokens of a sequence read its state (cols). */
    for (; t < t1 && t < W - 1; t++)
        conv_token_strips(r, taps, cols, bias, W, act, bf16, t, full, width);
    if (W_fixed)
        for (; t + CONV_U <= t1; t += CONV_U) {
            for (int64_t c = 0; c < full; c += VW)
                conv_block(r, taps, bias ? vf_load(bias + c) : vf_zero(), W_fixed, CONV_U, act,
                           bf16, false, t, c, VW);
            if (full < width)
                conv_block(r, taps, bias ? vf_load_n(bias + full, width - full) : vf_zero(),
                           W_fixed, CONV_U, act, bf16, true, t, full, width - full);
        }
    for (; t < t1; t++) conv_token_strips(r, taps, cols, bias, W, act, bf16, t, full, width);
}

static void run_strips(const conv1d_plan *pl, const conv_rows *r, const float *taps,
                       const float *cols, int64_t t0, int64_t t1, int64_t d0, int64_t width)
{
    const int64_t W = pl->p->W;
    const float *bias = pl->p->bias ? pl->p->bias + d0 : NULL;
#define CONV_STRIPS(ACT, BF16)                                                                     \
    if (W == 4)                                                                                    \
        conv_item_strips(r, taps, cols, bias, 4, 4, ACT, BF16, t0, t1, width);                     \
    else if (W == 3)                                                                               \
        conv_item_strips(r, taps, cols, bias, 3, 3, ACT, BF16, t0, t1, width);                     \
    else if (W == 2)                                                                               \
        conv_item_strips(r, taps, cols, bias, 2, 2, ACT, BF16, t0, t1, width);                     \
    else                                                                                           \
        conv_item_strips(r, taps, cols, bias, 0, W, ACT, BF16, t0, t1, width)
#define CONV_STRIPS_FOR(ACT)                                                                       \
    if (pl->bf16)                                                                                  \
        CONV_STRIPS(ACT, true);                                                                    \
    else                                                                                           \
        CONV_STRIPS(ACT, false);                                                                   \
    break
    switch (pl->act) {
    case LINSEQ_ACT_SILU: CONV_STRIPS_FOR(LINSEQ_ACT_SILU);
    case LINSEQ_ACT_SIGMOID: CONV_STRIPS_FOR(LINSEQ_ACT_SIGMOID);
    case LINSEQ_ACT_GELU_TANH: CONV_STRIPS_FOR(LINSEQ_ACT_GELU_TANH);
    case LINSEQ_ACT_RELU: CONV_STRIPS_FOR(LINSEQ_ACT_RELU);
    default: CONV_STRIPS_FOR(LINSEQ_ACT_IDENTITY);
    }
#undef CONV_STRIPS_FOR
#undef CONV_STRIPS
}

/* The rows of tokens [t0, t1) of sequence `start`, span [d0, d0 + width): x in place when its
 * channels are contiguous (bfloat16 x and y always are), else tokens [t0 - (W-1), t1) (those
 * that exist) packed into tiles; y in place when token-major, else the tile after x's. */
static conv_rows item_rows(const conv1d_plan *pl, float *tiles, int64_t start, int64_t t0,
                           int64_t t1, int64_t d0, int64_t width)
{
    const linseq_conv1d_problem *p = pl->p;
    const ssm_view *v = &pl->x;
    const int64_t W = p->W, T = p->T;
    if (pl->bf16) {
        const int64_t at = start * p->D + d0;
        return (conv_rows){.x_stride = p->D,
                           .y_stride = p->D,
                           .xh = (const uint16_t *)(const void *)p->x + at,
                           .yh = (uint16_t *)(void *)pl->y + at};
    }
    conv_rows r = {ssm_view_at(v, T, start, d0), 0, v->token, NULL, 0, p->D, NULL, NULL};
    float *y_tile = tiles;
    if (pl->x_tiled) {
        const int64_t lo = t0 > W - 1 ? t0 - (W - 1) : 0, count = t1 - lo;
        const float *src = ssm_view_at(v, T, start + lo, d0);
        if (v->token == 1) {
            ls_transpose_copy(tiles, SPAN, src, v->channel, width, count);
        } else {
            for (int64_t k = 0; k < count; k++)
                for (int64_t l = 0; l < width; l++)
                    tiles[k * SPAN + l] = src[k * v->token + l * v->channel];
        }
        r = (conv_rows){tiles, lo, SPAN, NULL, 0, p->D, NULL, NULL};
        y_tile = tiles + (pl->chunk + W - 1) * SPAN;
    }
    if (p->channel_first) {
        r.y = y_tile, r.y_first = t0, r.y_stride = SPAN;
    } else {
        r.y = pl->y + start * p->D + d0;
    }
    return r;
}

/* x of (packed) token tok, channel d, as float32. */
static float x_value(const conv1d_plan *pl, int64_t tok, int64_t d)
{
    if (pl->bf16)
        return ls_bf16_to_f32(((const uint16_t *)(const void *)pl->p->x)[tok * pl->p->D + d]);
    return *ssm_view_at(&pl->x, pl->p->T, tok, d);
}

/* The W-1 = taps positions of `width` channels' state (strides ss) into cols [taps][SPAN]. */
static void copy_state_in(float *cols, const float *state, conv1d_state_strides ss, int64_t taps,
                          int64_t width)
{
    if (ss.channel == 1) {
        for (int64_t i = 0; i < taps; i++)
            memcpy(cols + i * SPAN, state + i * ss.position, (size_t)width * sizeof(float));
    } else {
        ls_transpose_copy(cols, SPAN, state, ss.channel, width, taps);
    }
}

void LS_ISA_FN(ls_conv1d_item)(void *ctx, int64_t item, int thread)
{
    const conv1d_plan *pl = ctx;
    const linseq_conv1d_problem *p = pl->p;
    const int64_t D = p->D, W = p->W;
    const int64_t per_seq = pl->n_blocks * pl->n_chunks;
    const int64_t seq = item / per_seq;
    const int64_t d0 = item % per_seq / pl->n_chunks * SPAN;
    const int64_t t0 = item % pl->n_chunks * pl->chunk;
    const int64_t width = D - d0 < SPAN ? D - d0 : SPAN;
    int64_t start, len;
    ssm_seq_range(p->cu_seqlens, p->T, seq, &start, &len);
    if (t0 > 0 && t0 >= len) return; /* past a shorter sequence's end */
    const int64_t t1 = len - t0 < pl->chunk ? len : t0 + pl->chunk;
    /* The state of this span: channel d0 + l, position i at state[l * ss.channel + i *
     * ss.position]. */
    const conv1d_state_strides ss = conv1d_state_layout(p, W - 1);
    const int64_t state_at = seq * (W - 1) * D + d0 * ss.channel;
    const float *state = W > 1 && p->conv_state ? p->conv_state + state_at : NULL;

    float *taps = pl->workspace + (size_t)thread * pl->thread_floats;
    float *cols = taps + W * SPAN, *tiles = taps + CONV1D_FWD_FLOATS(W);
    /* Lanes past D read zeros. */
    if (width < SPAN || !state) memset(taps, 0, CONV1D_FWD_FLOATS(W) * sizeof(float));
    const conv_rows r = item_rows(pl, tiles, start, t0, t1, d0, width);
    conv1d_taps_in(taps, SPAN, p, d0, width);
    if (state && t0 == 0) copy_state_in(cols, state, ss, W - 1, width);

    run_strips(pl, &r, taps, cols, t0, t1, d0, width);
    if (p->channel_first && !pl->bf16) /* y's tile into [B,D,T] */
        ls_transpose_copy(pl->y + ((start / p->T) * D + d0) * p->T + start % p->T + t0, p->T, r.y,
                          SPAN, t1 - t0, width);

    /* state_out = xs[len .. len + W-2], read from x or from the copy of the old state in cols.
     * Only the first chunk's item read the state, and it is this one. */
    if (W > 1 && pl->state_out && t0 == 0) {
        float *out = pl->state_out + state_at;
        for (int64_t i = 0; i < W - 1; i++) {
            const int64_t k = len + i;
            float *dst = out + i * ss.position;
            if (k < W - 1) {
                for (int64_t l = 0; l < width; l++) dst[l * ss.channel] = cols[k * SPAN + l];
            } else if (ss.channel == 1 && pl->bf16) { /* a tap-major row from a bf16 x row */
                ls_widen_bf16(width,
                              (const uint16_t *)(const void *)p->x + (start + k - (W - 1)) * D + d0,
                              dst);
            } else if (ss.channel == 1 && pl->x.channel == 1) {
                memcpy(dst, ssm_view_at(&pl->x, p->T, start + k - (W - 1), d0),
                       (size_t)width * sizeof(float));
            } else {
                for (int64_t l = 0; l < width; l++)
                    dst[l * ss.channel] = x_value(pl, start + k - (W - 1), d0 + l);
            }
        }
    }
}
