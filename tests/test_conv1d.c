/* Causal depthwise conv1d forward: the fast path against the double reference and a
 * hand-worked example, state chaining and in-place decode, varlen, activations, thread count,
 * W == 1, and the table of invalid arguments.
 * Backward: the fast path against the double reference backward, both against finite
 * differences of the double forward, the same properties for the gradients, large inputs, and
 * its own table of invalid arguments.
 * The vector activations the SSM1 and conv kernels share, against double.
 * The numeric and property tests run once per ISA the CPU has (scalar, avx2, avx512), each
 * through ls_conv1d_forward_isa / _backward_isa, the entry points with the kernels' ISA as an
 * argument; the tables of invalid arguments go through the public entry points. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <float.h>

#include "core/activation.h"
#include "core/half_float.h"
#include "simd/isa.h"
#include "ssm/ssm_internal.h"
#include "ssm/ssm_kernels.h"
#include "testutil.h"

/* The ISA whose kernels the numeric tests run; main sets it to each one the CPU has. */
static ls_isa test_isa = LS_ISA_SCALAR;

static linseq_status conv_forward(const linseq_conv1d_problem *p, const linseq_exec *exec, float *y,
                                  float *conv_state_out)
{
    return ls_conv1d_forward_isa(p, exec, y, conv_state_out, test_isa);
}

static linseq_status conv_backward(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                   const float *d_y, const float *d_conv_state_out,
                                   const linseq_conv1d_grads *grads)
{
    return ls_conv1d_backward_isa(p, exec, d_y, d_conv_state_out, grads, test_isa);
}

/* fn (act resolved) over n floats in the vector form the kernels of test_isa compute: an
 * in-kernel activation is compared bitwise with the same math applied outside through this. */
static void kernel_math(ls_ssm_vfn fn, linseq_activation act, size_t n, const float *x, float *y)
{
    ls_ssm_kernels(test_isa)->vmath_n(fn, act, (int64_t)n, x, y);
}

typedef struct conv_spec {
    int64_t B, T, D, W;
    bool bias, state;
    linseq_activation act;
    const int64_t *cu_seqlens; /* with B == 1 */
    int64_t n_seqs;
} conv_spec;

typedef struct conv_data {
    linseq_conv1d_problem p;
    float *x, *weight, *bias, *state;
    size_t n_y, n_state;
} conv_data;

/* x N(0,1), weight N(0,0.5^2) as in the reference cases; bias and state N(0,1). */
static void conv_make(conv_data *c, const conv_spec *sp, uint64_t seed)
{
    tu_rng rng = {seed};
    memset(c, 0, sizeof *c);
    const int64_t n_seqs = sp->cu_seqlens ? sp->n_seqs : sp->B;
    c->n_y = (size_t)(sp->B * sp->T * sp->D);
    c->n_state = (size_t)(n_seqs * sp->D * (sp->W - 1));
    c->x = tu_alloc(c->n_y);
    c->weight = tu_alloc((size_t)(sp->D * sp->W));
    tu_fill_normal(&rng, c->x, c->n_y, 1.0);
    tu_fill_normal(&rng, c->weight, (size_t)(sp->D * sp->W), 0.5);
    if (sp->bias) {
        c->bias = tu_alloc((size_t)sp->D);
        tu_fill_normal(&rng, c->bias, (size_t)sp->D, 1.0);
    }
    if (sp->state) {
        c->state = tu_alloc(c->n_state);
        tu_fill_normal(&rng, c->state, c->n_state, 1.0);
    }
    linseq_conv1d_problem p = {
        .B = sp->B,
        .T = sp->T,
        .D = sp->D,
        .W = sp->W,
        .cu_seqlens = sp->cu_seqlens,
        .n_seqs = sp->n_seqs,
        .x = c->x,
        .weight = c->weight,
        .bias = c->bias,
        .conv_state = c->state,
        .activation = sp->act,
    };
    c->p = p;
}

static void conv_free(conv_data *c)
{
    free(c->x);
    free(c->weight);
    free(c->bias);
    free(c->state);
}

/* ------------------------------------------------------------------------------------ */

/* W = 3, one channel, worked by hand: xs = [10, 20, 1, 2, 3] (state, then x). */
static void test_hand_example(void)
{
    const float x[3] = {1.0f, 2.0f, 3.0f}, weight[3] = {0.5f, -1.0f, 2.0f}, bias[1] = {0.25f};
    const float state[2] = {10.0f, 20.0f};
    const float y_expect[3] = {0.25f + 5.0f - 20.0f + 2.0f, 0.25f + 10.0f - 1.0f + 4.0f,
                               0.25f + 0.5f - 2.0f + 6.0f};
    linseq_conv1d_problem p = {.B = 1,
                               .T = 3,
                               .D = 1,
                               .W = 3,
                               .x = x,
                               .weight = weight,
                               .bias = bias,
                               .conv_state = state};
    float y[3], state_out[2], y_ref[3], state_ref[2];
    CHECK_OK(conv_forward(&p, NULL, y, state_out));
    ls_conv1d_reference(&p, y_ref, state_ref);
    for (int t = 0; t < 3; t++) {
        CHECK(y[t] == y_expect[t], "hand y[%d] = %g, expected %g", t, y[t], y_expect[t]);
        CHECK(y_ref[t] == y_expect[t], "hand reference y[%d] = %g", t, y_ref[t]);
    }
    CHECK(state_out[0] == 2.0f && state_out[1] == 3.0f,
          "hand state_out = [%g, %g], expected [2, 3]", state_out[0], state_out[1]);
    CHECK(state_ref[0] == 2.0f && state_ref[1] == 3.0f, "hand reference state_out wrong");

    /* One token: the new state keeps the newest old entry (20) and appends x_0. */
    p.T = 1;
    CHECK_OK(conv_forward(&p, NULL, y, state_out));
    CHECK(y[0] == y_expect[0], "hand T=1: y = %g", y[0]);
    CHECK(state_out[0] == 20.0f && state_out[1] == 1.0f,
          "hand T=1: state_out = [%g, %g], expected [20, 1]", state_out[0], state_out[1]);
}

/* Fast float32 against the double reference. y is a bias plus W products, each rounded to
 * float32: the error is a few ulp of sum |w x|, measured at most 1.4e-7 of max|y| over these
 * cases; 1e-6 keeps a margin for other compilers and libms and still catches a wrong tap or a
 * misplaced state entry (errors of O(1)). conv_state_out is a copy of inputs: exact. */
static void check_against_reference(const conv_spec *sp, uint64_t seed, const char *label)
{
    conv_data c;
    conv_make(&c, sp, seed);
    float *y = tu_alloc_poisoned(c.n_y), *state_out = tu_alloc_poisoned(c.n_state);
    float *y_ref = tu_alloc(c.n_y), *state_ref = tu_alloc(c.n_state);
    CHECK_OK(conv_forward(&c.p, NULL, y, state_out));
    ls_conv1d_reference(&c.p, y_ref, state_ref);
    double err = tu_rel_err(y, y_ref, c.n_y);
    CHECK(err <= 1e-6, "%s: y rel err %.3g", label, err);
    CHECK(tu_same_bits(state_out, state_ref, c.n_state), "%s: conv_state_out differs", label);
    free(y);
    free(state_out);
    free(y_ref);
    free(state_ref);
    conv_free(&c);
}

static void test_against_reference(void)
{
    static const int64_t widths[] = {1, 2, 3, 4, 7};
    static const int64_t lengths[] = {1, 2, 5, 40};
    static const int64_t channels[] = {3, 64, 100};
    char label[96];
    int variant = 0;
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
        for (size_t ti = 0; ti < sizeof lengths / sizeof lengths[0]; ti++)
            for (size_t di = 0; di < sizeof channels / sizeof channels[0]; di++, variant++) {
                conv_spec sp = {.B = 2,
                                .T = lengths[ti],
                                .D = channels[di],
                                .W = widths[wi],
                                .bias = variant % 2 == 0,
                                .state = variant % 3 != 0,
                                .act = (linseq_activation)(variant % 6)};
                snprintf(label, sizeof label, "W=%lld T=%lld D=%lld bias=%d state=%d act=%d",
                         (long long)sp.W, (long long)sp.T, (long long)sp.D, sp.bias, sp.state,
                         (int)sp.act);
                check_against_reference(&sp, 1000 + (uint64_t)variant, label);
            }
    /* Several channel spans and token chunks of the forward's items, the last span ragged. */
    const conv_spec wide = {
        .B = 2, .T = 200, .D = 600, .W = 4, .bias = true, .state = true, .act = LINSEQ_ACT_SILU};
    check_against_reference(&wide, 1090, "D=600 T=200");
}

