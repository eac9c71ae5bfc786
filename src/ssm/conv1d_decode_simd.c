/* The conv1d decode kernel (linseq_conv1d_decode), compiled once per ISA: one work item is
 * (request, block of SSM_LANES channels).
 *
 * The block's window [W-1+T][SSM_LANES] holds the W-1 inputs before the new tokens (from the
 * request's state row: its last W-1 entries, or with cache_seqlens the W-1 entries before
 * position cache_seqlens % state_len, circularly), then the T new inputs. y is computed from it
 * with the forward's arithmetic (bias, then the taps in order with one fma each, then the
 * activation in vector form), so a decode step gives the forward's bits for the same window.
 * The state row is updated after the window has read it: shifted left by T with the new inputs
 * appended, or the new inputs written at positions (cache_seqlens + i) % state_len in token
 * order.
 * One token without cache_seqlens (every decode step of a model) takes a shorter way: each
 * channel's taps run over its state row and new input where they lie, in scalars with the
 * vector lane's rounding (vf_fmadd1), and the row shifts by one; only the activation runs in
 * vectors, on the block's sums. Gathering 16 channels' rows of W-1 floats into vectors cost
 * more than the arithmetic. */
#include <string.h>

#include "simd/bf16.h"
#include "ssm/ssm_kernels.h"
#include "ssm/ssm_layout.h"

/* The state position of the i-th of the W-1 inputs before the new tokens (oldest first). */
static int64_t previous_position(const conv1d_decode_plan *pl, int64_t start, int64_t i)
{
    const int64_t L = pl->state_len, W = pl->p->W;
    if (!pl->cache_seqlens) return L - (W - 1) + i;
    const int64_t pos = (start - (W - 1) + i) % L;
    return pos < 0 ? pos + L : pos;
}

/* The state row of one channel after the step (position i at row[i * step]); win_col is the
 * channel's column of the window (stride SSM_LANES), whose rows W-1 .. W-2+T are the new
 * inputs. */
static void advance_state(const conv1d_decode_plan *pl, float *row, int64_t step,
                          const float *win_col, int64_t start)
{
    const int64_t L = pl->state_len, T = pl->p->T, W = pl->p->W;
    const float *x_new = win_col + (W - 1) * SSM_LANES;
    if (pl->cache_seqlens) {
        for (int64_t i = 0; i < T; i++) row[(start + i) % L * step] = x_new[i * SSM_LANES];
        return;
    }
    /* a few floats per channel: a call to memmove would cost more than the move */
    for (int64_t i = 0; i + T < L; i++) row[i * step] = row[(i + T) * step];
    const int64_t keep = T < L ? T : L; /* the newest inputs that fit */
    for (int64_t i = 0; i < keep; i++)
        row[(L - keep + i) * step] = x_new[(T - keep + i) * SSM_LANES];
}

/* The taps and the shift of one token over `lanes` channels' rows of L floats; sums[l] the
 * pre-activation. Always inlined, so that the common widths (W 4, L 3 or 4) are called with
 * constant sizes and its loops unroll: with run-time sizes the loop control cost twice the
 * work (transformers' rows of L 4 took 1.4-1.6x the time of L 3 before they had theirs). */
static inline __attribute__((always_inline)) void
one_token_taps(const float *weight, conv1d_weight_strides ws, const float *bias, int64_t W,
               int64_t L, int64_t lanes, float *state, const float *x, float *sums)
{
    for (int64_t l = 0; l < lanes; l++) {
        const float *w = weight + l * ws.channel;                /* tap j at w[j * ws.tap] */
        float *row = state + l * L, *window = row + L - (W - 1); /* the W-1 previous inputs */
        float acc = bias ? bias[l] : 0.0f;
        for (int64_t j = 0; j < W - 1; j++) acc = vf_fmadd1(w[j * ws.tap], window[j], acc);
        sums[l] = vf_fmadd1(w[(W - 1) * ws.tap], x[l], acc);
        /* shift by one, carried from the end (a forward copy loop becomes a memmove call) */
        float carry = x[l];
        for (int64_t i = L - 1; i >= 0; i--) {
            const float old = row[i];
            row[i] = carry;
            carry = old;
        }
    }
}

/* One token, no cache_seqlens: lanes channels from d0, state rows of L floats at `state`,
 * the new inputs at x, y into y_row. */
