/* Internal: the rows of a block of tokens by a block of channels of a per-token tensor in any
 * layout, as the SSM kernels read and write them (include only from *_simd.c sources).
 *
 * The kernels work on token rows: for token k of a chunk, SSM_LANES consecutive channels. A
 * token-major tensor (channel stride 1) already is such rows, read and written in place. Any
 * other layout ([B,D,T], a view with strides) is packed for one chunk of tokens into a small
 * tile [count][SSM_LANES] first (a register transpose when the tokens are contiguous), and an
 * output tile is written back after the chunk; the inner kernels are the token-major ones. */
#ifndef LS_SSM_LAYOUT_H
#define LS_SSM_LAYOUT_H

#include "ssm/ssm_internal.h"
#include "ssm/ssm_vec.h"

#include <string.h>

/* taps[j * stride + l] = weight of channel d0 + l, tap j, for l < lanes: a conv's weights of
 * a block of channels as the kernels read them (copied rows from a tap-major weight). */
static inline void conv1d_taps_in(float *taps, int64_t stride, const linseq_conv1d_problem *p,
                                  int64_t d0, int64_t lanes)
{
    const int64_t W = p->W;
    if (p->weight_tap_major) {
        for (int64_t j = 0; j < W; j++)
            memcpy(taps + j * stride, p->weight + j * p->D + d0, (size_t)lanes * sizeof(float));
    } else {
        ls_transpose_copy(taps, stride, p->weight + d0 * W, W, lanes, W);
    }
}

/* The inverse for dweight: dw[j * stride + l] into channel d0 + l, tap j. */
static inline void conv1d_taps_out(float *dweight, const linseq_conv1d_problem *p, int64_t d0,
                                   int64_t lanes, const float *dw, int64_t stride)
{
    const int64_t W = p->W;
    if (p->weight_tap_major) {
        for (int64_t j = 0; j < W; j++)
            memcpy(dweight + j * p->D + d0, dw + j * stride, (size_t)lanes * sizeof(float));
    } else {
        ls_transpose_copy(dweight + d0 * W, W, dw, stride, W, lanes);
    }
}

/* Token k's row of channels: p + k * stride. */
typedef struct ssm_rows {
    const float *p;
    int64_t stride;
    bool in_place; /* p points into the tensor itself (prefetching ahead makes sense) */
} ssm_rows;

/* The first element of (token tok0, channel c0) of v: tok0 counts over the flattened [B*T]
 * (or packed) time axis, and a chunk never crosses a sequence. */
static inline const float *ssm_view_at(const ssm_view *v, int64_t T, int64_t tok0, int64_t c0)
{
    return v->base + (tok0 / T) * v->batch + (tok0 % T) * v->token + c0 * v->channel;
}

/* Rows of tokens [tok0, tok0 + count) by channels [d0, d0 + lanes) of v (no state axis):
 * in place when the channels are contiguous, else packed into tile [count][SSM_LANES]. A
 * packed tensor whose tokens are contiguous has the tokens the next call will pack prefetched
 * (pf.len of them from tok0 + pf.off): a block reads SSM_LANES rows at once, more streams than
 * the hardware prefetchers follow. */
typedef struct ssm_prefetch {
    int64_t off, len;
} ssm_prefetch;

static inline ssm_rows ssm_rows_in(const ssm_view *v, int64_t T, int64_t tok0, int64_t count,
                                   ssm_prefetch pf, int64_t d0, int64_t lanes, float *tile)
{
    const float *src = ssm_view_at(v, T, tok0, d0);
    if (v->channel == 1) return (ssm_rows){src, v->token, true};
    if (v->token == 1) {
        for (int64_t l = 0; pf.len > 0 && l < lanes; l++)
            ls_prefetch_floats(src + l * v->channel + pf.off, pf.len);
        ls_transpose_copy(tile, SSM_LANES, src, v->channel, lanes, count);
    } else {
        for (int64_t k = 0; k < count; k++)
            for (int64_t l = 0; l < lanes; l++)
                tile[k * SSM_LANES + l] = src[k * v->token + l * v->channel];
    }
    return (ssm_rows){tile, SSM_LANES, false};
}

/* Where a chunk's output rows go: in place in a token-major output, else a tile that
 * ssm_rows_flush writes back. */
typedef struct ssm_out_rows {
    float *p;
    int64_t stride;
    float *dst; /* channel_first: (token tok0, channel d0) of the output, else NULL */
    int64_t dst_stride, count, lanes;
} ssm_out_rows;

/* A dense output [B,T,C] or (channel_first) [B,C,T]: the rows of a chunk. */
static inline ssm_out_rows ssm_rows_out(float *base, bool channel_first, int64_t T, int64_t C,
                                        int64_t tok0, int64_t count, int64_t d0, int64_t lanes,
                                        float *tile)
{
    if (!base) return (ssm_out_rows){NULL, 0, NULL, 0, 0, 0};
    if (!channel_first) return (ssm_out_rows){base + tok0 * C + d0, C, NULL, 0, count, lanes};
    float *dst = base + ((tok0 / T) * C + d0) * T + tok0 % T;
    return (ssm_out_rows){tile, SSM_LANES, dst, T, count, lanes};
}

/* Writes a tiled chunk back to its channel-first output (nothing for in-place rows), and
 * prefetches for writing the tokens the next chunk writes (as ssm_rows_in's pf). */
static inline void ssm_rows_flush(const ssm_out_rows *o, ssm_prefetch pf)
{
    if (!o->dst) return;
    ls_transpose_copy(o->dst, o->dst_stride, o->p, SSM_LANES, o->count, o->lanes);
    for (int64_t l = 0; pf.len > 0 && l < o->lanes; l++)
        ls_prefetch_floats_for_write(o->dst + l * o->dst_stride + pf.off, pf.len);
}

/* B_t or C_t of token k and group g of a chunk: p + k * token + (g - g0) * group, its N states
 * contiguous. */
typedef struct ssm_proj_rows {
    const float *p;
    int64_t token, group, g0;
} ssm_proj_rows;

/* Groups [g0, g0 + ng) of tokens [tok0, tok0 + count) of B_proj or C_proj: in place when the
 * states are contiguous, else packed into tile [count][ng][N]. */
static inline ssm_proj_rows ssm_proj_in(const ssm_view *v, int64_t T, int64_t N, int64_t tok0,
                                        int64_t count, ssm_prefetch pf, int64_t g0, int64_t ng,
                                        float *tile)
{
    const float *src = ssm_view_at(v, T, tok0, g0);
    if (v->state == 1) return (ssm_proj_rows){src, v->token, v->channel, g0};
    for (int64_t gi = 0; gi < ng; gi++)
        for (int64_t n = 0; n < N; n++) {
            const float *s = src + gi * v->channel + n * v->state;
            if (v->token == 1 && pf.len > 0) ls_prefetch_floats(s + pf.off, pf.len);
            float *d = tile + gi * N + n;
            for (int64_t k = 0; k < count; k++) d[k * ng * N] = s[k * v->token];
        }
    return (ssm_proj_rows){tile, ng * N, N, g0};
}

static inline const float *ssm_proj_at(const ssm_proj_rows *r, int64_t k, int64_t g)
{
    return r->p + k * r->token + (g - r->g0) * r->group;
}

#endif