/* Every activation == the activation applied to the identity output (bitwise: it is the
 * last operation), and against the reference. */
static void test_activations(void)
{
    conv_spec base = {.B = 2, .T = 30, .D = 70, .W = 4, .bias = true, .state = true};
    conv_data c;
    conv_make(&c, &base, 1100);
    float *y_lin = tu_alloc(c.n_y), *y = tu_alloc_poisoned(c.n_y);
    linseq_conv1d_problem p = c.p;
    p.activation = LINSEQ_ACT_IDENTITY;
    CHECK_OK(conv_forward(&p, NULL, y_lin, NULL));
    for (int act = LINSEQ_ACT_DEFAULT; act <= LINSEQ_ACT_RELU; act++) {
        p.activation = (linseq_activation)act;
        CHECK_OK(conv_forward(&p, NULL, y, NULL));
        const linseq_activation resolved =
            act == LINSEQ_ACT_DEFAULT ? LINSEQ_ACT_IDENTITY : (linseq_activation)act;
        float *expect = tu_alloc(c.n_y);
        kernel_math(LS_SSM_VACT, resolved, c.n_y, y_lin, expect);
        size_t bad = 0;
        for (size_t i = 0; i < c.n_y; i++)
            if (memcmp(&expect[i], &y[i], sizeof expect[i]) != 0) bad++;
        free(expect);
        CHECK(bad == 0, "activation %d: %zu outputs differ from act(identity output)", act, bad);
        char label[32];
        snprintf(label, sizeof label, "activation %d", act);
        conv_spec sp = base;
        sp.act = (linseq_activation)act;
        check_against_reference(&sp, 1101 + (uint64_t)act, label);
    }
    free(y_lin);
    free(y);
    conv_free(&c);
}

/* One call == the same tokens in pieces, each piece starting from the previous piece's
 * conv_state_out (bitwise: the same products in the same order). in_place runs the pieces
 * with conv_state_out == conv_state; pieces shorter than W-1 test the state shift. */
static void check_chaining(int64_t W, const int64_t *pieces, int n_pieces, bool initial_state,
                           bool in_place, const char *label)
{
    int64_t T = 0;
    for (int i = 0; i < n_pieces; i++) T += pieces[i];
    conv_spec sp = {.B = 2,
                    .T = T,
                    .D = 67,
                    .W = W,
                    .bias = true,
                    .state = initial_state,
                    .act = LINSEQ_ACT_SILU};
    conv_data c;
    conv_make(&c, &sp, 1200 + (uint64_t)W);
    float *y_full = tu_alloc(c.n_y), *state_full = tu_alloc(c.n_state);
    CHECK_OK(conv_forward(&c.p, NULL, y_full, state_full));

    float *y_pieces = tu_alloc_poisoned(c.n_y), *state = tu_alloc_poisoned(c.n_state);
    float *next = tu_alloc_poisoned(c.n_state);
    float *x_piece = tu_alloc(c.n_y), *y_piece = tu_alloc(c.n_y);
    int64_t t0 = 0;
    for (int i = 0; i < n_pieces; i++) {
        const int64_t len = pieces[i];
        tu_slice_tokens(c.x, sp.B, T, sp.D, t0, len, x_piece);
        linseq_conv1d_problem p = c.p;
        p.T = len;
        p.x = x_piece;
        p.conv_state = i == 0 ? c.state : state;
        float *out = in_place && i > 0 ? state : next;
        CHECK_OK(conv_forward(&p, NULL, y_piece, out));
        if (out == next) memcpy(state, next, c.n_state * sizeof(float));
        tu_place_tokens(y_piece, sp.B, T, sp.D, t0, len, y_pieces);
        t0 += len;
    }
    CHECK(tu_same_bits(y_full, y_pieces, c.n_y), "%s: y of the pieces differs from one call",
          label);
    CHECK(tu_same_bits(state_full, state, c.n_state), "%s: the final state differs from one call",
          label);
    free(y_full);
    free(state_full);
    free(y_pieces);
    free(state);
    free(next);
    free(x_piece);
    free(y_piece);
    conv_free(&c);
}

static void test_chaining(void)
{
    static const int64_t halves[] = {5, 4}, short_first[] = {2, 7};
    static const int64_t short_pieces[] = {1, 1, 2, 1, 3, 1};
    static const int64_t ones[] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (int64_t W = 2; W <= 5; W++) {
        for (int st = 0; st <= 1; st++) {
            char label[80];
            snprintf(label, sizeof label, "W=%lld state=%d halves", (long long)W, st);
            check_chaining(W, halves, 2, st, false, label);
            snprintf(label, sizeof label, "W=%lld state=%d short first piece", (long long)W, st);
            check_chaining(W, short_first, 2, st, false, label);
            snprintf(label, sizeof label, "W=%lld state=%d in place, short pieces", (long long)W,
                     st);
            check_chaining(W, short_pieces, 6, st, true, label);
            snprintf(label, sizeof label, "W=%lld state=%d in-place decode", (long long)W, st);
            check_chaining(W, ones, 8, st, true, label);
        }
    }
    /* A window wider than the forward's token chunk (CONV1D_CHUNK): the state is still read
     * only by the first chunk's items, before any of them writes the new state in place. */
    static const int64_t long_pieces[] = {150, 30, 1};
    const int64_t wide = CONV1D_CHUNK + 6;
    check_chaining(wide, long_pieces, 3, true, true, "wide window, in place");
    check_chaining(wide, long_pieces, 3, false, false, "wide window");
}

/* Varlen == one call per sequence (bitwise); an empty sequence passes its state row through,
 * or zeros. */
static void test_varlen(void)
{
    static const int64_t cu[] = {0, 2, 2, 30, 31, 45};
    const int64_t n_seqs = 5, D = 70, W = 4;
    for (int with_state = 0; with_state <= 1; with_state++) {
        conv_spec sp = {.B = 1,
                        .T = 45,
                        .D = D,
                        .W = W,
                        .bias = true,
                        .state = with_state,
                        .act = LINSEQ_ACT_SILU,
                        .cu_seqlens = cu,
                        .n_seqs = n_seqs};
        conv_data c;
        conv_make(&c, &sp, 1300 + (uint64_t)with_state);
        float *y = tu_alloc_poisoned(c.n_y), *state_out = tu_alloc_poisoned(c.n_state);
        CHECK_OK(conv_forward(&c.p, NULL, y, state_out));
        const size_t row = (size_t)(D * (W - 1));
        for (int64_t n = 0; n < n_seqs; n++) {
            const int64_t t0 = cu[n], len = cu[n + 1] - cu[n];
            if (len == 0) {
                bool passed = true;
                for (size_t i = 0; i < row; i++)
                    passed &= state_out[n * row + i] == (c.state ? c.state[n * row + i] : 0.0f);
                CHECK(passed, "varlen: empty sequence %lld did not pass its state through",
                      (long long)n);
                continue;
            }
            linseq_conv1d_problem p = c.p;
            p.cu_seqlens = NULL;
            p.n_seqs = 0;
            p.T = len;
            p.x = c.x + t0 * D;
            p.conv_state = c.state ? c.state + n * row : NULL;
            float *y_one = tu_alloc((size_t)(len * D)), *state_one = tu_alloc(row);
            CHECK_OK(conv_forward(&p, NULL, y_one, state_one));
            CHECK(tu_same_bits(y + t0 * D, y_one, (size_t)(len * D)),
                  "varlen: y of sequence %lld differs from its own call", (long long)n);
            CHECK(tu_same_bits(state_out + n * row, state_one, row),
                  "varlen: state of sequence %lld differs from its own call", (long long)n);
            free(y_one);
            free(state_one);
        }
        free(y);
        free(state_out);
        conv_free(&c);
    }
}

