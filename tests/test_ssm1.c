/* SSM1 forward: the fast scan against the double reference and a hand-worked example, the
 * properties that tie the options together (softplus, gate, groups, varlen, chaining, thread
 * count), and the table of invalid arguments. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/activation.h"
#include "ssm/ssm_internal.h"
#include "testutil.h"

/* What a random problem holds. */
typedef struct ssm_spec {
    int64_t B, T, D, N, G;
    bool gate, skip, h0, softplus, bias;
    linseq_activation act;
    const int64_t *cu_seqlens; /* with B == 1 */
    int64_t n_seqs;
} ssm_spec;

typedef struct ssm_data {
    linseq_ssm1_problem p;
    float *x, *dt, *A, *B_proj, *C_proj, *D_skip, *gate, *h0, *dt_bias;
    size_t n_y, n_state, n_proj;
} ssm_data;

/* Inputs in the ranges of Mamba checkpoints: A in [-4,-0.1]; dt log-uniform in [1e-3, 0.5],
 * or with softplus a raw dt N(0,1) (2% of it in [19,25], across softplus's threshold 20) and
 * dt_bias in [-6,-2] (softplus of it: 2.5e-3 .. 0.13); x, B, C, gate, D_skip N(0,1); h0
 * N(0,0.5^2). */
static void ssm_make(ssm_data *s, const ssm_spec *sp, uint64_t seed)
{
    tu_rng rng = {seed};
    memset(s, 0, sizeof *s);
    const int64_t G = sp->G ? sp->G : 1;
    const int64_t n_seqs = sp->cu_seqlens ? sp->n_seqs : sp->B;
    s->n_y = (size_t)(sp->B * sp->T * sp->D);
    s->n_state = (size_t)(n_seqs * sp->D * sp->N);
    s->n_proj = (size_t)(sp->B * sp->T * G * sp->N);
    s->x = tu_alloc(s->n_y);
    s->dt = tu_alloc(s->n_y);
    s->A = tu_alloc((size_t)(sp->D * sp->N));
    s->B_proj = tu_alloc(s->n_proj);
    s->C_proj = tu_alloc(s->n_proj);
    tu_fill_normal(&rng, s->x, s->n_y, 1.0);
    tu_fill_uniform(&rng, s->A, (size_t)(sp->D * sp->N), -4.0, -0.1);
    tu_fill_normal(&rng, s->B_proj, s->n_proj, 1.0);
    tu_fill_normal(&rng, s->C_proj, s->n_proj, 1.0);
    for (size_t i = 0; i < s->n_y; i++) {
        if (sp->softplus)
            s->dt[i] = tu_uniform(&rng, 0.0, 1.0) < 0.02 ? (float)tu_uniform(&rng, 19.0, 25.0)
                                                         : (float)tu_normal(&rng);
        else
            s->dt[i] = (float)exp(tu_uniform(&rng, log(1e-3), log(0.5)));
    }
    if (sp->skip) {
        s->D_skip = tu_alloc((size_t)sp->D);
        tu_fill_normal(&rng, s->D_skip, (size_t)sp->D, 1.0);
    }
    if (sp->gate) {
        s->gate = tu_alloc(s->n_y);
        tu_fill_normal(&rng, s->gate, s->n_y, 1.0);
    }
    if (sp->h0) {
        s->h0 = tu_alloc(s->n_state);
        tu_fill_normal(&rng, s->h0, s->n_state, 0.5);
    }
    if (sp->bias) {
        s->dt_bias = tu_alloc((size_t)sp->D);
        tu_fill_uniform(&rng, s->dt_bias, (size_t)sp->D, -6.0, -2.0);
    }
    linseq_ssm1_problem p = {
        .B = sp->B, .T = sp->T, .D = sp->D, .N = sp->N, .G = sp->G,
        .cu_seqlens = sp->cu_seqlens, .n_seqs = sp->n_seqs,
        .x = s->x, .dt = s->dt, .A = s->A, .B_proj = s->B_proj, .C_proj = s->C_proj,
        .D_skip = s->D_skip, .gate = s->gate, .h0 = s->h0,
        .dt_softplus = sp->softplus, .dt_bias = s->dt_bias, .gate_activation = sp->act,
    };
    s->p = p;
}

