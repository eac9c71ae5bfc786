/* The causal depthwise conv1d forward kernel, compiled once per ISA: one work item is
 * (sequence, span of CONV1D_SPAN channels, chunk of tokens); lanes are channels.
 *
 * Per token, each strip of VW channels starts from the bias and adds the W taps in order with
 * one fma each, then applies the activation in vector form and stores y. A token's row of the
 * span (2 KiB) is read and written contiguously, and the W rows a token reads stay in L1 for
 * the next tokens: the op moves x and y once, near the machine's streaming rate. The taps that
 * reach back before the sequence read the conv state, copied (transposed) into [W-1][span]
 * columns by the item of the sequence's first chunk, which also writes conv_state_out after
 * it has read the state (so conv_state_out == conv_state is safe; no other item reads the
 * state). A chained call (starting from the previous call's conv_state_out) computes the same
 * sums in the same order as one call.
 *
 * Other layouts: an x whose channels are not contiguous (channel-first, a strided view) is
 * packed for the item's tokens (and the W-1 before them) into a token-major tile first, and a
 * channel-first y is computed into a tile and transposed into place after the item, so the
 * loops below always read and write token rows (conv_rows). A bfloat16 x (dense [B,T,D]) is
 * widened into that tile likewise, and y computed into the tile after it, then rounded into
 * place once: the bits of the float32 call on the widened x, y rounded to nearest even. */
#include <string.h>

#include "simd/bf16.h"
#include "ssm/ssm_kernels.h"
#include "ssm/ssm_layout.h"
#include "ssm/ssm_vec.h"

#define SPAN CONV1D_SPAN

/* An item's rows: x of sequence token k (k >= 0) at x + (k - x_first) * x_stride, y of token t
 * at y + (t - y_first) * y_stride; column 0 is the span's first channel. */
typedef struct conv_rows {
    const float *x;
    int64_t x_first, x_stride;
    float *y;
    int64_t y_first, y_stride;
} conv_rows;

static inline const float *x_row(const conv_rows *r, int64_t k)
{
    return r->x + (k - r->x_first) * r->x_stride;
}

static inline float *y_row(const conv_rows *r, int64_t t)
{
    return r->y + (t - r->y_first) * r->y_stride;
}

/* y of token t, channels [d0, d0 + lanes) of one block (lanes <= SSM_LANES): bias + sum_j
 * weight[j] xs[t+j], then act. Rows of xs before the sequence come from cols. taps and cols
 * are the block's columns of the span's tiles (row stride SPAN). A ragged block computes its
 * whole width (lanes past D read zeros and store nothing). */
static void conv_token(const conv1d_plan *pl, const conv_rows *r, const float *taps,
                       const float *cols, int64_t t, int64_t c, int64_t d0, int64_t lanes)
{
    const linseq_conv1d_problem *p = pl->p;
    const int64_t W = p->W;
    float *y_t = y_row(r, t) + c;
    for (int64_t s = 0; s < STRIPS; s++) {
        const int64_t valid = lanes - s * VW;
        vf acc = p->bias ? vf_load_part(p->bias + d0 + s * VW, valid) : vf_zero();
        for (int64_t j = 0; j < W; j++) {
            const int64_t k = t + j;
            const vf in = k < W - 1 ? vf_load(cols + k * SPAN + s * VW)
                                    : vf_load_part(x_row(r, k - (W - 1)) + c + s * VW, valid);
            acc = vf_fmadd(vf_load(taps + j * SPAN + s * VW), in, acc);
        }
        vf_store_part(y_t + s * VW, vf_act(pl->act, acc), valid);
    }
}

/* Tokens [t0, t1), t0 >= W-1 (every tap reads x), of `blocks` whole blocks from channel d0:
 * conv_token's arithmetic, inlined with W and act constants (see run_full_blocks) so that the
 * taps fold, the activation is straight-line code and every load is a whole vector. */
LS_INLINE void conv_span(const conv1d_plan *pl, const conv_rows *r, const float *taps, int64_t W,
                         linseq_activation act, int64_t t0, int64_t t1, int64_t d0, int64_t blocks)
{
    const linseq_conv1d_problem *p = pl->p;
    const int64_t xs = r->x_stride;
    for (int64_t t = t0; t < t1; t++) {
        const float *x0 = x_row(r, t - (W - 1)); /* the row tap 0 reads */
        float *y_t = y_row(r, t);
        for (int64_t c = 0; c < blocks * SSM_LANES; c += SSM_LANES) {
            LS_UNROLL_STRIPS
            for (int64_t s = 0; s < STRIPS; s++) {
                const int64_t o = c + s * VW;
                vf acc = p->bias ? vf_load(p->bias + d0 + o) : vf_zero();
                for (int64_t j = 0; j < W; j++)
                    acc = vf_fmadd(vf_load(taps + j * SPAN + o), vf_load(x0 + j * xs + o), acc);
                vf_store(y_t + o, vf_act(act, acc));
            }
        }
    }
}