/* Thread counts 1, 2, 3 give bitwise identical results. */
static void test_threads(void)
{
    static const int64_t cu[] = {0, 50, 51, 90};
    /* one spec a line reads as a table (clang-format would put one field a line) */
    /* clang-format off */
    const conv_spec specs[] = {
        {.B = 3, .T = 40, .D = 200, .W = 4, .bias = true, .state = true, .act = LINSEQ_ACT_SILU},
        {.B = 1, .T = 90, .D = 150, .W = 3, .state = true, .cu_seqlens = cu, .n_seqs = 3},
        {.B = 1, .T = 150, .D = 1100, .W = 4, .bias = true, .state = true,
         .act = LINSEQ_ACT_SILU}, /* several spans and chunks */
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        conv_data c;
        conv_make(&c, &specs[i], 1400 + i);
        float *y1 = tu_alloc(c.n_y), *s1 = tu_alloc(c.n_state);
        float *y = tu_alloc_poisoned(c.n_y), *s = tu_alloc_poisoned(c.n_state);
        linseq_exec one = {.threads = 1};
        CHECK_OK(conv_forward(&c.p, &one, y1, s1));
        for (int threads = 2; threads <= 3; threads++) {
            linseq_exec ex = {.threads = threads};
            CHECK_OK(conv_forward(&c.p, &ex, y, s));
            CHECK(tu_same_bits(y1, y, c.n_y), "spec %zu: y with %d threads differs", i, threads);
            CHECK(tu_same_bits(s1, s, c.n_state), "spec %zu: state with %d threads differs", i,
                  threads);
        }
        free(y1);
        free(s1);
        free(y);
        free(s);
        conv_free(&c);
    }
}

/* W == 1 has no state: the state pointers may be anything and are never touched. */
static void test_width_one(void)
{
    conv_spec sp = {.B = 2, .T = 7, .D = 9, .W = 1, .bias = true, .act = LINSEQ_ACT_RELU};
    conv_data c;
    conv_make(&c, &sp, 1500);
    float *y = tu_alloc(c.n_y), *y_ref = tu_alloc(c.n_y), *untouched = tu_alloc(16);
    tu_poison(untouched, 16 * sizeof(float));
    linseq_conv1d_problem p = c.p;
    p.conv_state = untouched; /* would be [B,D,0]: nothing to read */
    CHECK_OK(conv_forward(&p, NULL, y, untouched));
    CHECK(tu_is_poisoned(untouched, 16 * sizeof(float)), "W = 1: a state buffer was touched");
    ls_conv1d_reference(&c.p, y_ref, NULL);
    CHECK(tu_rel_err(y, y_ref, c.n_y) <= 1e-6, "W = 1: y differs from the reference");
    /* Even the output itself or an input as the (empty) state output is accepted. */
    CHECK_OK(conv_forward(&c.p, NULL, y, y));
    CHECK_OK(conv_forward(&c.p, NULL, y, c.x));
    free(y);
    free(y_ref);
    free(untouched);
    conv_free(&c);
}

/* ==================================================================================== */
/* Backward                                                                               */
/* ==================================================================================== */

enum { CG_DX, CG_DW, CG_DBIAS, CG_DSTATE, N_CONV_GRADS };
static const char *const conv_grad_names[N_CONV_GRADS] = {"dx", "dweight", "dbias", "dconv_state"};

/* The upstream gradients, and every gradient the problem has: from the fast backward (float,
 * poisoned before the call so that an element it never writes cannot pass) and from the
 * double reference. */
typedef struct conv_bwd {
    float *d_y, *d_state_out;
    size_t n[N_CONV_GRADS]; /* 0 for a gradient the problem does not have */
    float *g[N_CONV_GRADS];
    double *ref[N_CONV_GRADS];
} conv_bwd;

/* d_y and d_conv_state_out N(0,1); the latter only when with_d_state_out (and W > 1). */
static void conv_bwd_make(conv_bwd *b, const conv_data *c, bool with_d_state_out, uint64_t seed)
{
    tu_rng rng = {seed};
    const linseq_conv1d_problem *p = &c->p;
    memset(b, 0, sizeof *b);
    b->d_y = tu_alloc(c->n_y);
    tu_fill_normal(&rng, b->d_y, c->n_y, 1.0);
    if (with_d_state_out && p->W > 1) {
        b->d_state_out = tu_alloc(c->n_state);
        tu_fill_normal(&rng, b->d_state_out, c->n_state, 1.0);
    }
    const size_t sizes[N_CONV_GRADS] = {c->n_y, (size_t)(p->D * p->W), p->bias ? (size_t)p->D : 0,
                                        p->W > 1 ? c->n_state : 0};
    for (int k = 0; k < N_CONV_GRADS; k++) {
        b->n[k] = sizes[k];
        if (!sizes[k]) continue;
        b->g[k] = tu_alloc_poisoned(sizes[k]);
        b->ref[k] = calloc(sizes[k], sizeof(double));
        if (!b->ref[k]) exit(2);
    }
}

static void conv_bwd_free(conv_bwd *b)
{
    free(b->d_y);
    free(b->d_state_out);
    for (int k = 0; k < N_CONV_GRADS; k++) {
        free(b->g[k]);
        free(b->ref[k]);
    }
}

static linseq_conv1d_grads conv_grads_of(float *const g[N_CONV_GRADS])
{
    linseq_conv1d_grads out = {
        .dx = g[CG_DX], .dweight = g[CG_DW], .dbias = g[CG_DBIAS], .dconv_state = g[CG_DSTATE]};
    return out;
}

static void conv_run_backward(const conv_data *c, conv_bwd *b, const linseq_exec *exec)
{
    const linseq_conv1d_grads g = conv_grads_of(b->g);
    CHECK_OK(conv_backward(&c->p, exec, b->d_y, b->d_state_out, &g));
}

static void conv_run_reference_backward(const conv_data *c, conv_bwd *b)
{
    const ls_conv1d_grads_f64 g = {.dx = b->ref[CG_DX],
                                   .dweight = b->ref[CG_DW],
                                   .dbias = b->ref[CG_DBIAS],
                                   .dconv_state = b->ref[CG_DSTATE]};
    CHECK_OK(ls_conv1d_backward_reference(&c->p, b->d_y, b->d_state_out, &g));
}

/* Fast float32 backward against the double reference, max|a - b| / max|ref| per gradient. dx
 * and dconv_state are sums of at most W products (plus d_conv_state_out): a few ulp; dweight
 * and dbias sum B*T products in two levels, ~(64 + BT/64) ulp at worst, relative to the
 * largest term. Measured at most ~3e-7; 1e-5 leaves room for other compilers and libms while
 * a wrong tap, a shifted token or a missing d_conv_state_out is O(1). */
#define CONV_BWD_TOL 1e-5

static void check_conv_backward(const conv_spec *sp, bool with_d_state_out, uint64_t seed,
                                const char *label, double worst[N_CONV_GRADS])
{
    conv_data c;
    conv_make(&c, sp, seed);
    conv_bwd b;
    conv_bwd_make(&b, &c, with_d_state_out, seed + 1);
    conv_run_backward(&c, &b, NULL);
    conv_run_reference_backward(&c, &b);
    for (int k = 0; k < N_CONV_GRADS; k++) {
        if (!b.n[k]) continue;
        const double err = tu_rel_err_d(b.g[k], b.ref[k], b.n[k]);
        CHECK(err <= CONV_BWD_TOL, "%s: %s rel err %.3g", label, conv_grad_names[k], err);
        if (err > worst[k]) worst[k] = err;
    }
    conv_bwd_free(&b);
    conv_free(&c);
}

static void print_conv_worst(const char *what, const double worst[N_CONV_GRADS])
{
    printf("  %s, max rel err:", what);
    for (int k = 0; k < N_CONV_GRADS; k++) printf(" %s %.2g", conv_grad_names[k], worst[k]);
    printf("\n");
}