static void ssm_free(ssm_data *s)
{
    free(s->x);
    free(s->dt);
    free(s->A);
    free(s->B_proj);
    free(s->C_proj);
    free(s->D_skip);
    free(s->gate);
    free(s->h0);
    free(s->dt_bias);
}

/* ------------------------------------------------------------------------------------ */

/* D = N = 1, two tokens, worked by hand from the header's formulas: checks where the skip
 * term and the gate enter, independently of the reference's code. */
static void test_hand_example(void)
{
    const float x[2] = {2.0f, -1.0f}, dt[2] = {0.5f, 0.25f}, A[1] = {-1.0f};
    const float B_proj[2] = {1.0f, 2.0f}, C_proj[2] = {3.0f, -1.0f}, D_skip[1] = {0.5f};
    const float gate[2] = {1.0f, -2.0f}, h0[1] = {1.0f};
    linseq_ssm1_problem p = {.B = 1, .T = 2, .D = 1, .N = 1, .x = x, .dt = dt, .A = A,
                             .B_proj = B_proj, .C_proj = C_proj, .D_skip = D_skip, .gate = gate,
                             .h0 = h0};
    double h1 = exp(-0.5) * 1.0 + 0.5 * 1.0 * 2.0;
    double h2 = exp(-0.25) * h1 + 0.25 * 2.0 * -1.0;
    double silu1 = 1.0 / (1.0 + exp(-1.0)), silu2 = -2.0 / (1.0 + exp(2.0));
    double y_expect[2] = {(3.0 * h1 + 0.5 * 2.0) * silu1, (-1.0 * h2 + 0.5 * -1.0) * silu2};
    float y[2], hT[1], y_ref[2], hT_ref[1];
    CHECK_OK(linseq_ssm1_forward(&p, NULL, y, hT));
    CHECK_OK(ls_ssm1_reference(&p, y_ref, hT_ref));
    for (int t = 0; t < 2; t++) {
        CHECK(fabs(y[t] - y_expect[t]) <= 1e-6 * fabs(y_expect[t]),
              "hand y[%d] = %.9g, expected %.9g", t, y[t], y_expect[t]);
        CHECK(fabs(y_ref[t] - y_expect[t]) <= 1e-7 * fabs(y_expect[t]),
              "hand reference y[%d] = %.9g, expected %.9g", t, y_ref[t], y_expect[t]);
    }
    CHECK(fabs(hT[0] - h2) <= 1e-6 * fabs(h2), "hand hT = %.9g, expected %.9g", hT[0], h2);
    CHECK(fabs(hT_ref[0] - h2) <= 1e-7 * fabs(h2), "hand reference hT = %.9g", hT_ref[0]);
}

/* Fast float32 scan against the double reference. The float32 error of y has two parts: the
 * N-term dot product (about N ulp of max|h C|) and the state, whose rounding errors decay at
 * the rate exp(A dt) and so stay within a few ulp of |h| over any T. Measured at most 4e-7 of
 * max|y| (and of max|hT|) over these shapes, T = 2000 included; 1e-5 (~170 ulp) leaves room
 * for other compilers and libm expf while still catching any wrong term: a missing skip, gate,
 * group or bias changes y by O(1), and even a 1e-4 relative slip in dt B x is caught. */
static void check_against_reference(const ssm_spec *sp, uint64_t seed, const char *label)
{
    ssm_data s;
    ssm_make(&s, sp, seed);
    float *y = tu_alloc_poisoned(s.n_y), *hT = tu_alloc_poisoned(s.n_state);
    float *y_ref = tu_alloc(s.n_y), *hT_ref = tu_alloc(s.n_state);
    CHECK_OK(linseq_ssm1_forward(&s.p, NULL, y, hT));
    CHECK_OK(ls_ssm1_reference(&s.p, y_ref, hT_ref));
    double ey = tu_rel_err(y, y_ref, s.n_y), eh = tu_rel_err(hT, hT_ref, s.n_state);
    CHECK(ey <= 1e-5, "%s: y rel err %.3g", label, ey);
    CHECK(eh <= 1e-5, "%s: hT rel err %.3g", label, eh);
    free(y);
    free(hT);
    free(y_ref);
    free(hT_ref);
    ssm_free(&s);
}

