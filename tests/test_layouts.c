/* The per-token layouts of SSM1 and conv1d (channel_first and strided inputs): every layout
 * must give the same bits as the dense token-major call on the same values, forward and backward, on
 * every ISA the CPU has. The layouts are the ones peers hand over: mamba's [b, d, l] tensors,
 * x and z as halves of one xz tensor (in either layout), a transposed view, B/C as [b, N, l],
 * grouped [b, G, N, l] and constant [d, N] (G = D groups, zero batch and token strides).
 * Around every strided input the storage holds NaN, so an element read from a wrong address
 * shows in the results. Also: the validation of strides (negative, a state stride on x, a
 * span past memory, an output over a strided input's span), named in the messages. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "simd/isa.h"
#include "ssm/ssm_internal.h"
#include "testutil.h"

static ls_isa test_isa = LS_ISA_SCALAR;

/* Element (b, t, c, s) of a dense token-major [B,T,C,S] tensor. */
static size_t at_dense(int64_t T, int64_t C, int64_t S, int64_t b, int64_t t, int64_t c, int64_t s)
{
    return (size_t)(((b * T + t) * C + c) * S + s);
}

/* A copy of dense [B,T,C,S] in `storage` floats laid out by strides st; every element no index
 * reaches is NaN. */
static float *place(const float *dense, int64_t B, int64_t T, int64_t C, int64_t S,
                    linseq_strides st, size_t storage)
{
    float *out = tu_alloc(storage);
    for (size_t i = 0; i < storage; i++) out[i] = NAN;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t s = 0; s < S; s++)
                    out[b * st.batch + t * st.token + c * st.channel + s * st.state] =
                        dense[at_dense(T, C, S, b, t, c, s)];
    return out;
}

/* Channel-first [B,C,S,T] -> token-major [B,T,C,S]. */
static void to_token_major(const float *cf, int64_t B, int64_t T, int64_t C, int64_t S, float *out)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t s = 0; s < S; s++)
                    out[at_dense(T, C, S, b, t, c, s)] = cf[((b * C + c) * S + s) * T + t];
}

static void to_channel_first(const float *tm, int64_t B, int64_t T, int64_t C, int64_t S,
                             float *out)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t s = 0; s < S; s++)
                    out[((b * C + c) * S + s) * T + t] = tm[at_dense(T, C, S, b, t, c, s)];
}

/* ---- one SSM1 problem in every layout ----------------------------------------------- */

typedef struct sizes {
    int64_t B, T, D, N, G;
    const int64_t *cu;
    int64_t n_seqs;
    bool constant_bc; /* B and C are one [D,N] for every token (G = D) */
} sizes;

/* The dense token-major problem, its upstream gradients and its results. */
typedef struct dense_case {
    sizes sz;
    linseq_ssm1_problem p;
    float *x, *dt, *gate, *Bp, *Cp, *A, *Dk, *bias, *h0, *d_y, *d_hT;
    size_t n_tok, n_proj, n_state;
    float *y, *hT, *g[9]; /* dx, ddt, dA, dB, dC, dD, dgate, dh0, ddt_bias */
} dense_case;

static linseq_ssm1_grads grads_of(float *const g[9])
{
    return (linseq_ssm1_grads){g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8]};
}

static void run(const linseq_ssm1_problem *p, const float *d_y, const float *d_hT, float *y,
                float *hT, float *const g[9])
{
    const linseq_exec ex = {.threads = 2};
    CHECK_OK(ls_ssm1_forward_isa(p, &ex, y, hT, test_isa));
    const linseq_ssm1_grads grads = grads_of(g);
    CHECK_OK(ls_ssm1_backward_isa(p, &ex, d_y, d_hT, &grads, test_isa));
}