static void test_backward_against_reference(void)
{
    static const int64_t widths[] = {1, 2, 3, 4, 7};
    static const int64_t lengths[] = {1, 2, 5, 70};
    static const int64_t channels[] = {3, 64, 100};
    static const int64_t cu[] = {0, 2, 2, 70, 71, 140};
    double worst[N_CONV_GRADS] = {0};
    char label[128];
    int variant = 0;
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
        for (size_t ti = 0; ti < sizeof lengths / sizeof lengths[0]; ti++)
            for (size_t di = 0; di < sizeof channels / sizeof channels[0]; di++, variant++) {
                conv_spec sp = {.B = 2,
                                .T = lengths[ti],
                                .D = channels[di],
                                .W = widths[wi],
                                .bias = variant % 2 == 0,
                                .state = variant % 3 != 0,
                                .act = (linseq_activation)(variant % 6)};
                const bool d_state_out = variant % 4 != 1;
                snprintf(label, sizeof label,
                         "backward W=%lld T=%lld D=%lld bias=%d state=%d act=%d d_state_out=%d",
                         (long long)sp.W, (long long)sp.T, (long long)sp.D, sp.bias, sp.state,
                         (int)sp.act, d_state_out);
                check_conv_backward(&sp, d_state_out, 4000 + 2 * (uint64_t)variant, label, worst);
            }
    for (int64_t W = 1; W <= 5; W += 2) {
        conv_spec sp = {.B = 1,
                        .T = 140,
                        .D = 70,
                        .W = W,
                        .bias = true,
                        .state = true,
                        .act = LINSEQ_ACT_SILU,
                        .cu_seqlens = cu,
                        .n_seqs = 5};
        snprintf(label, sizeof label, "backward varlen W=%lld", (long long)W);
        check_conv_backward(&sp, true, 4200 + (uint64_t)W, label, worst);
    }
    /* Items of several blocks, the last ragged; several token chunks; a window wider than
     * the ring's chunk of tokens. */
    const conv_spec wide = {.B = 2,
                            .T = 150,
                            .D = 600,
                            .W = 4,
                            .bias = true,
                            .state = true,
                            .act = LINSEQ_ACT_GELU_TANH};
    check_conv_backward(&wide, true, 4250, "backward D=600", worst);
    const conv_spec long_window = {
        .B = 1, .T = 90, .D = 70, .W = 20, .bias = true, .state = true, .act = LINSEQ_ACT_SILU};
    check_conv_backward(&long_window, true, 4260, "backward W=20", worst);
    print_conv_worst("backward vs double reference", worst);
}

/* L = sum(y d_y) + sum(conv_state_out d_conv_state_out), everything in double. */
static double conv_loss(const conv_data *c, const conv_bwd *b, double *y, double *state_out)
{
    ls_conv1d_reference_f64(&c->p, y, state_out);
    double loss = 0.0;
    for (size_t i = 0; i < c->n_y; i++) loss += y[i] * b->d_y[i];
    if (b->d_state_out)
        for (size_t i = 0; i < c->n_state; i++) loss += state_out[i] * b->d_state_out[i];
    return loss;
}

/* Central differences with h = 2^-10 of the double forward: each input element moved to the
 * float32 values v +- h (the quotient divides by the step actually taken). L is linear in x,
 * weight, bias and conv_state except through the activation, so the truncation error is
 * h^2/6 |act^(3)| |u|^3, u the factor the input meets (a weight ~0.5 for x and the state, an
 * input up to ~3 for the weight): up to ~4e-6 of the gradients, measured 1.3e-6. Rounding is
 * 1e-16 |L| / h ~ 1e-12, and the fast backward adds its float32 error (< 1e-6). 1e-5 of
 * max|grad| still catches any wrong term (O(1e-2) or more). Relu is left out (a difference
 * across its kink is meaningless); test_backward_activation_outside checks its derivative
 * exactly. Every element of every input is checked. */
#define FD_STEP 0x1p-10
#define CONV_FD_TOL 1e-5

static void check_conv_finite_differences(const conv_spec *sp, uint64_t seed, const char *label,
                                          double worst[2])
{
    conv_data c;
    conv_make(&c, sp, seed);
    if (!c.state && sp->W > 1) { /* perturbing the state needs one: start from zeros */
        c.state = tu_alloc(c.n_state);
        c.p.conv_state = c.state;
    }
    conv_bwd b;
    conv_bwd_make(&b, &c, true, seed + 1);
    conv_run_backward(&c, &b, NULL);
    conv_run_reference_backward(&c, &b);
    double *y = malloc(c.n_y * sizeof *y), *state_out = malloc((c.n_state + 1) * sizeof *y);
    if (!y || !state_out) exit(2);
    float *const inputs[N_CONV_GRADS] = {c.x, c.weight, c.bias, c.state};
    for (int k = 0; k < N_CONV_GRADS; k++) {
        float *v = inputs[k];
        if (!v || !b.n[k]) continue;
        double scale = 0.0, err_ref = 0.0, err_fast = 0.0;
        for (size_t i = 0; i < b.n[k]; i++) scale = fmax(scale, fabs(b.ref[k][i]));
        for (size_t i = 0; i < b.n[k]; i++) {
            const float saved = v[i];
            const float up = (float)(saved + FD_STEP), down = (float)(saved - FD_STEP);
            v[i] = up;
            const double loss_up = conv_loss(&c, &b, y, state_out);
            v[i] = down;
            const double loss_down = conv_loss(&c, &b, y, state_out);
            v[i] = saved;
            const double fd = (loss_up - loss_down) / ((double)up - (double)down);
            err_ref = fmax(err_ref, fabs(fd - b.ref[k][i]));
            err_fast = fmax(err_fast, fabs(fd - (double)b.g[k][i]));
        }
        err_ref /= scale > 0.0 ? scale : 1.0;
        err_fast /= scale > 0.0 ? scale : 1.0;
        CHECK(err_ref <= CONV_FD_TOL, "%s: %s: finite differences vs reference backward %.3g",
              label, conv_grad_names[k], err_ref);
        CHECK(err_fast <= CONV_FD_TOL, "%s: %s: finite differences vs fast backward %.3g", label,
              conv_grad_names[k], err_fast);
        worst[0] = fmax(worst[0], err_ref);
        worst[1] = fmax(worst[1], err_fast);
    }
    free(y);
    free(state_out);
    conv_bwd_free(&b);
    conv_free(&c);
}

static void test_backward_finite_differences(void)
{
    static const int64_t cu[] = {0, 2, 2, 9};
    double worst[2] = {0.0, 0.0};
    char label[80];
    for (int act = LINSEQ_ACT_DEFAULT; act < LINSEQ_ACT_RELU; act++) {
        conv_spec sp = {.B = 2,
                        .T = 7,
                        .D = 5,
                        .W = 4,
                        .bias = true,
                        .state = act % 2 == 0,
                        .act = (linseq_activation)act};
        snprintf(label, sizeof label, "finite differences, activation %d", act);
        check_conv_finite_differences(&sp, 4300 + (uint64_t)act, label, worst);
    }
    conv_spec varlen = {.B = 1,
                        .T = 9,
                        .D = 5,
                        .W = 3,
                        .bias = true,
                        .state = true,
                        .act = LINSEQ_ACT_SILU,
                        .cu_seqlens = cu,
                        .n_seqs = 3};
    check_conv_finite_differences(&varlen, 4310, "finite differences, varlen", worst);
    conv_spec single = {.B = 2, .T = 6, .D = 3, .W = 1, .bias = true, .act = LINSEQ_ACT_GELU_TANH};
    check_conv_finite_differences(&single, 4320, "finite differences, W = 1", worst);
    printf("  finite differences, max err / max|grad|: reference backward %.2g, fast %.2g\n",
           worst[0], worst[1]);
}

/* For every activation: the backward == the identity conv's backward with d_y * act'(pre) as
 * its upstream gradient, pre being the identity conv's output. Bitwise: the kernel recomputes
 * pre with the forward's arithmetic and does exactly this multiplication. */