static void test_against_reference(void)
{
    static const ssm_spec specs[] = {
        {.B = 1, .T = 1, .D = 1, .N = 1},
        {.B = 2, .T = 1, .D = 64, .N = 16, .h0 = true, .skip = true},      /* decode step  */
        {.B = 2, .T = 33, .D = 67, .N = 5, .gate = true, .h0 = true},      /* tail block   */
        {.B = 1, .T = 300, .D = 130, .N = 16, .G = 2, .gate = true, .skip = true},
        {.B = 3, .T = 17, .D = 96, .N = 7, .G = 3, .h0 = true, .skip = true}, /* spans groups */
        {.B = 1, .T = 50, .D = 12, .N = 3, .G = 12, .gate = true},         /* G == D       */
        {.B = 2, .T = 9, .D = 200, .N = 16, .G = 4, .softplus = true, .bias = true, .h0 = true},
        {.B = 1, .T = 2000, .D = 72, .N = 16, .softplus = true, .bias = true, .gate = true,
         .skip = true, .h0 = true},                                          /* long T       */
        {.B = 1, .T = 40, .D = 5, .N = 33, .softplus = true},               /* dt_bias NULL */
    };
    char label[64];
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        snprintf(label, sizeof label, "spec %zu", i);
        check_against_reference(&specs[i], 100 + i, label);
    }
    for (int act = LINSEQ_ACT_DEFAULT; act <= LINSEQ_ACT_RELU; act++) {
        ssm_spec sp = {.B = 2, .T = 21, .D = 70, .N = 8, .G = 2, .gate = true, .skip = true,
                       .h0 = true, .act = (linseq_activation)act};
        snprintf(label, sizeof label, "gate activation %d", act);
        check_against_reference(&sp, 200 + (uint64_t)act, label);
    }
}

/* dt_softplus with dt_bias == the same problem given dt = softplus(dt + dt_bias). The same
 * float32 formula on both sides (softplus with threshold 20), so the results agree bitwise. */
static void test_softplus_outside(void)
{
    ssm_spec sp = {.B = 2, .T = 40, .D = 80, .N = 16, .softplus = true, .bias = true,
                   .gate = true, .skip = true, .h0 = true};
    ssm_data s;
    ssm_make(&s, &sp, 7);
    float *y_in = tu_alloc(s.n_y), *hT_in = tu_alloc(s.n_state);
    float *y_out = tu_alloc_poisoned(s.n_y), *hT_out = tu_alloc_poisoned(s.n_state);
    CHECK_OK(linseq_ssm1_forward(&s.p, NULL, y_in, hT_in));

    float *dt_applied = tu_alloc(s.n_y);
    for (size_t i = 0; i < s.n_y; i++) {
        float z = s.dt[i] + s.dt_bias[i % (size_t)sp.D];
        dt_applied[i] = z > 20.0f ? z : log1pf(expf(z));
    }
    linseq_ssm1_problem p = s.p;
    p.dt = dt_applied;
    p.dt_softplus = false;
    p.dt_bias = NULL;
    CHECK_OK(linseq_ssm1_forward(&p, NULL, y_out, hT_out));
    CHECK(tu_same_bits(y_in, y_out, s.n_y), "softplus in kernel: y differs from softplus outside");
    CHECK(tu_same_bits(hT_in, hT_out, s.n_state), "softplus in kernel: hT differs");
    free(dt_applied);
    free(y_in);
    free(hT_in);
    free(y_out);
    free(hT_out);
    ssm_free(&s);
}

/* For every activation: the gated y == act(gate) times the ungated y, and the gate leaves hT
 * alone. Bitwise: the kernel's last operation is that one multiplication. */