static void one_token_block(const conv1d_decode_plan *pl, int64_t d0, int64_t lanes, float *state,
                            const float *x, float *y_row)
{
    const linseq_conv1d_problem *p = pl->p;
    const conv1d_weight_strides ws = conv1d_weight_layout(p);
    const float *weight = p->weight + d0 * ws.channel, *bias = p->bias ? p->bias + d0 : NULL;
    _Alignas(64) float sums[SSM_LANES] = {0};
    if (p->W == 4 && pl->state_len == 3) /* vLLM's rows, and causal-conv1d's */
        one_token_taps(weight, ws, bias, 4, 3, lanes, state, x, sums);
    else if (p->W == 4 && pl->state_len == 4) /* transformers' rows hold the whole window */
        one_token_taps(weight, ws, bias, 4, 4, lanes, state, x, sums);
    else
        one_token_taps(weight, ws, bias, p->W, pl->state_len, lanes, state, x, sums);
    for (int64_t s = 0; s < STRIPS; s++)
        vf_store_part(y_row + s * VW, vf_act(pl->act, vf_load(sums + s * VW)), lanes - s * VW);
}

void LS_ISA_FN(ls_conv1d_decode_item)(void *ctx, int64_t item, int thread)
{
    const conv1d_decode_plan *pl = ctx;
    const linseq_conv1d_problem *p = pl->p;
    const int64_t D = p->D, W = p->W, T = p->T, L = pl->state_len;
    const int64_t n_blocks = (D + SSM_LANES - 1) / SSM_LANES;
    const int64_t b = item / n_blocks, d0 = item % n_blocks * SSM_LANES;
    const int64_t lanes = D - d0 < SSM_LANES ? D - d0 : SSM_LANES;
    const int64_t row = pl->rows ? pl->rows[b] : b;
    float *taps = pl->workspace + (size_t)thread * pl->thread_floats;
    float *win = taps + W * SSM_LANES, *y_tile = win + (W - 1 + T) * SSM_LANES;

    ssm_out_rows y = ssm_rows_out(pl->y, p->channel_first, T, D, b * T, T, d0, lanes, y_tile);
    if (row < 0) { /* padding request: y = 0, no state touched */
        for (int64_t k = 0; k < T; k++)
            memset(y.p + k * y.stride, 0, (size_t)lanes * sizeof(float));
        ssm_rows_flush(&y, (ssm_prefetch){0, 0});
        return;
    }
    const conv1d_state_strides ss = conv1d_state_layout(p, L);
    float *state = pl->state + conv1d_state_at(p, row, d0, 0, L);
    if (T == 1 && !pl->cache_seqlens && !p->state_tap_major) {
        const ssm_rows x = ssm_rows_in(&pl->x, T, b * T, T, (ssm_prefetch){0, 0}, d0, lanes, win);
        one_token_block(pl, d0, lanes, state, x.p, y.p);
        ssm_rows_flush(&y, (ssm_prefetch){0, 0});
        return;
    }
    /* Lanes past a ragged block read zeros and store nothing. */
    if (lanes < SSM_LANES) memset(taps, 0, (size_t)(W + W - 1 + T) * SSM_LANES * sizeof(float));
    conv1d_taps_in(taps, SSM_LANES, p, d0, lanes);
    const int64_t start = pl->cache_seqlens ? pl->cache_seqlens[b] % L : 0;
    for (int64_t i = 0; i < W - 1; i++) {
        const int64_t pos = previous_position(pl, start, i);
        for (int64_t l = 0; l < lanes; l++)
            win[i * SSM_LANES + l] = state[l * ss.channel + pos * ss.position];
    }
    float *x_rows = win + (W - 1) * SSM_LANES;
    const ssm_rows x = ssm_rows_in(&pl->x, T, b * T, T, (ssm_prefetch){0, 0}, d0, lanes, x_rows);
    if (x.p != x_rows)
        for (int64_t k = 0; k < T; k++)
            memcpy(x_rows + k * SSM_LANES, x.p + k * x.stride, (size_t)lanes * sizeof(float));

    for (int64_t k = 0; k < T; k++)
        for (int64_t s = 0; s < STRIPS; s++) {
            const int64_t valid = lanes - s * VW;
            vf acc = p->bias ? vf_load_part(p->bias + d0 + s * VW, valid) : vf_zero();
            for (int64_t j = 0; j < W; j++)
                acc = vf_fmadd(vf_load(taps + j * SSM_LANES + s * VW),
                               vf_load(win + (k + j) * SSM_LANES + s * VW), acc);
            vf_store_part(y.p + k * y.stride + s * VW, vf_act(pl->act, acc), valid);
        }
    ssm_rows_flush(&y, (ssm_prefetch){0, 0});
    for (int64_t l = 0; l < lanes; l++)
        advance_state(pl, state + l * ss.channel, ss.position, win + l, start);
}

/* n lanes (1 .. VW; fewer than VW only at a span's ragged edge) of a float32 or bf16 row
 * from element `at`; `half` is a constant where the span kernel is instantiated, so the
 * common dtypes run without a branch on it. */