static void test_backward_activation_outside(void)
{
    conv_spec base = {.B = 2, .T = 70, .D = 70, .W = 4, .bias = true, .state = true};
    conv_data c;
    conv_make(&c, &base, 4400);
    float *pre = tu_alloc(c.n_y);
    linseq_conv1d_problem identity = c.p;
    identity.activation = LINSEQ_ACT_IDENTITY;
    CHECK_OK(conv_forward(&identity, NULL, pre, NULL));
    for (int act = LINSEQ_ACT_DEFAULT; act <= LINSEQ_ACT_RELU; act++) {
        conv_data with_act = c;
        with_act.p.activation = (linseq_activation)act;
        const linseq_activation resolved = conv1d_activation(&with_act.p);
        conv_bwd in, out;
        conv_bwd_make(&in, &with_act, true, 4410);
        conv_run_backward(&with_act, &in, NULL);
        conv_data plain = c;
        plain.p = identity;
        conv_bwd_make(&out, &plain, true, 4410);
        float *slope = tu_alloc(c.n_y);
        kernel_math(LS_SSM_VACT_GRAD, resolved, c.n_y, pre, slope);
        for (size_t i = 0; i < c.n_y; i++) out.d_y[i] = in.d_y[i] * slope[i];
        free(slope);
        conv_run_backward(&plain, &out, NULL);
        for (int k = 0; k < N_CONV_GRADS; k++)
            CHECK(tu_same_bits(in.g[k], out.g[k], in.n[k]),
                  "activation %d: %s differs from the identity conv's with d_y * act'", act,
                  conv_grad_names[k]);
        conv_bwd_free(&in);
        conv_bwd_free(&out);
    }
    free(pre);
    conv_free(&c);
}

/* The relative error of a float result against a double sum of float pieces. */
#define CONV_SUM_TOL 1e-5

static void add_floats(double *sum, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) sum[i] += src[i];
}

/* Varlen == one call per sequence: dx and dconv_state bitwise, dweight and dbias within
 * CONV_SUM_TOL of the sum of the calls' (another summation order). An empty sequence passes
 * d_conv_state_out to dconv_state. */
static void test_backward_varlen(void)
{
    static const int64_t cu[] = {0, 2, 2, 100, 101, 145};
    const int64_t n_seqs = 5, D = 70, W = 4;
    for (int with_state = 0; with_state <= 1; with_state++) {
        conv_spec sp = {.B = 1,
                        .T = 145,
                        .D = D,
                        .W = W,
                        .bias = true,
                        .state = with_state,
                        .act = LINSEQ_ACT_SILU,
                        .cu_seqlens = cu,
                        .n_seqs = n_seqs};
        conv_data c;
        conv_make(&c, &sp, 4500 + (uint64_t)with_state);
        conv_bwd all;
        conv_bwd_make(&all, &c, with_state, 4510);
        conv_run_backward(&c, &all, NULL);
        const size_t row = (size_t)(D * (W - 1));
        double *dw_sum = calloc((size_t)(D * W), sizeof(double));
        double *db_sum = calloc((size_t)D, sizeof(double));
        if (!dw_sum || !db_sum) exit(2);
        for (int64_t n = 0; n < n_seqs; n++) {
            const int64_t t0 = cu[n], len = cu[n + 1] - cu[n];
            const float *dstate = all.g[CG_DSTATE] + n * row;
            if (len == 0) {
                bool passed = true;
                for (size_t i = 0; i < row; i++)
                    passed &= dstate[i] == (all.d_state_out ? all.d_state_out[n * row + i] : 0.0f);
                CHECK(passed,
                      "varlen backward: empty sequence %lld did not pass "
                      "d_conv_state_out to dconv_state",
                      (long long)n);
                continue;
            }
            conv_data one = c;
            one.p.cu_seqlens = NULL;
            one.p.n_seqs = 0;
            one.p.T = len;
            one.p.x = c.x + t0 * D;
            one.p.conv_state = c.state ? c.state + n * row : NULL;
            one.n_y = (size_t)(len * D);
            one.n_state = row;
            conv_bwd b;
            conv_bwd_make(&b, &one, with_state, 4520);
            memcpy(b.d_y, all.d_y + t0 * D, one.n_y * sizeof(float));
            if (b.d_state_out)
                memcpy(b.d_state_out, all.d_state_out + n * row, row * sizeof(float));
            conv_run_backward(&one, &b, NULL);
            CHECK(tu_same_bits(all.g[CG_DX] + t0 * D, b.g[CG_DX], one.n_y),
                  "varlen backward: dx of sequence %lld differs from its own call", (long long)n);
            CHECK(tu_same_bits(dstate, b.g[CG_DSTATE], row),
                  "varlen backward: dconv_state of sequence %lld differs from its own call",
                  (long long)n);
            add_floats(dw_sum, b.g[CG_DW], (size_t)(D * W));
            add_floats(db_sum, b.g[CG_DBIAS], (size_t)D);
            conv_bwd_free(&b);
        }
        double err = tu_rel_err_d(all.g[CG_DW], dw_sum, (size_t)(D * W));
        CHECK(err <= CONV_SUM_TOL, "varlen backward: dweight rel err %.3g against the calls' sum",
              err);
        err = tu_rel_err_d(all.g[CG_DBIAS], db_sum, (size_t)D);
        CHECK(err <= CONV_SUM_TOL, "varlen backward: dbias rel err %.3g against the calls' sum",
              err);
        free(dw_sum);
        free(db_sum);
        conv_bwd_free(&all);
        conv_free(&c);
    }
}

/* One call == two pieces, the second starting from the first's conv_state_out and the first
 * getting the second's dconv_state as its d_conv_state_out (the last call gets the whole
 * call's). Within CONV_SUM_TOL: the gradients of the W-1 inputs next to the cut, and dweight
 * and dbias, add the same terms in another order; first pieces shorter than W-1 included. */
static void check_backward_chained(int64_t W, int64_t first, int64_t T)
{
    const int64_t B = 2, D = 67;
    conv_spec sp = {
        .B = B, .T = T, .D = D, .W = W, .bias = true, .state = true, .act = LINSEQ_ACT_SILU};
    conv_data c;
    conv_make(&c, &sp, 4600 + (uint64_t)(W * 100 + first));
    conv_bwd whole;
    conv_bwd_make(&whole, &c, true, 4610);
    conv_run_backward(&c, &whole, NULL);

    const int64_t t0[2] = {0, first}, len[2] = {first, T - first};
    conv_data piece[2];
    conv_bwd pb[2];
    float *state_mid = tu_alloc(c.n_state), *y_first = tu_alloc(c.n_y);
    for (int i = 0; i < 2; i++) {
        piece[i] = c;
        piece[i].p.T = len[i];
        piece[i].n_y = (size_t)(B * len[i] * D);
        piece[i].x = tu_alloc(piece[i].n_y);
        tu_slice_tokens(c.x, B, T, D, t0[i], len[i], piece[i].x);
        piece[i].p.x = piece[i].x;
        conv_bwd_make(&pb[i], &piece[i], true, 4620);
        tu_slice_tokens(whole.d_y, B, T, D, t0[i], len[i], pb[i].d_y);
    }
    CHECK_OK(conv_forward(&piece[0].p, NULL, y_first, state_mid));
    piece[1].p.conv_state = state_mid;
    memcpy(pb[1].d_state_out, whole.d_state_out, c.n_state * sizeof(float));
    conv_run_backward(&piece[1], &pb[1], NULL);
    memcpy(pb[0].d_state_out, pb[1].g[CG_DSTATE], c.n_state * sizeof(float));
    conv_run_backward(&piece[0], &pb[0], NULL);

    float *dx = tu_alloc_poisoned(c.n_y);
    for (int i = 0; i < 2; i++) tu_place_tokens(pb[i].g[CG_DX], B, T, D, t0[i], len[i], dx);
    CHECK(tu_rel_err(dx, whole.g[CG_DX], c.n_y) <= CONV_SUM_TOL,
          "chained W=%lld first=%lld: dx of the pieces differs from one call", (long long)W,
          (long long)first);
    CHECK(tu_rel_err(pb[0].g[CG_DSTATE], whole.g[CG_DSTATE], c.n_state) <= CONV_SUM_TOL,
          "chained W=%lld first=%lld: dconv_state differs from one call", (long long)W,
          (long long)first);
    for (int k = CG_DW; k <= CG_DBIAS; k++) {
        double *sum = calloc(whole.n[k], sizeof(double));
        if (!sum) exit(2);
        add_floats(sum, pb[0].g[k], whole.n[k]);
        add_floats(sum, pb[1].g[k], whole.n[k]);
        const double err = tu_rel_err_d(whole.g[k], sum, whole.n[k]);
        CHECK(err <= CONV_SUM_TOL, "chained W=%lld first=%lld: %s rel err %.3g", (long long)W,
              (long long)first, conv_grad_names[k], err);
        free(sum);
    }
    free(dx);
    free(state_mid);
    free(y_first);
    for (int i = 0; i < 2; i++) {
        free(piece[i].x);
        conv_bwd_free(&pb[i]);
    }
    conv_bwd_free(&whole);
    conv_free(&c);
}