static void dense_make(dense_case *c, const sizes *sz, uint64_t seed)
{
    tu_rng rng = {seed};
    memset(c, 0, sizeof *c);
    c->sz = *sz;
    const int64_t B = sz->B, T = sz->T, D = sz->D, N = sz->N, G = sz->G;
    const int64_t n_seqs = sz->cu ? sz->n_seqs : B;
    c->n_tok = (size_t)(B * T * D);
    c->n_proj = (size_t)(B * T * G * N);
    c->n_state = (size_t)(n_seqs * D * N);
    c->x = tu_alloc(c->n_tok), c->dt = tu_alloc(c->n_tok), c->gate = tu_alloc(c->n_tok);
    c->Bp = tu_alloc(c->n_proj), c->Cp = tu_alloc(c->n_proj);
    c->A = tu_alloc((size_t)(D * N)), c->Dk = tu_alloc((size_t)D), c->bias = tu_alloc((size_t)D);
    c->h0 = tu_alloc(c->n_state), c->d_y = tu_alloc(c->n_tok), c->d_hT = tu_alloc(c->n_state);
    tu_fill_normal(&rng, c->x, c->n_tok, 1.0);
    tu_fill_normal(&rng, c->dt, c->n_tok, 1.0);
    tu_fill_normal(&rng, c->gate, c->n_tok, 1.0);
    tu_fill_normal(&rng, c->Bp, c->n_proj, 1.0);
    tu_fill_normal(&rng, c->Cp, c->n_proj, 1.0);
    if (sz->constant_bc) /* every token's B_t, C_t the same [D,N] */
        for (size_t i = 0; i < c->n_proj; i++) {
            c->Bp[i] = c->Bp[i % (size_t)(G * N)];
            c->Cp[i] = c->Cp[i % (size_t)(G * N)];
        }
    tu_fill_uniform(&rng, c->A, (size_t)(D * N), -4.0, -0.1);
    tu_fill_normal(&rng, c->Dk, (size_t)D, 1.0);
    tu_fill_uniform(&rng, c->bias, (size_t)D, -6.0, -2.0);
    tu_fill_normal(&rng, c->h0, c->n_state, 0.5);
    tu_fill_normal(&rng, c->d_y, c->n_tok, 1.0);
    tu_fill_normal(&rng, c->d_hT, c->n_state, 1.0);
    c->p = (linseq_ssm1_problem){.B = B,
                                 .T = T,
                                 .D = D,
                                 .N = N,
                                 .G = G,
                                 .cu_seqlens = sz->cu,
                                 .n_seqs = sz->n_seqs,
                                 .x = c->x,
                                 .dt = c->dt,
                                 .A = c->A,
                                 .B_proj = c->Bp,
                                 .C_proj = c->Cp,
                                 .D_skip = c->Dk,
                                 .gate = c->gate,
                                 .h0 = c->h0,
                                 .dt_softplus = true,
                                 .dt_bias = c->bias};
    const size_t n_out[9] = {c->n_tok,  c->n_tok, (size_t)(D * N), c->n_proj, c->n_proj,
                             (size_t)D, c->n_tok, c->n_state,      (size_t)D};
    c->y = tu_alloc_poisoned(c->n_tok);
    c->hT = tu_alloc_poisoned(c->n_state);
    for (int k = 0; k < 9; k++) c->g[k] = tu_alloc_poisoned(n_out[k]);
    run(&c->p, c->d_y, c->d_hT, c->y, c->hT, c->g);
}

static void dense_free(dense_case *c)
{
    float *all[] = {c->x,    c->dt, c->gate, c->Bp,   c->Cp, c->A, c->Dk,
                    c->bias, c->h0, c->d_y,  c->d_hT, c->y,  c->hT};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    for (int k = 0; k < 9; k++) free(c->g[k]);
}

/* How one layout lays out the five per-token inputs: strides (zero: dense in the problem's
 * layout) and the storage each needs; x and gate may share one xz tensor. */
typedef struct layout {
    const char *name;
    bool channel_first;
    linseq_strides x, dt, gate, B, C;
    size_t n_x, n_dt, n_gate, n_B, n_C;
    int64_t gate_offset; /* gate = x storage + this (an xz tensor); < 0: its own storage */
} layout;

static size_t span(linseq_strides s, int64_t B, int64_t T, int64_t C, int64_t S)
{
    return (size_t)(1 + (B - 1) * s.batch + (T - 1) * s.token + (C - 1) * s.channel +
                    (S - 1) * s.state);
}