static void test_gate_outside(void)
{
    for (int act = LINSEQ_ACT_DEFAULT; act <= LINSEQ_ACT_RELU; act++) {
        ssm_spec sp = {.B = 1, .T = 25, .D = 100, .N = 16, .gate = true, .skip = true,
                       .h0 = true, .act = (linseq_activation)act};
        ssm_data s;
        ssm_make(&s, &sp, 300 + (uint64_t)act);
        float *y_gated = tu_alloc(s.n_y), *hT_gated = tu_alloc(s.n_state);
        float *y_plain = tu_alloc_poisoned(s.n_y), *hT_plain = tu_alloc_poisoned(s.n_state);
        CHECK_OK(linseq_ssm1_forward(&s.p, NULL, y_gated, hT_gated));
        linseq_ssm1_problem p = s.p;
        p.gate = NULL;
        CHECK_OK(linseq_ssm1_forward(&p, NULL, y_plain, hT_plain));
        const linseq_activation resolved =
            act == LINSEQ_ACT_DEFAULT ? LINSEQ_ACT_SILU : (linseq_activation)act;
        size_t bad = 0;
        for (size_t i = 0; i < s.n_y; i++) {
            float expect = y_plain[i] * ls_activate(resolved, s.gate[i]);
            if (memcmp(&expect, &y_gated[i], sizeof expect) != 0) bad++;
        }
        CHECK(bad == 0, "activation %d: %zu gated outputs differ from y * act(gate)", act, bad);
        CHECK(tu_same_bits(hT_gated, hT_plain, s.n_state), "activation %d: the gate changed hT", act);
        free(y_gated);
        free(hT_gated);
        free(y_plain);
        free(hT_plain);
        ssm_free(&s);
    }
}

/* G groups == the same problem with B_proj and C_proj expanded to one group per channel.
 * Bitwise: the same products in the same order, only read from different places. */
static void test_groups_expanded(void)
{
    static const int64_t groups[] = {1, 2, 3, 8};
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        ssm_spec sp = {.B = 2, .T = 15, .D = 96, .N = 5, .G = groups[gi], .gate = true,
                       .skip = true, .h0 = true, .softplus = true, .bias = true};
        ssm_data s;
        ssm_make(&s, &sp, 400 + gi);
        const int64_t G = sp.G, D = sp.D, N = sp.N, BT = sp.B * sp.T;
        float *B_wide = tu_alloc((size_t)(BT * D * N));
        float *C_wide = tu_alloc((size_t)(BT * D * N));
        for (int64_t bt = 0; bt < BT; bt++)
            for (int64_t d = 0; d < D; d++)
                for (int64_t n = 0; n < N; n++) {
                    int64_t g = d / (D / G);
                    B_wide[(bt * D + d) * N + n] = s.B_proj[(bt * G + g) * N + n];
                    C_wide[(bt * D + d) * N + n] = s.C_proj[(bt * G + g) * N + n];
                }
        float *y_g = tu_alloc(s.n_y), *hT_g = tu_alloc(s.n_state);
        float *y_w = tu_alloc_poisoned(s.n_y), *hT_w = tu_alloc_poisoned(s.n_state);
        CHECK_OK(linseq_ssm1_forward(&s.p, NULL, y_g, hT_g));
        linseq_ssm1_problem p = s.p;
        p.G = D;
        p.B_proj = B_wide;
        p.C_proj = C_wide;
        CHECK_OK(linseq_ssm1_forward(&p, NULL, y_w, hT_w));
        CHECK(tu_same_bits(y_g, y_w, s.n_y), "G = %lld: y differs from the expanded problem",
              (long long)G);
        CHECK(tu_same_bits(hT_g, hT_w, s.n_state), "G = %lld: hT differs", (long long)G);
        free(B_wide);
        free(C_wide);
        free(y_g);
        free(hT_g);
        free(y_w);
        free(hT_w);
        ssm_free(&s);
    }
}

/* Varlen == one call per sequence (outputs and states, bitwise); an empty sequence passes its
 * h0 row through, or zeros. */