static void test_backward_chained(void)
{
    for (int64_t W = 2; W <= 5; W++) {
        check_backward_chained(W, 13, 20);
        check_backward_chained(W, 1, 20);    /* a first piece shorter than W-1 (for W > 2) */
        check_backward_chained(W, 100, 103); /* a second piece shorter than W-1 (W = 5) */
    }
}

/* Thread counts 1, 2, 3 give bitwise identical gradients, and a call asking for one gradient
 * gets the same bits for it. */
static void test_backward_threads(void)
{
    static const int64_t cu[] = {0, 50, 51, 90};
    /* one spec a line reads as a table (clang-format would put one field a line) */
    /* clang-format off */
    const conv_spec specs[] = {
        {.B = 3, .T = 40, .D = 200, .W = 4, .bias = true, .state = true, .act = LINSEQ_ACT_SILU},
        {.B = 1, .T = 90, .D = 150, .W = 3, .state = true, .cu_seqlens = cu, .n_seqs = 3},
        /* enough blocks that items group several, differently for each thread count */
        {.B = 2, .T = 70, .D = 1100, .W = 4, .bias = true, .state = true,
         .act = LINSEQ_ACT_SILU},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        conv_data c;
        conv_make(&c, &specs[i], 4700 + i);
        conv_bwd one, b;
        conv_bwd_make(&one, &c, true, 4710);
        conv_bwd_make(&b, &c, true, 4710);
        const linseq_exec single = {.threads = 1};
        conv_run_backward(&c, &one, &single);
        for (int threads = 2; threads <= 3; threads++) {
            const linseq_exec ex = {.threads = threads};
            for (int k = 0; k < N_CONV_GRADS; k++)
                if (b.g[k]) tu_poison(b.g[k], b.n[k] * sizeof(float));
            conv_run_backward(&c, &b, &ex);
            for (int k = 0; k < N_CONV_GRADS; k++)
                CHECK(tu_same_bits(one.g[k], b.g[k], one.n[k]),
                      "spec %zu: %s with %d threads differs from 1 thread", i, conv_grad_names[k],
                      threads);
        }
        for (int k = 0; k < N_CONV_GRADS; k++) {
            if (!b.g[k]) continue;
            float *only[N_CONV_GRADS] = {0};
            only[k] = b.g[k];
            tu_poison(b.g[k], b.n[k] * sizeof(float));
            const linseq_conv1d_grads g = conv_grads_of(only);
            CHECK_OK(conv_backward(&c.p, NULL, b.d_y, b.d_state_out, &g));
            CHECK(tu_same_bits(one.g[k], b.g[k], one.n[k]),
                  "spec %zu: %s alone differs from %s with every gradient", i, conv_grad_names[k],
                  conv_grad_names[k]);
        }
        conv_bwd_free(&one);
        conv_bwd_free(&b);
        conv_free(&c);
    }
}

/* W == 1 has no state: the state gradient pointers may be anything and are never touched. */
static void test_backward_width_one(void)
{
    conv_spec sp = {.B = 2, .T = 7, .D = 9, .W = 1, .bias = true, .act = LINSEQ_ACT_SILU};
    conv_data c;
    conv_make(&c, &sp, 4800);
    conv_bwd b;
    conv_bwd_make(&b, &c, false, 4810);
    float *untouched = tu_alloc_poisoned(16);
    linseq_conv1d_grads g = conv_grads_of(b.g);
    g.dconv_state = untouched;
    CHECK_OK(conv_backward(&c.p, NULL, b.d_y, untouched, &g));
    CHECK(tu_is_poisoned(untouched, 16 * sizeof(float)), "W = 1: a state buffer was touched");
    conv_run_reference_backward(&c, &b);
    for (int k = 0; k < N_CONV_GRADS; k++)
        CHECK(tu_rel_err_d(b.g[k], b.ref[k], b.n[k]) <= CONV_BWD_TOL,
              "W = 1: %s differs from the reference", conv_grad_names[k]);
    free(untouched);
    conv_bwd_free(&b);
    conv_free(&c);
}

/* Pre-activations of +-1e4 and inputs of 1e4: every activation's gradient stays finite. */
static void test_backward_large_inputs(void)
{
    for (int act = LINSEQ_ACT_DEFAULT; act <= LINSEQ_ACT_RELU; act++) {
        conv_spec sp = {.B = 1,
                        .T = 20,
                        .D = 70,
                        .W = 4,
                        .bias = true,
                        .state = true,
                        .act = (linseq_activation)act};
        conv_data c;
        conv_make(&c, &sp, 4900 + (uint64_t)act);
        for (size_t i = 0; i < c.n_y; i++) c.x[i] = i % 2 ? 1e4f : -1e4f;
        conv_bwd b;
        conv_bwd_make(&b, &c, true, 4910);
        conv_run_backward(&c, &b, NULL);
        for (int k = 0; k < N_CONV_GRADS; k++) {
            size_t bad = 0;
            for (size_t i = 0; i < b.n[k]; i++) bad += !isfinite(b.g[k][i]);
            CHECK(bad == 0, "activation %d, large inputs: %zu of %s not finite", act, bad,
                  conv_grad_names[k]);
        }
        conv_bwd_free(&b);
        conv_free(&c);
    }
}

/* dconv_state without conv_state (the invalid arguments are in test_bad_inputs.c). */
static void test_backward_optional_inputs(void)
{
    /* dconv_state without conv_state is the gradient at the zero state; a success clears the
     * message of the failure before it. */
    const float x[2] = {1.0f, 2.0f}, weight[3] = {0.5f, -1.0f, 2.0f}, d_y[2] = {1.0f, 1.0f};
    float dstate[2] = {0.0f, 0.0f};
    linseq_conv1d_problem p = {.B = 1, .T = 2, .D = 1, .W = 3, .x = x, .weight = weight};
    linseq_conv1d_grads grads = {.dconv_state = dstate};
    CHECK(linseq_conv1d_backward(&p, NULL, d_y, NULL, NULL) == LINSEQ_ERR_NULL_POINTER,
          "NULL grads");
    CHECK_OK(linseq_conv1d_backward(&p, NULL, d_y, NULL, &grads));
    CHECK(linseq_last_error()[0] == '\0', "a success left the message \"%s\"", linseq_last_error());
    /* xs = [s0, s1, x0, x1]: y0 = 0.5 s0 - s1 + 2 x0, y1 = 0.5 s1 - x0 + 2 x1. */
    CHECK(dstate[0] == 0.5f && dstate[1] == -0.5f,
          "hand dconv_state = [%g, %g], expected [0.5, -0.5]", dstate[0], dstate[1]);
}

/* ------------------------------------------------------------------------------------ */
/* The vector activations of the SSM1 and conv kernels                                    */

/* fn(x) in double, and the size of what its float evaluation rounds: |f| for the activations
 * (times 1 + |u| for gelu, whose sigmoid argument u = 2k(z + c z^3) carries a few ulp that
 * the sigmoid scales by up to |u|), and the sum of the terms' magnitudes for the derivatives
 * that add terms of opposite signs (silu', sigmoid' = s (1 - s), gelu'), where a relative
 * bound would measure the cancellation, not the kernel. gelu is evaluated here as z sigmoid(u)
 * (= 0.5 z (1 + tanh(u/2))): below z = -5, 1 + tanh cancels to nothing even in double. */
static double vector_ref(ls_ssm_vfn fn, linseq_activation act, double z, double *scale)
{
    const double s = ls_sigmoid(z);
    const double u = 2.0 * 0.7978845608028654 * (z + 0.044715 * z * z * z);
    const double du = 2.0 * 0.7978845608028654 * (1.0 + 3 * 0.044715 * z * z);
    const double sg = ls_sigmoid(u);
    double f;
    switch (fn) {
    case LS_SSM_VACT:
        f = act == LINSEQ_ACT_GELU_TANH ? z * sg : ls_activate_ref(act, z);
        *scale = fabs(f) * (act == LINSEQ_ACT_GELU_TANH ? 1.0 + fabs(u) : 1.0);
        return f;
    case LS_SSM_VACT_GRAD:
        f = act == LINSEQ_ACT_GELU_TANH ? sg + z * sg * (1.0 - sg) * du
                                        : ls_activate_grad_ref(act, z);
        if (act == LINSEQ_ACT_SILU)
            *scale = s * (1.0 + fabs(z) * (1.0 + s));
        else if (act == LINSEQ_ACT_SIGMOID)
            *scale = s * (1.0 + s);
        else if (act == LINSEQ_ACT_GELU_TANH)
            *scale = (sg + fabs(z) * sg * (1.0 + sg) * du) * (1.0 + fabs(u));
        else
            *scale = fabs(f);
        return f;
    case LS_SSM_VSOFTPLUS:
        f = ls_softplus(z);
        *scale = fabs(f);
        return f;
    default:
        f = ls_softplus_grad(z);
        *scale = fabs(f);
        return f;
    }
}