/* Runs the problem in layout L and checks every result against the dense call's bits. */
static void check_layout(const dense_case *c, const layout *L)
{
    const sizes *sz = &c->sz;
    const int64_t B = sz->B, T = sz->T, D = sz->D, N = sz->N, G = sz->G;
    const bool cf = L->channel_first;
    const linseq_strides dense_tok = ssm_dense_strides(cf, T, D, 1);
    const linseq_strides dense_bc = ssm_dense_strides(cf, T, G, N);
#define RESOLVE(s, d) (ssm_strides_zero(s) ? (d) : (s))
    const linseq_strides sx = RESOLVE(L->x, dense_tok), sdt = RESOLVE(L->dt, dense_tok);
    const linseq_strides sg = RESOLVE(L->gate, dense_tok);
    const linseq_strides sB = RESOLVE(L->B, dense_bc), sC = RESOLVE(L->C, dense_bc);
#undef RESOLVE
    float *x = place(c->x, B, T, D, 1, sx, L->n_x ? L->n_x : span(sx, B, T, D, 1));
    if (L->gate_offset >= 0) /* z is the other half of the xz tensor */
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t d = 0; d < D; d++)
                    x[L->gate_offset + b * sg.batch + t * sg.token + d * sg.channel] =
                        c->gate[at_dense(T, D, 1, b, t, d, 0)];
    float *dt = place(c->dt, B, T, D, 1, sdt, span(sdt, B, T, D, 1));
    float *gate = L->gate_offset >= 0 ? NULL : place(c->gate, B, T, D, 1, sg, span(sg, B, T, D, 1));
    float *Bp = place(c->Bp, B, T, G, N, sB, span(sB, B, T, G, N));
    float *Cp = place(c->Cp, B, T, G, N, sC, span(sC, B, T, G, N));

    linseq_ssm1_problem p = c->p;
    p.channel_first = cf;
    p.x = x, p.dt = dt, p.gate = gate ? gate : x + L->gate_offset, p.B_proj = Bp, p.C_proj = Cp;
    p.x_strides = L->x, p.dt_strides = L->dt, p.gate_strides = L->gate;
    p.B_strides = L->B, p.C_strides = L->C;

    float *d_y = tu_alloc(c->n_tok);
    if (cf)
        to_channel_first(c->d_y, B, T, D, 1, d_y);
    else
        memcpy(d_y, c->d_y, c->n_tok * sizeof(float));
    const size_t n_out[9] = {c->n_tok,  c->n_tok, (size_t)(D * N), c->n_proj, c->n_proj,
                             (size_t)D, c->n_tok, c->n_state,      (size_t)D};
    const bool per_token[9] = {true, true, false, true, true, false, true, false, false};
    float *y = tu_alloc_poisoned(c->n_tok), *hT = tu_alloc_poisoned(c->n_state), *g[9];
    for (int k = 0; k < 9; k++) g[k] = tu_alloc_poisoned(n_out[k]);
    run(&p, d_y, c->d_hT, y, hT, g);

    float *tm = tu_alloc(c->n_tok > c->n_proj ? c->n_tok : c->n_proj);
    if (cf) to_token_major(y, B, T, D, 1, tm);
    CHECK(tu_same_bits(cf ? tm : y, c->y, c->n_tok), "%s %s: y differs from the dense call",
          ls_isa_name(test_isa), L->name);
    CHECK(tu_same_bits(hT, c->hT, c->n_state), "%s %s: hT differs", ls_isa_name(test_isa), L->name);
    static const char *const names[9] = {"dx", "ddt",   "dA",  "dB",      "dC",
                                         "dD", "dgate", "dh0", "ddt_bias"};
    for (int k = 0; k < 9; k++) {
        const float *got = g[k];
        if (cf && per_token[k]) {
            const bool proj = k == 3 || k == 4;
            to_token_major(g[k], B, T, proj ? G : D, proj ? N : 1, tm);
            got = tm;
        }
        CHECK(tu_same_bits(got, c->g[k], n_out[k]), "%s %s: %s differs from the dense call",
              ls_isa_name(test_isa), L->name, names[k]);
    }
    free(x), free(dt), free(gate), free(Bp), free(Cp), free(d_y), free(y), free(hT), free(tm);
    for (int k = 0; k < 9; k++) free(g[k]);
}

