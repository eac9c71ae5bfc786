/* The conv1d decode kernels (linseq_conv1d_decode), compiled once per ISA. The general one
 * here: one work item is (request, block of SSM_LANES channels); the serving step's span kernel
 * (one token over tap-major rows) is in conv1d_decode_span.h.
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
#include "ssm/conv1d_decode_span.h"
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

void LS_ISA_FN(ls_conv1d_decode_span_item)(void *ctx, int64_t item, int thread)
{
    conv1d_span_item(ctx, item, thread);
}