/* Every activation, softplus and their derivatives over [-100, 100] in steps of 1/20 (both
 * branches of the sigmoid, softplus's threshold 20 on both sides, saturation) and at the
 * special points, against double: within 8 float epsilons of the scale above (vec.h bounds
 * its primitives by 4 ulp), plus 1e-37 for results in the subnormal range; relu's value and
 * slope exact, NaN passed through; softplus x itself above 20 and its slope exactly 1. */
static void test_vector_activations(void)
{
    enum { SWEEP = 4001, EXTRA = 8, N = SWEEP + EXTRA };
    static const float extra[EXTRA] = {0.0f,       -0.0f,      1e-30f, -1e-30f,
                                       19.999998f, 20.000002f, 88.0f,  -88.0f};
    float *x = tu_alloc(N), *y = tu_alloc(N);
    for (int i = 0; i < SWEEP; i++) x[i] = (float)(-100.0 + i / 20.0);
    memcpy(x + SWEEP, extra, sizeof extra);
    double worst = 0.0;
    for (int fn = LS_SSM_VACT; fn <= LS_SSM_VSOFTPLUS_GRAD; fn++) {
        /* softplus and its slope take no activation: run them once */
        const int last = fn <= LS_SSM_VACT_GRAD ? LINSEQ_ACT_RELU : LINSEQ_ACT_IDENTITY;
        for (int act = LINSEQ_ACT_IDENTITY; act <= last; act++) {
            kernel_math((ls_ssm_vfn)fn, (linseq_activation)act, N, x, y);
            size_t bad = 0;
            for (int i = 0; i < N; i++) {
                double scale;
                const double ref = vector_ref((ls_ssm_vfn)fn, (linseq_activation)act, x[i], &scale);
                const double err = fabs((double)y[i] - ref);
                const double tol = 8.0 * FLT_EPSILON * scale + 1e-37;
                if (!(err <= tol)) bad++;
                if (scale > 1e-30) worst = fmax(worst, err / (FLT_EPSILON * scale));
            }
            CHECK(bad == 0, "%s: vector fn %d, activation %d: %zu values off",
                  ls_isa_name(test_isa), fn, act, bad);
        }
    }
    printf("  vector activations: max error %.2g float epsilons of their scale\n", worst);

    /* (NaN only where no exp runs: the portable vf_exp converts its exponent to int.) */
    const float specials[4] = {NAN, 20.5f, 1e30f, -3.0f};
    float out[4];
    kernel_math(LS_SSM_VACT, LINSEQ_ACT_RELU, 4, specials, out);
    CHECK(isnan(out[0]) && out[1] == 20.5f && out[3] == 0.0f, "relu special values");
    kernel_math(LS_SSM_VACT_GRAD, LINSEQ_ACT_RELU, 4, specials, out);
    CHECK(isnan(out[0]) && out[1] == 1.0f && out[3] == 0.0f, "relu slope special values");
    kernel_math(LS_SSM_VSOFTPLUS, LINSEQ_ACT_IDENTITY, 3, specials + 1, out);
    CHECK(out[0] == 20.5f && out[1] == 1e30f, "softplus above 20 is not x itself");
    kernel_math(LS_SSM_VSOFTPLUS_GRAD, LINSEQ_ACT_IDENTITY, 3, specials + 1, out);
    CHECK(out[0] == 1.0f && out[1] == 1.0f, "softplus slope above 20 is not 1");
    free(x);
    free(y);
}

/* The shapes each layout and dtype variant runs on: dense with bias and SiLU, T = 2 < W-1,
 * and packed sequences (one of them empty) with GELU; the caller sizes the first two. */
typedef struct conv_case {
    conv_spec spec;
    char label[32];
} conv_case;
enum { N_VARIANT_CASES = 3 };

static void variant_cases(conv_case cases[N_VARIANT_CASES], int64_t dense_B, int64_t dense_T,
                          int64_t short_B)
{
    static const int64_t cu[] = {0, 3, 3, 50, 51};
    cases[0] = (conv_case){.spec = {.B = dense_B,
                                    .T = dense_T,
                                    .D = 300,
                                    .W = 4,
                                    .bias = true,
                                    .state = true,
                                    .act = LINSEQ_ACT_SILU}};
    snprintf(cases[0].label, sizeof cases[0].label, "B=%lld T=%lld D=300 W=4", (long long)dense_B,
             (long long)dense_T);
    cases[1] = (conv_case){.spec = {.B = short_B, .T = 2, .D = 37, .W = 5, .state = true},
                           .label = "T=2 < W-1, D=37 W=5"};
    cases[2] = (conv_case){.spec = {.B = 1,
                                    .T = 51,
                                    .D = 70,
                                    .W = 3,
                                    .bias = true,
                                    .state = true,
                                    .act = LINSEQ_ACT_GELU_TANH,
                                    .cu_seqlens = cu,
                                    .n_seqs = 4},
                           .label = "varlen D=70 W=3"};
}

/* state_tap_major and weight_tap_major order the same values otherwise: the forward and
 * backward with either or both give the bits of the default layouts' for y, dx and dbias, and
 * their states, weight gradient and state gradient transposed; varlen and ragged spans
 * included (2 threads). The reference in those layouts agrees too. */
static void check_tap_major(const conv_spec *sp, uint64_t seed, const char *label, bool states,
                            bool weights)
{
    conv_data c;
    conv_make(&c, sp, seed);
    const int64_t n = sp->cu_seqlens ? sp->n_seqs : sp->B, D = sp->D, W = sp->W, L = W - 1;
    const size_t n_w = (size_t)(D * W);
    const linseq_exec ex = {.threads = 2};
    float *y = tu_alloc(c.n_y), *st = tu_alloc(c.n_state);
    float *y_tm = tu_alloc_poisoned(c.n_y), *st_tm = tu_alloc_poisoned(c.n_state);
    float *tm_in = tu_alloc(c.n_state), *tm_w = tu_alloc(n_w);
    float *back = tu_alloc(c.n_state > n_w ? c.n_state : n_w);
    tu_tap_layout(tm_in, c.state, n, D, L, states, false);
    tu_tap_layout(tm_w, c.weight, 1, D, W, weights, false);
    CHECK_OK(conv_forward(&c.p, &ex, y, st));
    conv_data t = c;
    t.p.state_tap_major = states, t.p.weight_tap_major = weights;
    t.p.conv_state = tm_in, t.p.weight = tm_w;
    CHECK_OK(conv_forward(&t.p, &ex, y_tm, st_tm));
    tu_tap_layout(back, st_tm, n, D, L, states, true);
    CHECK(tu_same_bits(y, y_tm, c.n_y) && tu_same_bits(back, st, c.n_state),
          "%s %s tap-major (states %d, weight %d) forward differs from the default layouts'",
          ls_isa_name(test_isa), label, states, weights);
    ls_conv1d_reference(&t.p, y, st);
    CHECK(tu_rel_err(y_tm, y, c.n_y) <= 1e-6 && tu_same_bits(st_tm, st, c.n_state),
          "%s %s tap-major (states %d, weight %d) forward vs the reference", ls_isa_name(test_isa),
          label, states, weights);

    conv_bwd b, bt;
    conv_bwd_make(&b, &c, true, seed + 1);
    conv_bwd_make(&bt, &t, true, seed + 1);
    tu_tap_layout(bt.d_state_out, b.d_state_out, n, D, L, states, false);
    conv_run_backward(&c, &b, &ex);
    conv_run_backward(&t, &bt, &ex);
    for (int k = 0; k < N_CONV_GRADS; k++) {
        const float *got = bt.g[k];
        if (k == CG_DSTATE) tu_tap_layout(back, got, n, D, L, states, true), got = back;
        if (k == CG_DW) tu_tap_layout(back, got, 1, D, W, weights, true), got = back;
        CHECK(tu_same_bits(got, b.g[k], b.n[k]),
              "%s %s tap-major (states %d, weight %d) backward: %s differs from the default "
              "layouts'",
              ls_isa_name(test_isa), label, states, weights, conv_grad_names[k]);
    }
    conv_run_reference_backward(&t, &bt);
    for (int k = 0; k < N_CONV_GRADS; k++)
        CHECK(tu_rel_err_d(bt.g[k], bt.ref[k], bt.n[k]) <= CONV_BWD_TOL,
              "%s %s tap-major (states %d, weight %d) backward: %s vs the reference",
              ls_isa_name(test_isa), label, states, weights, conv_grad_names[k]);
    conv_bwd_free(&b), conv_bwd_free(&bt);
    free(y), free(st), free(y_tm), free(st_tm), free(tm_in), free(tm_w), free(back);
    conv_free(&c);
}