static void test_varlen(void)
{
    static const int64_t cu[] = {0, 5, 5, 40, 41, 70};
    const int64_t n_seqs = 5, D = 70, N = 6, G = 2;
    for (int with_h0 = 0; with_h0 <= 1; with_h0++) {
        ssm_spec sp = {.B = 1, .T = 70, .D = D, .N = N, .G = G, .gate = true, .skip = true,
                       .h0 = with_h0, .softplus = true, .bias = true, .cu_seqlens = cu,
                       .n_seqs = n_seqs};
        ssm_data s;
        ssm_make(&s, &sp, 500 + (uint64_t)with_h0);
        float *y = tu_alloc_poisoned(s.n_y), *hT = tu_alloc_poisoned(s.n_state);
        CHECK_OK(linseq_ssm1_forward(&s.p, NULL, y, hT));

        const size_t row = (size_t)(D * N);
        for (int64_t n = 0; n < n_seqs; n++) {
            const int64_t t0 = cu[n], len = cu[n + 1] - cu[n];
            if (len == 0) {
                bool passed = true;
                for (size_t i = 0; i < row; i++)
                    passed &= hT[n * row + i] == (s.h0 ? s.h0[n * row + i] : 0.0f);
                CHECK(passed, "varlen: empty sequence %lld did not pass its state through",
                      (long long)n);
                continue;
            }
            linseq_ssm1_problem p = s.p;
            p.cu_seqlens = NULL;
            p.n_seqs = 0;
            p.T = len;
            p.x = s.x + t0 * D;
            p.dt = s.dt + t0 * D;
            p.gate = s.gate + t0 * D;
            p.B_proj = s.B_proj + t0 * G * N;
            p.C_proj = s.C_proj + t0 * G * N;
            p.h0 = s.h0 ? s.h0 + n * row : NULL;
            float *y_one = tu_alloc((size_t)(len * D)), *hT_one = tu_alloc(row);
            CHECK_OK(linseq_ssm1_forward(&p, NULL, y_one, hT_one));
            CHECK(tu_same_bits(y + t0 * D, y_one, (size_t)(len * D)),
                  "varlen: y of sequence %lld differs from its own call", (long long)n);
            CHECK(tu_same_bits(hT + n * row, hT_one, row),
                  "varlen: hT of sequence %lld differs from its own call", (long long)n);
            free(y_one);
            free(hT_one);
        }
        free(y);
        free(hT);
        ssm_free(&s);
    }
}

/* A prefill, then single-token decode steps updating the state in place (hT == h0) == one
 * call. Bitwise: the state is float32 in both, and each token does the same arithmetic. */
static void test_prefill_then_decode(void)
{
    const int64_t B = 2, T = 20, D = 130, N = 16, prefill = 12;
    ssm_spec sp = {.B = B, .T = T, .D = D, .N = N, .gate = true, .skip = true, .h0 = true,
                   .softplus = true, .bias = true};
    ssm_data s;
    ssm_make(&s, &sp, 600);
    float *y_full = tu_alloc(s.n_y), *hT_full = tu_alloc(s.n_state);
    CHECK_OK(linseq_ssm1_forward(&s.p, NULL, y_full, hT_full));

    const size_t piece_btd = (size_t)(B * prefill * D), piece_btn = (size_t)(B * prefill * N);
    float *x = tu_alloc(piece_btd), *dt = tu_alloc(piece_btd), *gate = tu_alloc(piece_btd);
    float *Bp = tu_alloc(piece_btn), *Cp = tu_alloc(piece_btn), *y = tu_alloc(piece_btd);
    float *state = tu_alloc_poisoned(s.n_state), *y_steps = tu_alloc_poisoned(s.n_y);
    for (int64_t t0 = 0, len = prefill; t0 < T; t0 += len, len = 1) {
        tu_slice_tokens(s.x, B, T, D, t0, len, x);
        tu_slice_tokens(s.dt, B, T, D, t0, len, dt);
        tu_slice_tokens(s.gate, B, T, D, t0, len, gate);
        tu_slice_tokens(s.B_proj, B, T, N, t0, len, Bp);
        tu_slice_tokens(s.C_proj, B, T, N, t0, len, Cp);
        linseq_ssm1_problem p = s.p;
        p.T = len;
        p.x = x;
        p.dt = dt;
        p.gate = gate;
        p.B_proj = Bp;
        p.C_proj = Cp;
        p.h0 = t0 == 0 ? s.h0 : state;
        CHECK_OK(linseq_ssm1_forward(&p, NULL, y, state));
        tu_place_tokens(y, B, T, D, t0, len, y_steps);
    }
    CHECK(tu_same_bits(y_full, y_steps, s.n_y), "prefill + in-place decode: y differs from one call");
    CHECK(tu_same_bits(hT_full, state, s.n_state),
          "prefill + in-place decode: the state differs from one call's hT");
    free(x);
    free(dt);
    free(gate);
    free(Bp);
    free(Cp);
    free(y);
    free(state);
    free(y_steps);
    free(y_full);
    free(hT_full);
    ssm_free(&s);
}