LS_INLINE vf row_load(const void *row, int64_t at, int64_t n, bool half)
{
    if (half) {
        const uint16_t *h = (const uint16_t *)row + at;
        return n >= VW ? vf_load_bf16(h) : vf_load_bf16_n(h, n);
    }
    const float *f = (const float *)row + at;
    return n >= VW ? vf_load(f) : vf_load_n(f, n);
}

LS_INLINE void row_store(void *row, int64_t at, vf v, int64_t n, bool half)
{
    if (half) {
        uint16_t *h = (uint16_t *)row + at;
        if (n >= VW)
            vf_store_bf16(h, v);
        else
            vf_store_bf16_n(h, v, n);
        return;
    }
    float *f = (float *)row + at;
    if (n >= VW)
        vf_store(f, v);
    else
        vf_store_n(f, v, n);
}

/* Where request b's state is read and written: a row of the float32 pool in place, or a
 * serving engine's source and destination rows (pl->by_row); NULL: padding. */
LS_INLINE const void *span_rows(const conv1d_decode_plan *pl, int64_t b, void **to)
{
    const int64_t L = pl->state_len, D = pl->p->D;
    const ls_state_rows *r = pl->by_row;
    const int64_t row = r ? r->src[b] : pl->rows ? pl->rows[b] : b;
    if (row < 0) return NULL;
    if (!r) return *to = pl->state + row * L * D;
    *to = ls_state_row_at(r->to, r, r->dst[b], 0);
    return ls_state_row_at(r->from, r, row, 0);
}

/* What a span's strips share: the taps (tap j at taps + j * tap_stride) and bias from the
 * span's first channel, and the sizes; the kernel's constants are passed beside it. */
typedef struct span_shape {
    const float *taps, *bias;
    int64_t tap_stride, D, L;
} span_shape;

/* The window vectors kept for the shift (below): up to W = 5, the widths models use. */
#define SPAN_KEPT 4

/* A vector of a row as stored: float32 lanes, or (half) bf16 bits; only one of the two is
 * used, and with `half` constant the other is never computed. */
typedef struct row_vec {
    vf f;
    vbf h;
} row_vec;

LS_INLINE row_vec row_vec_load(const void *row, int64_t at, int64_t n, bool half)
{
    row_vec v;
    if (half) {
        const uint16_t *h = (const uint16_t *)row + at;
        v.h = n >= VW ? vbf_load(h) : vbf_load_n(h, n);
        v.f = vf_zero();
    } else {
        v.f = row_load(row, at, n, false);
        v.h = (vbf){0};
    }
    return v;
}

LS_INLINE vf row_vec_value(row_vec v, bool half) { return half ? vbf_widen(v.h) : v.f; }

/* v stored again, as a store of its value would store it (vbf_rounded: the same bits, a NaN
 * quieted), without the float32 round trip. */
LS_INLINE void row_vec_store(void *row, int64_t at, row_vec v, int64_t n, bool half)
{
    if (!half) {
        row_store(row, at, v.f, n, false);
        return;
    }
    uint16_t *h = (uint16_t *)row + at;
    if (n >= VW)
        vbf_store(h, vbf_rounded(v.h));
    else
        vbf_store_n(h, vbf_rounded(v.h), n);
}

/* One strip of one request, channels c .. c+n-1 of the span, from its state row `from` (to
 * `to`), x and y at the request's first channel of the span: bias, then the W taps in order
 * with one fma each, then the activation, as the forward computes; then the row moves by one
 * position. The state and x move as stored (row_vec), and when the row holds just the window
 * (L = W-1) the shift stores the window's vectors again rather than loading them twice: the
 * same bits as widening, computing nothing, and rounding. */
LS_INLINE void span_strip(const span_shape *s, int64_t W, int64_t L, linseq_activation act,
                          bool half_x, bool half_state, const void *from, void *to,
                          const void *x, void *y, int64_t c, int64_t n)
{
    const int64_t D = s->D, prev = (L - (W - 1)) * D + c;
    const bool keep = L == W - 1 && W - 1 <= SPAN_KEPT;
    row_vec kept[SPAN_KEPT];
    vf acc = s->bias ? row_load(s->bias, c, n, false) : vf_zero();
    for (int64_t j = 0; j < W - 1; j++) {
        const row_vec v = row_vec_load(from, prev + j * D, n, half_state);
        if (keep) kept[j] = v;
        acc = vf_fmadd(row_load(s->taps, j * s->tap_stride + c, n, false),
                       row_vec_value(v, half_state), acc);
    }
    const row_vec x_stored = row_vec_load(x, c, n, half_x);
    const vf x_new = row_vec_value(x_stored, half_x);
    acc = vf_fmadd(row_load(s->taps, (W - 1) * s->tap_stride + c, n, false), x_new, acc);
    row_store(y, c, vf_act(act, acc), n, half_x);
    /* position i takes i + 1's value, read before it is written (from may be to) */
    for (int64_t i = 0; i + 1 < L; i++)
        row_vec_store(to, i * D + c,
                      keep ? kept[i + 1] : row_vec_load(from, (i + 1) * D + c, n, half_state), n,
                      half_state);
    if (half_x == half_state)
        row_vec_store(to, (L - 1) * D + c, x_stored, n, half_state);
    else
        row_store(to, (L - 1) * D + c, x_new, n, half_state);
}