/* The layouts of one set of sizes. */
static void check_layouts(const sizes *sz, uint64_t seed)
{
    dense_case c;
    dense_make(&c, sz, seed);
    const int64_t B = sz->B, T = sz->T, D = sz->D, N = sz->N, G = sz->G;
    const linseq_strides zero = {0, 0, 0, 0};
    const layout dense_cf = {
        .name = "channel_first dense", .channel_first = true, .gate_offset = -1};
    /* mamba: xz [B,2D,T] chunked along channels; dt a transposed [B,T,D] view; B [B,G,N,T] */
    const linseq_strides xz_cf = {2 * D * T, 1, T, 0};
    const linseq_strides dt_view = {T * D, 1, 0, 0}; /* channel stride set below */
    layout mamba = {.name = "channel_first xz halves, dt transposed view, B/C [B,G,N,T]",
                    .channel_first = true,
                    .x = xz_cf,
                    .gate = xz_cf,
                    .n_x = (size_t)(B * 2 * D * T),
                    .gate_offset = D * T,
                    .B = {G * N * T, 1, N * T, T},
                    .C = {G * N * T, 1, N * T, T}};
    mamba.dt = dt_view, mamba.dt.channel = T;
    /* token-major outputs from the same views, B/C strided with room between tokens */
    layout views = {.name = "token-major xz halves, dt channel-first view, padded B/C",
                    .x = {T * 2 * D, 2 * D, 1, 0},
                    .gate = {T * 2 * D, 2 * D, 1, 0},
                    .n_x = (size_t)(B * T * 2 * D),
                    .gate_offset = D,
                    .dt = {D * T, 1, T, 0},
                    .B = {T * (G * N + 3), G * N + 3, N, 1},
                    .C = {G * N * T, 1, N * T, T}};
    const layout *all[] = {&dense_cf, &mamba, &views};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) check_layout(&c, all[i]);
    if (sz->constant_bc) { /* mamba's constant B, C [D,N]: G = D, no batch or token stride */
        const linseq_strides constant = {0, 0, N, 1};
        layout cst = {
            .name = "constant B/C [D,N]", .B = constant, .C = constant, .gate_offset = -1};
        layout cst_cf = cst;
        cst_cf.name = "channel_first, constant B/C [D,N]";
        cst_cf.channel_first = true;
        check_layout(&c, &cst);
        check_layout(&c, &cst_cf);
    }
    (void)zero;
    dense_free(&c);
}