/* Thread counts 1, 2, 3 give bitwise identical results (several items per thread, varlen and
 * groups included). Also: hT == NULL does not change y. */
static void test_threads(void)
{
    static const int64_t cu[] = {0, 30, 31, 90};
    const ssm_spec specs[] = {
        {.B = 3, .T = 40, .D = 200, .N = 16, .G = 4, .gate = true, .skip = true, .h0 = true},
        {.B = 1, .T = 90, .D = 150, .N = 7, .G = 3, .softplus = true, .bias = true, .h0 = true,
         .cu_seqlens = cu, .n_seqs = 3},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        ssm_data s;
        ssm_make(&s, &specs[i], 700 + i);
        float *y1 = tu_alloc(s.n_y), *hT1 = tu_alloc(s.n_state);
        float *y = tu_alloc_poisoned(s.n_y), *hT = tu_alloc_poisoned(s.n_state);
        linseq_exec one = {.threads = 1};
        CHECK_OK(linseq_ssm1_forward(&s.p, &one, y1, hT1));
        for (int threads = 2; threads <= 3; threads++) {
            linseq_exec ex = {.threads = threads};
            CHECK_OK(linseq_ssm1_forward(&s.p, &ex, y, hT));
            CHECK(tu_same_bits(y1, y, s.n_y), "spec %zu: y with %d threads differs from 1 thread", i,
                  threads);
            CHECK(tu_same_bits(hT1, hT, s.n_state), "spec %zu: hT with %d threads differs", i,
                  threads);
        }
        CHECK_OK(linseq_ssm1_forward(&s.p, NULL, y, NULL));
        CHECK(tu_same_bits(y1, y, s.n_y), "spec %zu: y without hT differs", i);
        free(y1);
        free(hT1);
        free(y);
        free(hT);
        ssm_free(&s);
    }
}

/* ------------------------------------------------------------------------------------ */
/* Invalid arguments: each case breaks one thing in an otherwise valid problem.           */

enum { ERR_B = 2, ERR_T = 5, ERR_D = 8, ERR_N = 4, ERR_G = 2, ERR_SEQS = 2 };

typedef struct err_bufs {
    float x[ERR_B * ERR_T * ERR_D], dt[ERR_B * ERR_T * ERR_D], gate[ERR_B * ERR_T * ERR_D];
    float A[ERR_D * ERR_N], D_skip[ERR_D], dt_bias[ERR_D];
    float B_proj[ERR_B * ERR_T * ERR_G * ERR_N], C_proj[ERR_B * ERR_T * ERR_G * ERR_N];
    float h0[ERR_B * ERR_D * ERR_N];
    float spare[4]; /* room for an hT shifted one element past h0, overlapping nothing else */
    float y[ERR_B * ERR_T * ERR_D], hT[ERR_B * ERR_D * ERR_N];
    int64_t cu[ERR_SEQS + 1];
} err_bufs;

typedef struct err_case {
    const char *what;
    linseq_status expect;
    const char *needle; /* must appear in linseq_last_error() */
} err_case;

