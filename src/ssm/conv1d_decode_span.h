/* Internal: the conv1d decode's span kernel (one token per request over tap-major rows, one
 * item per span of CONV1D_SPAN channels over every request), included by the two sources that
 * compile it: conv1d_decode_simd.c (ls_conv1d_decode_span_item, every ISA) and
 * conv1d_decode_bf16_simd.c (ls_conv1d_decode_span_item_bf16: on the AVX-512 build, the same
 * kernel rounding bf16 rows by AVX512-BF16's instruction). CONV1D_STORE_BF16(p, v) and
 * CONV1D_STORE_BF16_MOVED(p, v), a whole vector's bf16 store of a result of the kernel's
 * arithmetic and of a value moved from x (which may be subnormal: simd/bf16_store_instruction.h):
 * both vf_store_bf16 unless the includer defines them. */
#ifndef LS_SSM_CONV1D_DECODE_SPAN_H
#define LS_SSM_CONV1D_DECODE_SPAN_H

#include <string.h>

#include "simd/bf16.h"
#include "ssm/ssm_kernels.h"
#include "ssm/ssm_layout.h"

#ifndef CONV1D_STORE_BF16
#define CONV1D_STORE_BF16 vf_store_bf16
#define CONV1D_STORE_BF16_MOVED vf_store_bf16
#endif

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

/* v into a float32 or bf16 row; `moved`: v is an input's value, not a result (a constant
 * where called). */
LS_INLINE void row_store(void *row, int64_t at, vf v, int64_t n, bool half, bool moved)
{
    if (half) {
        uint16_t *h = (uint16_t *)row + at;
        if (n >= VW && moved)
            CONV1D_STORE_BF16_MOVED(h, v);
        else if (n >= VW)
            CONV1D_STORE_BF16(h, v);
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
        row_store(row, at, v.f, n, false, true);
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
                          bool half_x, bool half_state, const void *from, void *to, const void *x,
                          void *y, int64_t c, int64_t n)
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
    row_store(y, c, vf_act(act, acc), n, half_x, false);
    /* position i takes i + 1's value, read before it is written (from may be to) */
    for (int64_t i = 0; i + 1 < L; i++)
        row_vec_store(to, i * D + c,
                      keep ? kept[i + 1] : row_vec_load(from, (i + 1) * D + c, n, half_state), n,
                      half_state);
    if (half_x == half_state)
        row_vec_store(to, (L - 1) * D + c, x_stored, n, half_state);
    else
        row_store(to, (L - 1) * D + c, x_new, n, half_state, true);
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
        if (c < width) span_strip(s, W, L, act, half_x, half_state, from, to, x, y, c, width - c);
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

/* One span item (see ls_conv1d_decode_span_item). */
LS_INLINE void conv1d_span_item(void *ctx, int64_t item, int thread)
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

#endif