/* One token of every request over a span of tap-major rows of L positions, W, L, act and the
 * dtypes constants when inlined (see conv1d_decode_span_item): whole vectors, then the span's
 * ragged edge. */
LS_INLINE void tap_major_span(const conv1d_decode_plan *pl, const span_shape *s, int64_t W,
                              int64_t L, linseq_activation act, bool half_x, bool half_state,
                              int64_t d0, int64_t width)
{
    const size_t x_bytes = half_x ? 2 : 4;
    for (int64_t b = 0; b < pl->p->B; b++) {
        const unsigned char *x =
            (const unsigned char *)pl->x.base + (b * pl->x.batch + d0) * x_bytes;
        unsigned char *y = (unsigned char *)pl->y + (b * s->D + d0) * x_bytes;
        void *to;
        const void *from = span_rows(pl, b, &to);
        if (!from) { /* padding request: y = 0, no state touched */
            memset(y, 0, (size_t)width * x_bytes);
            continue;
        }
        from = (const unsigned char *)from + d0 * (half_state ? 2 : 4);
        to = (unsigned char *)to + d0 * (half_state ? 2 : 4);
        int64_t c = 0;
        for (; c + VW <= width; c += VW)
            span_strip(s, W, L, act, half_x, half_state, from, to, x, y, c, VW);
        if (c < width)
            span_strip(s, W, L, act, half_x, half_state, from, to, x, y, c, width - c);
    }
}

/* The span kernel for one activation: the common dtypes (x and state both bf16, or both
 * float32) and W = 4 over rows of the window alone (L = 3, serving engines' rows)
 * instantiated with constants, so their loops carry no branch on them; any other mix runs
 * the same body with run-time sizes and flags. */
LS_INLINE void tap_major_span_for(const conv1d_decode_plan *pl, const span_shape *s,
                                  linseq_activation act, int64_t d0, int64_t width)
{
    const int64_t W = pl->p->W, L = s->L;
    const bool half_x = pl->bf16, half_state = pl->by_row && pl->by_row->dtype == LINSEQ_POOL_BF16;
    if (half_x && half_state && W == 4 && L == 3)
        tap_major_span(pl, s, 4, 3, act, true, true, d0, width);
    else if (!half_x && !half_state && W == 4 && L == 3)
        tap_major_span(pl, s, 4, 3, act, false, false, d0, width);
    else if (half_x && half_state)
        tap_major_span(pl, s, W, L, act, true, true, d0, width);
    else if (!half_x && !half_state)
        tap_major_span(pl, s, W, L, act, false, false, d0, width);
    else
        tap_major_span(pl, s, W, L, act, half_x, half_state, d0, width);
}

void LS_ISA_FN(ls_conv1d_decode_span_item)(void *ctx, int64_t item, int thread)
{
    const conv1d_decode_plan *pl = ctx;
    const linseq_conv1d_problem *p = pl->p;
    const int64_t W = p->W, d0 = item * CONV1D_SPAN;
    const int64_t width = p->D - d0 < CONV1D_SPAN ? p->D - d0 : CONV1D_SPAN;
    /* the span's taps: a tap-major weight in place, else transposed into the thread's
     * [W][CONV1D_SPAN] */
    span_shape s = {.taps = p->weight + d0,
                    .bias = p->bias ? p->bias + d0 : NULL,
                    .tap_stride = p->D,
                    .D = p->D,
                    .L = pl->state_len};
    if (!p->weight_tap_major) {
        float *own = pl->workspace + (size_t)thread * pl->thread_floats;
        ls_transpose_copy(own, CONV1D_SPAN, p->weight + d0 * W, W, width, W);
        s.taps = own, s.tap_stride = CONV1D_SPAN;
    }
    switch (pl->act) {
    case LINSEQ_ACT_SILU: tap_major_span_for(pl, &s, LINSEQ_ACT_SILU, d0, width); break;
    case LINSEQ_ACT_SIGMOID: tap_major_span_for(pl, &s, LINSEQ_ACT_SIGMOID, d0, width); break;
    case LINSEQ_ACT_GELU_TANH: tap_major_span_for(pl, &s, LINSEQ_ACT_GELU_TANH, d0, width); break;
    case LINSEQ_ACT_RELU: tap_major_span_for(pl, &s, LINSEQ_ACT_RELU, d0, width); break;
    default: tap_major_span_for(pl, &s, LINSEQ_ACT_IDENTITY, d0, width);
    }
}