static const err_case ssm_errors[] = {
    {"problem NULL", LINSEQ_ERR_NULL_POINTER, "problem"},
    {"x NULL", LINSEQ_ERR_NULL_POINTER, "'x'"},
    {"dt NULL", LINSEQ_ERR_NULL_POINTER, "'dt'"},
    {"A NULL", LINSEQ_ERR_NULL_POINTER, "'A'"},
    {"B_proj NULL", LINSEQ_ERR_NULL_POINTER, "'B_proj'"},
    {"C_proj NULL", LINSEQ_ERR_NULL_POINTER, "'C_proj'"},
    {"y NULL", LINSEQ_ERR_NULL_POINTER, "'y'"},
    {"B = 0", LINSEQ_ERR_INVALID_SIZE, "B = 0"},
    {"T = 0", LINSEQ_ERR_INVALID_SIZE, "T = 0"},
    {"D = -3", LINSEQ_ERR_INVALID_SIZE, "D = -3"},
    {"N = 0", LINSEQ_ERR_INVALID_SIZE, "N = 0"},
    {"G = -1", LINSEQ_ERR_INVALID_SIZE, "G = -1"},
    {"G = 3 does not divide D = 8", LINSEQ_ERR_SHAPE_MISMATCH, "G = 3"},
    {"cu_seqlens[0] != 0", LINSEQ_ERR_INVALID_CU_SEQLENS, "cu_seqlens[0]"},
    {"cu_seqlens decreasing", LINSEQ_ERR_INVALID_CU_SEQLENS, "cu_seqlens decreases"},
    {"cu_seqlens not ending at T", LINSEQ_ERR_INVALID_CU_SEQLENS, "expected T"},
    {"cu_seqlens with B = 2", LINSEQ_ERR_SHAPE_MISMATCH, "B must be 1"},
    {"cu_seqlens with n_seqs = 0", LINSEQ_ERR_INVALID_SIZE, "n_seqs"},
    {"gate_activation = 99", LINSEQ_ERR_INVALID_ENUM, "gate_activation"},
    {"gate_activation = -1", LINSEQ_ERR_INVALID_ENUM, "gate_activation"},
    {"exec->threads = -2", LINSEQ_ERR_INVALID_VALUE, "threads"},
    {"dt_bias without dt_softplus", LINSEQ_ERR_INVALID_VALUE, "dt_bias"},
    {"y == x", LINSEQ_ERR_ALIASING, "'y' overlaps input 'x'"},
    {"y overlaps x partially", LINSEQ_ERR_ALIASING, "'y' overlaps input 'x'"},
    {"hT overlaps h0 without being it", LINSEQ_ERR_ALIASING, "'hT' overlaps input 'h0'"},
    {"hT overlaps A", LINSEQ_ERR_ALIASING, "'A'"},
    {"hT == y", LINSEQ_ERR_ALIASING, "'hT'"},
    {"x byte size overflows", LINSEQ_ERR_SIZE_OVERFLOW, "'x'"},
    {"A byte size overflows", LINSEQ_ERR_SIZE_OVERFLOW, "'A'"},
};

/* Applies case i to a valid problem; y and hT are the outputs the call will get. */
static void break_ssm(size_t i, linseq_ssm1_problem *p, linseq_exec *exec, float **y, float **hT,
                      err_bufs *b)
{
    switch (i) {
    case 1: p->x = NULL; break;
    case 2: p->dt = NULL; break;
    case 3: p->A = NULL; break;
    case 4: p->B_proj = NULL; break;
    case 5: p->C_proj = NULL; break;
    case 6: *y = NULL; break;
    case 7: p->B = 0; break;
    case 8: p->T = 0; break;
    case 9: p->D = -3; break;
    case 10: p->N = 0; break;
    case 11: p->G = -1; break;
    case 12: p->G = 3; break;
    case 13: case 14: case 15: case 16: case 17: {
        /* a valid varlen layout of the same tokens: B = 1, T = 10 */
        p->B = 1, p->T = 10, p->n_seqs = ERR_SEQS, p->cu_seqlens = b->cu;
        b->cu[0] = 0, b->cu[1] = 4, b->cu[2] = 10;
        if (i == 13) b->cu[0] = 1;
        if (i == 14) b->cu[1] = 11;
        if (i == 15) b->cu[2] = 9;
        if (i == 16) p->B = 2, p->T = 5, b->cu[2] = 5;
        if (i == 17) p->n_seqs = 0;
        break;
    }
    case 18: p->gate_activation = (linseq_activation)99; break;
    case 19: p->gate_activation = (linseq_activation)-1; break;
    case 20: exec->threads = -2; break;
    case 21: p->dt_softplus = false; break;
    case 22: *y = b->x; break;
    case 23: *y = b->x + 3; break;
    case 24: *hT = b->h0 + 1; break;
    case 25: *hT = b->A; break;
    case 26: *hT = *y; break;
    case 27: p->D = (int64_t)1 << 40, p->T = (int64_t)1 << 30, p->G = 1; break;
    case 28: p->N = (int64_t)1 << 62; break;
    default: break;
    }
}