static void test_tap_major_layouts(void)
{
    conv_case cases[N_VARIANT_CASES];
    variant_cases(cases, 3, 40, 2);
    for (int layouts = 1; layouts < 4; layouts++) {
        const bool states = layouts & 1, weights = layouts & 2;
        for (int i = 0; i < N_VARIANT_CASES; i++)
            check_tap_major(&cases[i].spec, 6000 + 10 * (uint64_t)i, cases[i].label, states,
                            weights);
    }
}

/* A bfloat16 x and y (exec->dtype = LINSEQ_DTYPE_BF16): y the float32 call's on the widened
 * x, rounded once to nearest even, and the state the same floats; 1 and 3 threads, ragged
 * spans, packed sequences, tap-major layouts. */
static void check_bf16_forward(const conv_spec *sp, uint64_t seed, const char *label,
                               bool tap_major)
{
    conv_data c;
    conv_make(&c, sp, seed);
    c.p.state_tap_major = c.p.weight_tap_major = tap_major;
    uint16_t *x16 = malloc(c.n_y * sizeof *x16), *y16 = malloc(c.n_y * sizeof *y16);
    if (!x16 || !y16) exit(2);
    for (size_t i = 0; i < c.n_y; i++) {
        x16[i] = ls_f32_to_bf16(c.x[i]);
        c.x[i] = ls_bf16_to_f32(x16[i]);
    }
    float *y = tu_alloc(c.n_y), *st = tu_alloc(c.n_state), *st16 = tu_alloc_poisoned(c.n_state);
    CHECK_OK(conv_forward(&c.p, NULL, y, st));
    linseq_conv1d_problem q = c.p;
    q.x = (const float *)(const void *)x16;
    for (int threads = 1; threads <= 3; threads += 2) {
        const linseq_exec ex = {.threads = threads, .dtype = LINSEQ_DTYPE_BF16};
        memset(y16, 0xff, c.n_y * sizeof *y16);
        CHECK_OK(conv_forward(&q, &ex, (float *)(void *)y16, st16));
        bool same = tu_same_bits(st16, st, c.n_state);
        for (size_t i = 0; i < c.n_y; i++) same &= y16[i] == ls_f32_to_bf16(y[i]);
        CHECK(same,
              "%s %s bf16 forward (%d threads, tap-major %d): not the float32 call's "
              "rounded",
              ls_isa_name(test_isa), label, threads, tap_major);
    }
    free(x16), free(y16), free(y), free(st), free(st16);
    conv_free(&c);
}

static void test_bf16_forward(void)
{
    conv_case cases[N_VARIANT_CASES];
    variant_cases(cases, 2, 150, 3);
    for (int tm = 0; tm < 2; tm++)
        for (int i = 0; i < N_VARIANT_CASES; i++)
            check_bf16_forward(&cases[i].spec, 7000 + 10 * (uint64_t)i, cases[i].label, tm);
    /* a bf16 x is dense token-major: channel_first and strides are refused, nothing written */
    conv_data c;
    conv_make(&c, &cases[0].spec, 7030);
    float *y = tu_alloc(c.n_y);
    memset(y, 0x5a, c.n_y * sizeof *y);
    const linseq_exec ex = {.dtype = LINSEQ_DTYPE_BF16};
    linseq_conv1d_problem q = c.p;
    q.channel_first = true;
    CHECK_FAILS(conv_forward(&q, &ex, y, NULL), LINSEQ_ERR_UNSUPPORTED, "channel_first");
    q.channel_first = false, q.x_strides = (linseq_strides){150 * 300, 300, 1, 0};
    CHECK_FAILS(conv_forward(&q, &ex, y, NULL), LINSEQ_ERR_UNSUPPORTED, "x_strides");
    bool untouched = true;
    for (size_t i = 0; i < c.n_y; i++) untouched &= ((const uint8_t *)(void *)y)[4 * i] == 0x5a;
    CHECK(untouched, "a refused bf16 forward wrote y");
    free(y);
    conv_free(&c);
}

/* The public entry points run the active ISA's kernels: the same bits as the _isa entry points
 * given ls_isa_active(). */
static void test_public_entry_points(void)
{
    conv_spec sp = {
        .B = 2, .T = 30, .D = 70, .W = 4, .bias = true, .state = true, .act = LINSEQ_ACT_SILU};
    conv_data c;
    conv_make(&c, &sp, 5000);
    const ls_isa active = ls_isa_active();
    float *y = tu_alloc(c.n_y), *st = tu_alloc(c.n_state);
    float *y_isa = tu_alloc_poisoned(c.n_y), *st_isa = tu_alloc_poisoned(c.n_state);
    CHECK_OK(linseq_conv1d_forward(&c.p, NULL, y, st));
    CHECK_OK(ls_conv1d_forward_isa(&c.p, NULL, y_isa, st_isa, active));
    CHECK(tu_same_bits(y, y_isa, c.n_y) && tu_same_bits(st, st_isa, c.n_state),
          "linseq_conv1d_forward differs from the %s kernels", ls_isa_name(active));
    conv_bwd pub, isa;
    conv_bwd_make(&pub, &c, true, 5010);
    conv_bwd_make(&isa, &c, true, 5010);
    const linseq_conv1d_grads g_pub = conv_grads_of(pub.g), g_isa = conv_grads_of(isa.g);
    CHECK_OK(linseq_conv1d_backward(&c.p, NULL, pub.d_y, pub.d_state_out, &g_pub));
    CHECK_OK(ls_conv1d_backward_isa(&c.p, NULL, isa.d_y, isa.d_state_out, &g_isa, active));
    for (int k = 0; k < N_CONV_GRADS; k++)
        CHECK(tu_same_bits(pub.g[k], isa.g[k], pub.n[k]),
              "linseq_conv1d_backward: %s differs from the %s kernels", conv_grad_names[k],
              ls_isa_name(active));
    conv_bwd_free(&pub);
    conv_bwd_free(&isa);
    free(y);
    free(st);
    free(y_isa);
    free(st_isa);
    conv_free(&c);
}

int main(void)
{
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) {
            printf("conv1d %s: not available on this CPU, skipped\n", ls_isa_name((ls_isa)isa));
            continue;
        }
        test_isa = (ls_isa)isa;
        const tu_mark mark = tu_mark_now();
        test_vector_activations();
        test_hand_example();
        test_against_reference();
        test_activations();
        test_chaining();
        test_varlen();
        test_threads();
        test_width_one();
        test_backward_against_reference();
        test_backward_finite_differences();
        test_backward_activation_outside();
        test_backward_varlen();
        test_backward_chained();
        test_backward_threads();
        test_backward_width_one();
        test_backward_large_inputs();
        test_tap_major_layouts();
        test_bf16_forward();
        tu_mark tally = {0, 0};
        tu_tally_add(&tally, mark);
        char label[64];
        snprintf(label, sizeof label, "conv1d forward+backward %s", ls_isa_name(test_isa));
        tu_report(label, tally, "vs the double reference and its finite differences");
    }
    test_public_entry_points();
    test_backward_optional_inputs();
    return tu_finish("test_conv1d");
}