/* conv_span with W == 4 (Mamba's width) and the activation as constants. */
static void run_full_blocks(const conv1d_plan *pl, const conv_rows *r, const float *taps,
                            int64_t t0, int64_t t1, int64_t d0, int64_t blocks)
{
    const int64_t W = pl->p->W;
#define CONV_SPAN_FOR(ACT)                                                                         \
    if (W == 4)                                                                                    \
        conv_span(pl, r, taps, 4, ACT, t0, t1, d0, blocks);                                        \
    else                                                                                           \
        conv_span(pl, r, taps, W, ACT, t0, t1, d0, blocks);                                        \
    break
    switch (pl->act) {
    case LINSEQ_ACT_SILU: CONV_SPAN_FOR(LINSEQ_ACT_SILU);
    case LINSEQ_ACT_SIGMOID: CONV_SPAN_FOR(LINSEQ_ACT_SIGMOID);
    case LINSEQ_ACT_GELU_TANH: CONV_SPAN_FOR(LINSEQ_ACT_GELU_TANH);
    case LINSEQ_ACT_RELU: CONV_SPAN_FOR(LINSEQ_ACT_RELU);
    default: CONV_SPAN_FOR(LINSEQ_ACT_IDENTITY);
    }
#undef CONV_SPAN_FOR
}

/* The rows of tokens [t0, t1) of sequence `start`, span [d0, d0 + width): x in place when its
 * channels are contiguous, else tokens [t0 - (W-1), t1) (those that exist) packed into tiles;
 * y in place when token-major, else the tile after x's. */
static conv_rows item_rows(const conv1d_plan *pl, float *tiles, int64_t start, int64_t t0,
                           int64_t t1, int64_t d0, int64_t width)
{
    const linseq_conv1d_problem *p = pl->p;
    const ssm_view *v = &pl->x;
    const int64_t W = p->W, T = p->T;
    conv_rows r = {ssm_view_at(v, T, start, d0), 0, v->token, NULL, 0, p->D};
    float *y_tile = tiles;
    if (pl->bf16) {
        const int64_t lo = t0 > W - 1 ? t0 - (W - 1) : 0, count = t1 - lo;
        const uint16_t *src = (const uint16_t *)(const void *)p->x + (start + lo) * p->D + d0;
        for (int64_t k = 0; k < count; k++)
            for (int64_t c = 0; c < width; c += VW)
                vf_store(tiles + k * SPAN + c, width - c >= VW
                                                   ? vf_load_bf16(src + k * p->D + c)
                                                   : vf_load_bf16_n(src + k * p->D + c, width - c));
        const int64_t y_at = (pl->chunk + W - 1) * SPAN;
        return (conv_rows){tiles, lo, SPAN, tiles + y_at, t0, SPAN};
    }
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
        r = (conv_rows){tiles, lo, SPAN, NULL, 0, p->D};
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

    /* Whole blocks run the main loop from token W-1 on; the first W-1 tokens (which may read
     * the state) and a ragged last block run the general one. */
    const int64_t full = width / SSM_LANES;
    const int64_t head = W - 1 < t1 ? (W - 1 > t0 ? W - 1 : t0) : t1;
    for (int64_t b = 0; b * SSM_LANES < width; b++) {
        const int64_t lanes = width - b * SSM_LANES < SSM_LANES ? width - b * SSM_LANES : SSM_LANES;
        const int64_t last = b < full ? head : t1;
        for (int64_t t = t0; t < last; t++)
            conv_token(pl, &r, taps + b * SSM_LANES, cols + b * SSM_LANES, t, b * SSM_LANES,
                       d0 + b * SSM_LANES, lanes);
    }
    if (full && head < t1) run_full_blocks(pl, &r, taps, head, t1, d0, full);
    if (pl->bf16) /* y's tile rounded into [B,T,D] */
        for (int64_t t = t0; t < t1; t++) {
            uint16_t *dst = (uint16_t *)(void *)pl->y + (start + t) * D + d0;
            for (int64_t c = 0; c < width; c += VW) {
                const vf v = vf_load(y_row(&r, t) + c);
                if (width - c >= VW)
                    vf_store_bf16(dst + c, v);
                else
                    vf_store_bf16_n(dst + c, v, width - c);
            }
        }
    else if (p->channel_first) /* y's tile into [B,D,T] */
        ls_transpose_copy(pl->y + ((start / p->T) * D + d0) * p->T + start % p->T + t0, p->T, r.y,
                          SPAN, t1 - t0, width);

    /* state_out = xs[len .. len + W-2], read from x or from the copy of the old state in cols.
     * Only the first chunk's item read the state, and it is this one. */
    if (W > 1 && pl->state_out && t0 == 0) {
        float *out = pl->state_out + state_at;
        for (int64_t i = 0; i < W - 1; i++) {
            const int64_t k = len + i;
            for (int64_t l = 0; l < width; l++)
                out[l * ss.channel + i * ss.position] =
                    k < W - 1 ? cols[k * SPAN + l] : x_value(pl, start + k - (W - 1), d0 + l);
        }
    }
}