static void test_layouts_match_dense(void)
{
    static const int64_t cu[] = {0, 37, 37, 150};
    const sizes cases[] = {
        {2, 150, 80, 5, 1, NULL, 0, false},  /* two blocks (one ragged), three segments */
        {2, 70, 130, 16, 2, NULL, 0, false}, /* groups of 65 channels: blocks span groups */
        {1, 150, 40, 3, 4, cu, 3, false},    /* varlen, an empty sequence */
        {2, 33, 24, 4, 24, NULL, 0, true},   /* G = D, constant B/C */
        {3, 1, 72, 8, 1, NULL, 0, false},    /* one token (the decode path) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_layouts(&cases[i], 1000 + i);
}

/* ---- conv1d ----------------------------------------------------------------------------- */

/* Forward and backward of conv in layout (channel_first, x strides over storage xs) against the
 * dense call: y, the final state and every gradient the same bits. */
static void check_conv_layout(const linseq_conv1d_problem *dense, const float *d_y,
                              const float *d_state, bool channel_first, const float *xs,
                              linseq_strides x_strides, const char *what)
{
    const int64_t B = dense->B, T = dense->T, D = dense->D, W = dense->W;
    const int64_t rows = dense->cu_seqlens ? dense->n_seqs : B;
    const size_t n = (size_t)(B * T * D), n_state = (size_t)(rows * D * (W > 1 ? W - 1 : 1));
    const linseq_exec ex = {.threads = 2};
    float *y0 = tu_alloc_poisoned(n), *s0 = tu_alloc_poisoned(n_state);
    float *g0[4] = {tu_alloc_poisoned(n), tu_alloc_poisoned((size_t)(D * W)),
                    tu_alloc_poisoned((size_t)D), tu_alloc_poisoned(n_state)};
    CHECK_OK(ls_conv1d_forward_isa(dense, &ex, y0, s0, test_isa));
    const linseq_conv1d_grads gd = {g0[0], g0[1], g0[2], g0[3]};
    CHECK_OK(ls_conv1d_backward_isa(dense, &ex, d_y, d_state, &gd, test_isa));

    linseq_conv1d_problem p = *dense;
    p.channel_first = channel_first, p.x = xs, p.x_strides = x_strides;
    float *dy = tu_alloc(n), *y = tu_alloc_poisoned(n), *s1 = tu_alloc_poisoned(n_state);
    if (channel_first)
        to_channel_first(d_y, B, T, D, 1, dy);
    else
        memcpy(dy, d_y, n * sizeof(float));
    float *g1[4] = {tu_alloc_poisoned(n), tu_alloc_poisoned((size_t)(D * W)),
                    tu_alloc_poisoned((size_t)D), tu_alloc_poisoned(n_state)};
    CHECK_OK(ls_conv1d_forward_isa(&p, &ex, y, s1, test_isa));
    const linseq_conv1d_grads g = {g1[0], g1[1], g1[2], g1[3]};
    CHECK_OK(ls_conv1d_backward_isa(&p, &ex, dy, d_state, &g, test_isa));
    float *tm = tu_alloc(n);
    if (channel_first) to_token_major(y, B, T, D, 1, tm);
    CHECK(tu_same_bits(channel_first ? tm : y, y0, n), "%s conv %s: y differs",
          ls_isa_name(test_isa), what);
    CHECK(tu_same_bits(s1, s0, n_state), "%s conv %s: state differs", ls_isa_name(test_isa), what);
    if (channel_first) to_token_major(g1[0], B, T, D, 1, tm);
    CHECK(tu_same_bits(channel_first ? tm : g1[0], g0[0], n), "%s conv %s: dx differs",
          ls_isa_name(test_isa), what);
    CHECK(tu_same_bits(g1[1], g0[1], (size_t)(D * W)) && tu_same_bits(g1[2], g0[2], (size_t)D) &&
              tu_same_bits(g1[3], g0[3], n_state),
          "%s conv %s: dweight, dbias or dconv_state differs", ls_isa_name(test_isa), what);
    free(y0), free(s0), free(dy), free(y), free(s1), free(tm);
    for (int k = 0; k < 4; k++) free(g0[k]), free(g1[k]);
}

/* W, and B = 2 rows of 150 tokens, or (cu) one row of 300 packed tokens. */
static void conv_layouts_of_width(int64_t W, const int64_t *cu, int64_t n_seqs)
{
    const int64_t B = cu ? 1 : 2, T = cu ? 300 : 150, D = 70, rows = cu ? n_seqs : B;
    const size_t n = (size_t)(B * T * D);
    tu_rng rng = {77};
    float *x = tu_alloc(n), *w = tu_alloc((size_t)(D * W)), *bias = tu_alloc((size_t)D);
    const size_t n_state = (size_t)(rows * D * (W > 1 ? W - 1 : 1)); /* W = 1: unused */
    float *st = tu_alloc(n_state), *d_y = tu_alloc(n), *d_st = tu_alloc(n_state);
    tu_fill_normal(&rng, x, n, 1.0);
    tu_fill_uniform(&rng, w, (size_t)(D * W), -0.5, 0.5);
    tu_fill_uniform(&rng, bias, (size_t)D, -0.5, 0.5);
    tu_fill_normal(&rng, st, n_state, 1.0);
    tu_fill_normal(&rng, d_y, n, 1.0);
    tu_fill_normal(&rng, d_st, n_state, 1.0);
    const linseq_conv1d_problem dense = {.B = B,
                                         .T = T,
                                         .D = D,
                                         .W = W,
                                         .cu_seqlens = cu,
                                         .n_seqs = n_seqs,
                                         .x = x,
                                         .weight = w,
                                         .bias = bias,
                                         .conv_state = st,
                                         .activation = LINSEQ_ACT_SILU};
    /* dense channel-first */
    const linseq_strides zero = {0, 0, 0, 0};
    float *x_cf = tu_alloc(n);
    to_channel_first(x, B, T, D, 1, x_cf);
    check_conv_layout(&dense, d_y, d_st, true, x_cf, zero, "channel_first dense");
    /* x the first half of an xBC-like [B,2D,T] tensor, channel-first outputs */
    const linseq_strides half = {2 * D * T, 1, T, 0};
    float *xz = place(x, B, T, D, 1, half, (size_t)(B * 2 * D * T));
    check_conv_layout(&dense, d_y, d_st, true, xz, half, "channel_first, x half of [B,2D,T]");
    /* token-major outputs, x a transposed channel-first array */
    check_conv_layout(&dense, d_y, d_st, false, x_cf, (linseq_strides){D * T, 1, T, 0},
                      "token-major, x a transposed view");
    /* x a token-major view with room between tokens */
    const linseq_strides padded = {T * (D + 5), D + 5, 1, 0};
    float *xp = place(x, B, T, D, 1, padded, (size_t)(B * T * (D + 5)));
    check_conv_layout(&dense, d_y, d_st, false, xp, padded, "token-major, padded rows");
    free(x), free(w), free(bias), free(st), free(d_y), free(d_st), free(x_cf), free(xz), free(xp);
}

static void test_conv_layouts(void)
{
    const int64_t widths[] = {4, 1, 2, 7};
    static const int64_t cu[] = {0, 37, 37, 200, 300}; /* an empty sequence, chunks of 64 */
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        conv_layouts_of_width(widths[i], NULL, 0);
        conv_layouts_of_width(widths[i], cu, 4);
    }
}

/* ---- validation -------------------------------------------------------------------------- */

static void expect_fail(linseq_status got, linseq_status want, const char *needle, const char *what)
{
    CHECK(got == want, "%s: got %s, expected %s", what, linseq_status_string(got),
          linseq_status_string(want));
    CHECK(strstr(linseq_last_error(), needle) != NULL, "%s: message '%s' does not name '%s'", what,
          linseq_last_error(), needle);
}

static void test_stride_validation(void)
{
    const int64_t B = 2, T = 8, D = 16, N = 4;
    float *buf = tu_alloc(4096), *y = tu_alloc_poisoned((size_t)(B * T * D));
    float *y_copy = tu_alloc((size_t)(B * T * D));
    memcpy(y_copy, y, (size_t)(B * T * D) * sizeof(float));
    linseq_ssm1_problem p = {.B = B,
                             .T = T,
                             .D = D,
                             .N = N,
                             .x = buf,
                             .dt = buf + 512,
                             .A = buf + 1024,
                             .B_proj = buf + 1536,
                             .C_proj = buf + 2048};
    linseq_ssm1_problem q = p;
    q.x_strides = (linseq_strides){-1, D, 1, 0};
    expect_fail(linseq_ssm1_forward(&q, NULL, y, NULL), LINSEQ_ERR_INVALID_VALUE, "x_strides",
                "negative stride");
    q = p;
    q.dt_strides = (linseq_strides){T * D, D, 1, 1};
    expect_fail(linseq_ssm1_forward(&q, NULL, y, NULL), LINSEQ_ERR_INVALID_VALUE,
                "dt_strides.state", "state stride on dt");
    q = p;
    q.B_strides = (linseq_strides){INT64_MAX / 2, 1, 1, 1};
    expect_fail(linseq_ssm1_forward(&q, NULL, y, NULL), LINSEQ_ERR_SIZE_OVERFLOW, "B_strides",
                "span past memory");
    q = p;
    q.gate = buf + 2560;
    q.gate_strides = (linseq_strides){INT64_MAX / 4, INT64_MAX / 4, INT64_MAX / 4, 0};
    expect_fail(linseq_ssm1_forward(&q, NULL, y, NULL), LINSEQ_ERR_SIZE_OVERFLOW, "gate_strides",
                "sum of reaches overflows");
    /* y inside the span C's strides reach (B row 1 lies 3000 elements on) */
    q = p;
    q.C_strides = (linseq_strides){3000, N, 0, 1};
    q.C_proj = buf;
    float *inside = buf + 2700;
    expect_fail(linseq_ssm1_forward(&q, NULL, inside, NULL), LINSEQ_ERR_ALIASING, "C_proj",
                "output inside a strided input's span");
    /* the same y outside the span is accepted */
    q.C_strides = (linseq_strides){64, N, 0, 1};
    CHECK_OK(linseq_ssm1_forward(&q, NULL, y, NULL));
    /* nothing written by the refused calls: y changed only by the last, valid one */
    CHECK(!tu_same_bits(y, y_copy, (size_t)(B * T * D)), "the valid call wrote y");
    /* backward: d_y and the per-token gradients in the channel-first layout are sized as such */
    q = p;
    q.channel_first = true;
    float *dx = tu_alloc((size_t)(B * T * D));
    const linseq_ssm1_grads g = {.dx = dx};
    CHECK_OK(linseq_ssm1_backward(&q, NULL, y, NULL, &g));
    free(buf), free(y), free(y_copy), free(dx);
}

int main(void)
{
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) {
            printf("layouts %s: not available on this CPU, skipped\n", ls_isa_name((ls_isa)isa));
            continue;
        }
        test_isa = (ls_isa)isa;
        const tu_mark mark = tu_mark_now();
        test_layouts_match_dense();
        test_conv_layouts();
        tu_mark tally = {0, 0};
        tu_tally_add(&tally, mark);
        char label[64];
        snprintf(label, sizeof label, "ssm1 and conv1d layouts %s", ls_isa_name(test_isa));
        tu_report(label, tally, "channel_first and strided inputs bitwise equal to dense");
    }
    test_stride_validation();
    return tu_finish("test_layouts");
}
