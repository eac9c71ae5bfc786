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
 * pre-activation. Always inlined, so that the common width (W 4, L 3) is called with constant
 * sizes and its loops unroll: with run-time sizes the loop control cost twice the work. */
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
    if (p->W == 4 && pl->state_len == 3)
        one_token_taps(weight, ws, bias, 4, 3, lanes, state, x, sums);
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

/* A part-vector of a float32 or bf16 row (valid lanes; any value past VW loads a vector). */
LS_INLINE vf half_or_f32_load(const void *row, int64_t at, int64_t valid, bool half)
{
    if (!half) return vf_load_part((const float *)row + at, valid);
    const uint16_t *h = (const uint16_t *)row + at;
    return valid >= VW ? vf_load_bf16(h) : vf_load_bf16_n(h, valid > 0 ? valid : 0);
}

LS_INLINE void half_or_f32_store(void *row, int64_t at, vf v, int64_t valid, bool half)
{
    if (!half) {
        vf_store_part((float *)row + at, v, valid);
        return;
    }
    uint16_t *h = (uint16_t *)row + at;
    if (valid >= VW)
        vf_store_bf16(h, v);
    else if (valid > 0)
        vf_store_bf16_n(h, v, valid);
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

/* One token of every request over a span of tap-major rows, W and act constants when inlined
 * (see conv1d_decode_span_item): per strip, bias then the W taps in order with one fma each,
 * then the activation, as the forward computes; then the row moves by one position. */
LS_INLINE void tap_major_span(const conv1d_decode_plan *pl, const float *taps, int64_t tap_stride,
                              int64_t W, linseq_activation act, int64_t d0, int64_t width)
{
    const linseq_conv1d_problem *p = pl->p;
    const int64_t D = p->D, L = pl->state_len;
    const float *bias = p->bias ? p->bias + d0 : NULL;
    const bool half_x = pl->bf16, half_state = pl->by_row && pl->by_row->dtype == LINSEQ_POOL_BF16;
    for (int64_t b = 0; b < p->B; b++) {
        const int64_t x_at = b * pl->x.batch + d0, y_at = b * D + d0;
        void *to;
        const void *from = span_rows(pl, b, &to);
        if (!from) { /* padding request: y = 0, no state touched */
            memset((unsigned char *)pl->y + (size_t)y_at * (half_x ? 2 : 4), 0,
                   (size_t)width * (half_x ? 2 : 4));
            continue;
        }
        /* position i of the state at i * D + d0; the shift reads i + 1 before it writes i */
        const int64_t prev = (L - (W - 1)) * D + d0;
        for (int64_t c = 0; c < width; c += VW) {
            const int64_t valid = width - c;
            vf acc = bias ? vf_load_part(bias + c, valid) : vf_zero();
            for (int64_t j = 0; j < W - 1; j++)
                acc = vf_fmadd(vf_load_part(taps + j * tap_stride + c, valid),
                               half_or_f32_load(from, prev + j * D + c, valid, half_state), acc);
            const vf x_new = half_or_f32_load(pl->x.base, x_at + c, valid, half_x);
            acc = vf_fmadd(vf_load_part(taps + (W - 1) * tap_stride + c, valid), x_new, acc);
            half_or_f32_store(pl->y, y_at + c, vf_act(act, acc), valid, half_x);
            for (int64_t i = 0; i + 1 < L; i++)
                half_or_f32_store(to, i * D + d0 + c,
                                  half_or_f32_load(from, (i + 1) * D + d0 + c, valid, half_state),
                                  valid, half_state);
            half_or_f32_store(to, (L - 1) * D + d0 + c, x_new, valid, half_state);
        }
    }
}

void LS_ISA_FN(ls_conv1d_decode_span_item)(void *ctx, int64_t item, int thread)
{
    const conv1d_decode_plan *pl = ctx;
    const linseq_conv1d_problem *p = pl->p;
    const int64_t W = p->W, d0 = item * CONV1D_SPAN;
    const int64_t width = p->D - d0 < CONV1D_SPAN ? p->D - d0 : CONV1D_SPAN;
    /* the span's taps, tap j at taps + j * tap_stride: a tap-major weight in place, else
     * transposed into the thread's [W][CONV1D_SPAN] */
    const float *taps = p->weight + d0;
    int64_t tap_stride = p->D;
    if (!p->weight_tap_major) {
        float *own = pl->workspace + (size_t)thread * pl->thread_floats;
        ls_transpose_copy(own, CONV1D_SPAN, p->weight + d0 * W, W, width, W);
        taps = own, tap_stride = CONV1D_SPAN;
    }
#define TAP_MAJOR_SPAN_FOR(ACT)                                                                    \
    if (W == 4)                                                                                    \
        tap_major_span(pl, taps, tap_stride, 4, ACT, d0, width);                                   \
    else                                                                                           \
        tap_major_span(pl, taps, tap_stride, W, ACT, d0, width);                                   \
    break
    switch (pl->act) {
    case LINSEQ_ACT_SILU: TAP_MAJOR_SPAN_FOR(LINSEQ_ACT_SILU);
    case LINSEQ_ACT_SIGMOID: TAP_MAJOR_SPAN_FOR(LINSEQ_ACT_SIGMOID);
    case LINSEQ_ACT_GELU_TANH: TAP_MAJOR_SPAN_FOR(LINSEQ_ACT_GELU_TANH);
    case LINSEQ_ACT_RELU: TAP_MAJOR_SPAN_FOR(LINSEQ_ACT_RELU);
    default: TAP_MAJOR_SPAN_FOR(LINSEQ_ACT_IDENTITY);
    }
#undef TAP_MAJOR_SPAN_FOR
}
