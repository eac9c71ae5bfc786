/* Causal depthwise conv1d forward: the fast path against the double reference and a
 * hand-worked example, state chaining and in-place decode, varlen, activations, thread count,
 * W == 1, and the table of invalid arguments. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/activation.h"
#include "ssm/ssm_internal.h"
#include "testutil.h"

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
        .B = sp->B, .T = sp->T, .D = sp->D, .W = sp->W,
        .cu_seqlens = sp->cu_seqlens, .n_seqs = sp->n_seqs,
        .x = c->x, .weight = c->weight, .bias = c->bias, .conv_state = c->state,
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
    linseq_conv1d_problem p = {.B = 1, .T = 3, .D = 1, .W = 3, .x = x, .weight = weight,
                               .bias = bias, .conv_state = state};
    float y[3], state_out[2], y_ref[3], state_ref[2];
    CHECK_OK(linseq_conv1d_forward(&p, NULL, y, state_out));
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
    CHECK_OK(linseq_conv1d_forward(&p, NULL, y, state_out));
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
    CHECK_OK(linseq_conv1d_forward(&c.p, NULL, y, state_out));
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
                conv_spec sp = {.B = 2, .T = lengths[ti], .D = channels[di], .W = widths[wi],
                                .bias = variant % 2 == 0, .state = variant % 3 != 0,
                                .act = (linseq_activation)(variant % 6)};
                snprintf(label, sizeof label, "W=%lld T=%lld D=%lld bias=%d state=%d act=%d",
                         (long long)sp.W, (long long)sp.T, (long long)sp.D, sp.bias, sp.state,
                         (int)sp.act);
                check_against_reference(&sp, 1000 + (uint64_t)variant, label);
            }
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
    CHECK_OK(linseq_conv1d_forward(&p, NULL, y_lin, NULL));
    for (int act = LINSEQ_ACT_DEFAULT; act <= LINSEQ_ACT_RELU; act++) {
        p.activation = (linseq_activation)act;
        CHECK_OK(linseq_conv1d_forward(&p, NULL, y, NULL));
        const linseq_activation resolved =
            act == LINSEQ_ACT_DEFAULT ? LINSEQ_ACT_IDENTITY : (linseq_activation)act;
        size_t bad = 0;
        for (size_t i = 0; i < c.n_y; i++) {
            float expect = ls_activate(resolved, y_lin[i]);
            if (memcmp(&expect, &y[i], sizeof expect) != 0) bad++;
        }
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
    conv_spec sp = {.B = 2, .T = T, .D = 67, .W = W, .bias = true, .state = initial_state,
                    .act = LINSEQ_ACT_SILU};
    conv_data c;
    conv_make(&c, &sp, 1200 + (uint64_t)W);
    float *y_full = tu_alloc(c.n_y), *state_full = tu_alloc(c.n_state);
    CHECK_OK(linseq_conv1d_forward(&c.p, NULL, y_full, state_full));

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
        CHECK_OK(linseq_conv1d_forward(&p, NULL, y_piece, out));
        if (out == next) memcpy(state, next, c.n_state * sizeof(float));
        tu_place_tokens(y_piece, sp.B, T, sp.D, t0, len, y_pieces);
        t0 += len;
    }
    CHECK(tu_same_bits(y_full, y_pieces, c.n_y), "%s: y of the pieces differs from one call", label);
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
}

/* Varlen == one call per sequence (bitwise); an empty sequence passes its state row through,
 * or zeros. */