static void test_errors(void)
{
    for (size_t i = 0; i < sizeof ssm_errors / sizeof ssm_errors[0]; i++) {
        err_bufs *b = calloc(1, sizeof *b);
        if (!b) exit(2);
        tu_rng rng = {900 + i};
        tu_fill_normal(&rng, (float *)b, offsetof(err_bufs, cu) / sizeof(float), 1.0);
        for (size_t k = 0; k < ERR_D * ERR_N; k++) b->A[k] = -fabsf(b->A[k]);
        linseq_ssm1_problem p = {
            .B = ERR_B, .T = ERR_T, .D = ERR_D, .N = ERR_N, .G = ERR_G,
            .x = b->x, .dt = b->dt, .A = b->A, .B_proj = b->B_proj, .C_proj = b->C_proj,
            .D_skip = b->D_skip, .gate = b->gate, .h0 = b->h0, .dt_bias = b->dt_bias,
            .dt_softplus = true,
        };
        linseq_exec exec = {0};
        float *y = b->y, *hT = b->hT;
        break_ssm(i, &p, &exec, &y, &hT, b);
        tu_poison(b->y, sizeof b->y);
        tu_poison(b->hT, sizeof b->hT);
        tu_poison(b->spare, sizeof b->spare);
        err_bufs before;
        memcpy(&before, b, sizeof before);

        linseq_status st = linseq_ssm1_forward(i == 0 ? NULL : &p, &exec, y, hT);
        const char *msg = linseq_last_error();
        CHECK(st == ssm_errors[i].expect, "ssm1 error '%s': got %s, expected %s (%s)",
              ssm_errors[i].what, linseq_status_string(st),
              linseq_status_string(ssm_errors[i].expect),
              msg);
        CHECK(strstr(msg, ssm_errors[i].needle) != NULL,
              "ssm1 error '%s': message \"%s\" does not name \"%s\"", ssm_errors[i].what, msg,
              ssm_errors[i].needle);
        CHECK(tu_is_poisoned(b->y, sizeof b->y) && tu_is_poisoned(b->hT, sizeof b->hT) &&
                  tu_is_poisoned(b->spare, sizeof b->spare),
              "ssm1 error '%s': an output was written", ssm_errors[i].what);
        CHECK(memcmp(&before, b, sizeof before) == 0, "ssm1 error '%s': a buffer was written",
              ssm_errors[i].what);
        free(b);
    }

    /* A success clears the message of an earlier failure. */
    CHECK(linseq_ssm1_forward(NULL, NULL, NULL, NULL) == LINSEQ_ERR_NULL_POINTER, "NULL problem");
    float x = 1.0f, dt = 0.1f, A = -1.0f, Bv = 1.0f, Cv = 1.0f, y = 0.0f;
    linseq_ssm1_problem p = {.B = 1, .T = 1, .D = 1, .N = 1, .x = &x, .dt = &dt, .A = &A,
                             .B_proj = &Bv, .C_proj = &Cv};
    CHECK_OK(linseq_ssm1_forward(&p, NULL, &y, NULL));
    CHECK(linseq_last_error()[0] == '\0', "a success left the message \"%s\"", linseq_last_error());
}

int main(void)
{
    test_hand_example();
    test_against_reference();
    test_softplus_outside();
    test_gate_outside();
    test_groups_expanded();
    test_varlen();
    test_prefill_then_decode();
    test_threads();
    test_errors();
    return tu_finish("test_ssm1");
}