static void test_varlen(void)
{
    static const int64_t cu[] = {0, 2, 2, 30, 31, 45};
    const int64_t n_seqs = 5, D = 70, W = 4;
    for (int with_state = 0; with_state <= 1; with_state++) {
        conv_spec sp = {.B = 1, .T = 45, .D = D, .W = W, .bias = true, .state = with_state,
                        .act = LINSEQ_ACT_SILU, .cu_seqlens = cu, .n_seqs = n_seqs};
        conv_data c;
        conv_make(&c, &sp, 1300 + (uint64_t)with_state);
        float *y = tu_alloc_poisoned(c.n_y), *state_out = tu_alloc_poisoned(c.n_state);
        CHECK_OK(linseq_conv1d_forward(&c.p, NULL, y, state_out));
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
            CHECK_OK(linseq_conv1d_forward(&p, NULL, y_one, state_one));
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
    const conv_spec specs[] = {
        {.B = 3, .T = 40, .D = 200, .W = 4, .bias = true, .state = true, .act = LINSEQ_ACT_SILU},
        {.B = 1, .T = 90, .D = 150, .W = 3, .state = true, .cu_seqlens = cu, .n_seqs = 3},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        conv_data c;
        conv_make(&c, &specs[i], 1400 + i);
        float *y1 = tu_alloc(c.n_y), *s1 = tu_alloc(c.n_state);
        float *y = tu_alloc_poisoned(c.n_y), *s = tu_alloc_poisoned(c.n_state);
        linseq_exec one = {.threads = 1};
        CHECK_OK(linseq_conv1d_forward(&c.p, &one, y1, s1));
        for (int threads = 2; threads <= 3; threads++) {
            linseq_exec ex = {.threads = threads};
            CHECK_OK(linseq_conv1d_forward(&c.p, &ex, y, s));
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
    CHECK_OK(linseq_conv1d_forward(&p, NULL, y, untouched));
    CHECK(tu_is_poisoned(untouched, 16 * sizeof(float)), "W = 1: a state buffer was touched");
    ls_conv1d_reference(&c.p, y_ref, NULL);
    CHECK(tu_rel_err(y, y_ref, c.n_y) <= 1e-6, "W = 1: y differs from the reference");
    /* Even the output itself or an input as the (empty) state output is accepted. */
    CHECK_OK(linseq_conv1d_forward(&c.p, NULL, y, y));
    CHECK_OK(linseq_conv1d_forward(&c.p, NULL, y, c.x));
    free(y);
    free(y_ref);
    free(untouched);
    conv_free(&c);
}

/* ------------------------------------------------------------------------------------ */
/* Invalid arguments: each case breaks one thing in an otherwise valid problem.           */

enum { ERR_B = 2, ERR_T = 5, ERR_D = 8, ERR_W = 4, ERR_SEQS = 2 };

typedef struct err_bufs {
    float x[ERR_B * ERR_T * ERR_D], weight[ERR_D * ERR_W], bias[ERR_D];
    float state[ERR_B * ERR_D * (ERR_W - 1)];
    float spare[4]; /* room for a state_out shifted one element past state, overlapping nothing */
    float y[ERR_B * ERR_T * ERR_D], state_out[ERR_B * ERR_D * (ERR_W - 1)];
    int64_t cu[ERR_SEQS + 1];
} err_bufs;

typedef struct err_case {
    const char *what;
    linseq_status expect;
    const char *needle; /* must appear in linseq_last_error() */
} err_case;

static const err_case conv_errors[] = {
    {"problem NULL", LINSEQ_ERR_NULL_POINTER, "problem"},
    {"x NULL", LINSEQ_ERR_NULL_POINTER, "'x'"},
    {"weight NULL", LINSEQ_ERR_NULL_POINTER, "'weight'"},
    {"y NULL", LINSEQ_ERR_NULL_POINTER, "'y'"},
    {"B = 0", LINSEQ_ERR_INVALID_SIZE, "B = 0"},
    {"T = -1", LINSEQ_ERR_INVALID_SIZE, "T = -1"},
    {"D = 0", LINSEQ_ERR_INVALID_SIZE, "D = 0"},
    {"W = 0", LINSEQ_ERR_INVALID_SIZE, "W = 0"},
    {"cu_seqlens[0] != 0", LINSEQ_ERR_INVALID_CU_SEQLENS, "cu_seqlens[0]"},
    {"cu_seqlens decreasing", LINSEQ_ERR_INVALID_CU_SEQLENS, "cu_seqlens decreases"},
    {"cu_seqlens not ending at T", LINSEQ_ERR_INVALID_CU_SEQLENS, "expected T"},
    {"cu_seqlens with B = 2", LINSEQ_ERR_SHAPE_MISMATCH, "B must be 1"},
    {"cu_seqlens with n_seqs = -1", LINSEQ_ERR_INVALID_SIZE, "n_seqs"},
    {"activation = 6", LINSEQ_ERR_INVALID_ENUM, "activation"},
    {"exec->threads = -1", LINSEQ_ERR_INVALID_VALUE, "threads"},
    {"y == x", LINSEQ_ERR_ALIASING, "'y' overlaps input 'x'"},
    {"y overlaps weight", LINSEQ_ERR_ALIASING, "'weight'"},
    {"state_out overlaps state without being it", LINSEQ_ERR_ALIASING,
     "'conv_state_out' overlaps input 'conv_state'"},
    {"state_out == y", LINSEQ_ERR_ALIASING, "'conv_state_out'"},
    {"x byte size overflows", LINSEQ_ERR_SIZE_OVERFLOW, "'x'"},
    {"weight byte size overflows", LINSEQ_ERR_SIZE_OVERFLOW, "'weight'"},
    {"W = 2: state_out overlaps state", LINSEQ_ERR_ALIASING, "'conv_state'"},
};

static void break_conv(size_t i, linseq_conv1d_problem *p, linseq_exec *exec, float **y,
                       float **state_out, err_bufs *b)
{
    switch (i) {
    case 1: p->x = NULL; break;
    case 2: p->weight = NULL; break;
    case 3: *y = NULL; break;
    case 4: p->B = 0; break;
    case 5: p->T = -1; break;
    case 6: p->D = 0; break;
    case 7: p->W = 0; break;
    case 8: case 9: case 10: case 11: case 12: {
        /* a valid varlen layout of the same tokens: B = 1, T = 10 */
        p->B = 1, p->T = 10, p->n_seqs = ERR_SEQS, p->cu_seqlens = b->cu;
        b->cu[0] = 0, b->cu[1] = 4, b->cu[2] = 10;
        if (i == 8) b->cu[0] = -1;
        if (i == 9) b->cu[1] = 11;
        if (i == 10) b->cu[2] = 11;
        if (i == 11) p->B = 2, p->T = 5, b->cu[2] = 5;
        if (i == 12) p->n_seqs = -1;
        break;
    }
    case 13: p->activation = (linseq_activation)6; break;
    case 14: exec->threads = -1; break;
    case 15: *y = b->x; break;
    case 16: *y = b->weight + 1; break;
    case 17: *state_out = b->state + 1; break;
    case 18: *state_out = *y; break;
    case 19: p->T = (int64_t)1 << 40, p->D = (int64_t)1 << 30; break;
    case 20: p->W = (int64_t)1 << 62; break;
    case 21: p->W = 2, *state_out = b->state + 1; break;
    default: break;
    }
}

static void test_errors(void)
{
    for (size_t i = 0; i < sizeof conv_errors / sizeof conv_errors[0]; i++) {
        err_bufs *b = calloc(1, sizeof *b);
        if (!b) exit(2);
        tu_rng rng = {1600 + i};
        tu_fill_normal(&rng, (float *)b, offsetof(err_bufs, cu) / sizeof(float), 1.0);
        linseq_conv1d_problem p = {
            .B = ERR_B, .T = ERR_T, .D = ERR_D, .W = ERR_W, .x = b->x, .weight = b->weight,
            .bias = b->bias, .conv_state = b->state, .activation = LINSEQ_ACT_SILU,
        };
        linseq_exec exec = {0};
        float *y = b->y, *state_out = b->state_out;
        break_conv(i, &p, &exec, &y, &state_out, b);
        tu_poison(b->y, sizeof b->y);
        tu_poison(b->state_out, sizeof b->state_out);
        tu_poison(b->spare, sizeof b->spare);
        err_bufs before;
        memcpy(&before, b, sizeof before);

        linseq_status st = linseq_conv1d_forward(i == 0 ? NULL : &p, &exec, y, state_out);
        const char *msg = linseq_last_error();
        CHECK(st == conv_errors[i].expect, "conv error '%s': got %s, expected %s (%s)",
              conv_errors[i].what, linseq_status_string(st),
              linseq_status_string(conv_errors[i].expect), msg);
        CHECK(strstr(msg, conv_errors[i].needle) != NULL,
              "conv error '%s': message \"%s\" does not name \"%s\"", conv_errors[i].what, msg,
              conv_errors[i].needle);
        CHECK(tu_is_poisoned(b->y, sizeof b->y) &&
                  tu_is_poisoned(b->state_out, sizeof b->state_out) &&
                  tu_is_poisoned(b->spare, sizeof b->spare),
              "conv error '%s': an output was written", conv_errors[i].what);
        CHECK(memcmp(&before, b, sizeof before) == 0, "conv error '%s': a buffer was written",
              conv_errors[i].what);
        free(b);
    }
}

int main(void)
{
    test_hand_example();
    test_against_reference();
    test_activations();
    test_chaining();
    test_varlen();
    test_threads();
    test_width_one();
    test_errors();
    return tu_finish("test_conv1d");
}
