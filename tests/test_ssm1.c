/* SSM1 forward: the fast scan against the double reference and a hand-worked example, the
 * properties that tie the options together (softplus, gate, groups, varlen, chaining, thread
 * count), and the table of invalid arguments.
 * SSM1 backward: the fast backward against the double reference backward, both against finite
 * differences of the double forward, the same properties for the gradients, extreme steps, and
 * its own table of invalid arguments.
 * The numeric and property tests run once per ISA the CPU has (scalar, avx2, avx512), each
 * through ls_ssm1_forward_isa / _backward_isa, the entry points with the kernels' ISA as an
 * argument; the tables of invalid arguments go through the public entry points. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/activation.h"
#include "simd/isa.h"
#include "ssm/ssm_internal.h"
#include "ssm/ssm_kernels.h"
#include "testutil.h"

/* The ISA whose kernels the numeric tests run; main sets it to each one the CPU has. */
static ls_isa test_isa = LS_ISA_SCALAR;

static linseq_status ssm_forward(const linseq_ssm1_problem *p, const linseq_exec *exec, float *y,
                                 float *hT)
{
    return ls_ssm1_forward_isa(p, exec, y, hT, test_isa);
}

static linseq_status ssm_backward(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                  const float *d_y, const float *d_hT,
                                  const linseq_ssm1_grads *grads)
{
    return ls_ssm1_backward_isa(p, exec, d_y, d_hT, grads, test_isa);
}

/* fn (act resolved) over n floats in the vector form the kernels of test_isa compute: an
 * in-kernel option is compared bitwise with the same math applied outside through this. */
static void kernel_math(ls_ssm_vfn fn, linseq_activation act, size_t n, const float *x, float *y)
{
    ls_ssm_kernels(test_isa)->vmath_n(fn, act, (int64_t)n, x, y);
}

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
        .B = sp->B,
        .T = sp->T,
        .D = sp->D,
        .N = sp->N,
        .G = sp->G,
        .cu_seqlens = sp->cu_seqlens,
        .n_seqs = sp->n_seqs,
        .x = s->x,
        .dt = s->dt,
        .A = s->A,
        .B_proj = s->B_proj,
        .C_proj = s->C_proj,
        .D_skip = s->D_skip,
        .gate = s->gate,
        .h0 = s->h0,
        .dt_softplus = sp->softplus,
        .dt_bias = s->dt_bias,
        .gate_activation = sp->act,
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
    linseq_ssm1_problem p = {.B = 1,
                             .T = 2,
                             .D = 1,
                             .N = 1,
                             .x = x,
                             .dt = dt,
                             .A = A,
                             .B_proj = B_proj,
                             .C_proj = C_proj,
                             .D_skip = D_skip,
                             .gate = gate,
                             .h0 = h0};
    double h1 = exp(-0.5) * 1.0 + 0.5 * 1.0 * 2.0;
    double h2 = exp(-0.25) * h1 + 0.25 * 2.0 * -1.0;
    double silu1 = 1.0 / (1.0 + exp(-1.0)), silu2 = -2.0 / (1.0 + exp(2.0));
    double y_expect[2] = {(3.0 * h1 + 0.5 * 2.0) * silu1, (-1.0 * h2 + 0.5 * -1.0) * silu2};
    float y[2], hT[1], y_ref[2], hT_ref[1];
    CHECK_OK(ssm_forward(&p, NULL, y, hT));
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
    CHECK_OK(ssm_forward(&s.p, NULL, y, hT));
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
    /* one spec a line reads as a table (clang-format would put one field a line) */
    /* clang-format off */
    static const ssm_spec specs[] = {
        {.B = 1, .T = 1, .D = 1, .N = 1},
        {.B = 2, .T = 1, .D = 64, .N = 16, .h0 = true, .skip = true},      /* decode step */
        {.B = 2, .T = 1, .D = 100, .N = 33, .G = 4, .gate = true, .softplus = true,
         .bias = true},                            /* decode: ragged rows, groups, no h0 */
        {.B = 2, .T = 33, .D = 67, .N = 5, .gate = true, .h0 = true},      /* tail block */
        {.B = 1, .T = 300, .D = 130, .N = 16, .G = 2, .gate = true, .skip = true},
        {.B = 3, .T = 17, .D = 96, .N = 7, .G = 3, .h0 = true, .skip = true}, /* spans groups */
        {.B = 1, .T = 50, .D = 12, .N = 3, .G = 12, .gate = true},         /* G == D */
        {.B = 2, .T = 9, .D = 200, .N = 16, .G = 4, .softplus = true, .bias = true, .h0 = true},
        {.B = 1, .T = 2000, .D = 72, .N = 16, .softplus = true, .bias = true, .gate = true,
         .skip = true, .h0 = true},                                          /* long T */
        {.B = 1, .T = 40, .D = 5, .N = 33, .softplus = true},               /* dt_bias NULL */
    };
    /* clang-format on */
    char label[64];
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        snprintf(label, sizeof label, "spec %zu", i);
        check_against_reference(&specs[i], 100 + i, label);
    }
    for (int act = LINSEQ_ACT_DEFAULT; act <= LINSEQ_ACT_RELU; act++) {
        ssm_spec sp = {.B = 2,
                       .T = 21,
                       .D = 70,
                       .N = 8,
                       .G = 2,
                       .gate = true,
                       .skip = true,
                       .h0 = true,
                       .act = (linseq_activation)act};
        snprintf(label, sizeof label, "gate activation %d", act);
        check_against_reference(&sp, 200 + (uint64_t)act, label);
    }
}

/* dt_softplus with dt_bias == the same problem given dt = softplus(dt + dt_bias). The same
 * float32 formula on both sides (the kernels' vector softplus, threshold 20), so the results
 * agree bitwise. */
static void test_softplus_outside(void)
{
    ssm_spec sp = {.B = 2,
                   .T = 40,
                   .D = 80,
                   .N = 16,
                   .softplus = true,
                   .bias = true,
                   .gate = true,
                   .skip = true,
                   .h0 = true};
    ssm_data s;
    ssm_make(&s, &sp, 7);
    float *y_in = tu_alloc(s.n_y), *hT_in = tu_alloc(s.n_state);
    float *y_out = tu_alloc_poisoned(s.n_y), *hT_out = tu_alloc_poisoned(s.n_state);
    CHECK_OK(ssm_forward(&s.p, NULL, y_in, hT_in));

    float *dt_applied = tu_alloc(s.n_y);
    for (size_t i = 0; i < s.n_y; i++) dt_applied[i] = s.dt[i] + s.dt_bias[i % (size_t)sp.D];
    kernel_math(LS_SSM_VSOFTPLUS, LINSEQ_ACT_IDENTITY, s.n_y, dt_applied, dt_applied);
    linseq_ssm1_problem p = s.p;
    p.dt = dt_applied;
    p.dt_softplus = false;
    p.dt_bias = NULL;
    CHECK_OK(ssm_forward(&p, NULL, y_out, hT_out));
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
        ssm_spec sp = {.B = 1,
                       .T = 25,
                       .D = 100,
                       .N = 16,
                       .gate = true,
                       .skip = true,
                       .h0 = true,
                       .act = (linseq_activation)act};
        ssm_data s;
        ssm_make(&s, &sp, 300 + (uint64_t)act);
        float *y_gated = tu_alloc(s.n_y), *hT_gated = tu_alloc(s.n_state);
        float *y_plain = tu_alloc_poisoned(s.n_y), *hT_plain = tu_alloc_poisoned(s.n_state);
        CHECK_OK(ssm_forward(&s.p, NULL, y_gated, hT_gated));
        linseq_ssm1_problem p = s.p;
        p.gate = NULL;
        CHECK_OK(ssm_forward(&p, NULL, y_plain, hT_plain));
        const linseq_activation resolved =
            act == LINSEQ_ACT_DEFAULT ? LINSEQ_ACT_SILU : (linseq_activation)act;
        float *act_gate = tu_alloc(s.n_y);
        kernel_math(LS_SSM_VACT, resolved, s.n_y, s.gate, act_gate);
        size_t bad = 0;
        for (size_t i = 0; i < s.n_y; i++) {
            float expect = y_plain[i] * act_gate[i];
            if (memcmp(&expect, &y_gated[i], sizeof expect) != 0) bad++;
        }
        free(act_gate);
        CHECK(bad == 0, "activation %d: %zu gated outputs differ from y * act(gate)", act, bad);
        CHECK(tu_same_bits(hT_gated, hT_plain, s.n_state), "activation %d: the gate changed hT",
              act);
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
        ssm_spec sp = {.B = 2,
                       .T = 15,
                       .D = 96,
                       .N = 5,
                       .G = groups[gi],
                       .gate = true,
                       .skip = true,
                       .h0 = true,
                       .softplus = true,
                       .bias = true};
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
        CHECK_OK(ssm_forward(&s.p, NULL, y_g, hT_g));
        linseq_ssm1_problem p = s.p;
        p.G = D;
        p.B_proj = B_wide;
        p.C_proj = C_wide;
        CHECK_OK(ssm_forward(&p, NULL, y_w, hT_w));
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
        ssm_spec sp = {.B = 1,
                       .T = 70,
                       .D = D,
                       .N = N,
                       .G = G,
                       .gate = true,
                       .skip = true,
                       .h0 = with_h0,
                       .softplus = true,
                       .bias = true,
                       .cu_seqlens = cu,
                       .n_seqs = n_seqs};
        ssm_data s;
        ssm_make(&s, &sp, 500 + (uint64_t)with_h0);
        float *y = tu_alloc_poisoned(s.n_y), *hT = tu_alloc_poisoned(s.n_state);
        CHECK_OK(ssm_forward(&s.p, NULL, y, hT));

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
            CHECK_OK(ssm_forward(&p, NULL, y_one, hT_one));
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
    ssm_spec sp = {.B = B,
                   .T = T,
                   .D = D,
                   .N = N,
                   .gate = true,
                   .skip = true,
                   .h0 = true,
                   .softplus = true,
                   .bias = true};
    ssm_data s;
    ssm_make(&s, &sp, 600);
    float *y_full = tu_alloc(s.n_y), *hT_full = tu_alloc(s.n_state);
    CHECK_OK(ssm_forward(&s.p, NULL, y_full, hT_full));

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
        CHECK_OK(ssm_forward(&p, NULL, y, state));
        tu_place_tokens(y, B, T, D, t0, len, y_steps);
    }
    CHECK(tu_same_bits(y_full, y_steps, s.n_y),
          "prefill + in-place decode: y differs from one call");
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
    /* one spec a line reads as a table (clang-format would put one field a line) */
    /* clang-format off */
    const ssm_spec specs[] = {
        {.B = 3, .T = 40, .D = 200, .N = 16, .G = 4, .gate = true, .skip = true, .h0 = true},
        {.B = 1, .T = 90, .D = 150, .N = 7, .G = 3, .softplus = true, .bias = true, .h0 = true,
         .cu_seqlens = cu, .n_seqs = 3},
        /* few tokens: the forward groups blocks into larger items */
        {.B = 2, .T = 3, .D = 1000, .N = 16, .gate = true, .skip = true, .h0 = true,
         .softplus = true, .bias = true},
        {.B = 3, .T = 1, .D = 1100, .N = 16, .G = 5, .gate = true, .h0 = true},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        ssm_data s;
        ssm_make(&s, &specs[i], 700 + i);
        float *y1 = tu_alloc(s.n_y), *hT1 = tu_alloc(s.n_state);
        float *y = tu_alloc_poisoned(s.n_y), *hT = tu_alloc_poisoned(s.n_state);
        linseq_exec one = {.threads = 1};
        CHECK_OK(ssm_forward(&s.p, &one, y1, hT1));
        for (int threads = 2; threads <= 3; threads++) {
            linseq_exec ex = {.threads = threads};
            CHECK_OK(ssm_forward(&s.p, &ex, y, hT));
            CHECK(tu_same_bits(y1, y, s.n_y), "spec %zu: y with %d threads differs from 1 thread",
                  i, threads);
            CHECK(tu_same_bits(hT1, hT, s.n_state), "spec %zu: hT with %d threads differs", i,
                  threads);
        }
        CHECK_OK(ssm_forward(&s.p, NULL, y, NULL));
        CHECK(tu_same_bits(y1, y, s.n_y), "spec %zu: y without hT differs", i);
        free(y1);
        free(hT1);
        free(y);
        free(hT);
        ssm_free(&s);
    }
}

/* ==================================================================================== */
/* Backward                                                                               */
/* ==================================================================================== */

enum { GR_DX, GR_DDT, GR_DA, GR_DB, GR_DC, GR_DD, GR_DGATE, GR_DH0, GR_DBIAS, N_GRADS };
static const char *const grad_names[N_GRADS] = {"dx",      "ddt",   "dA",  "dB_proj", "dC_proj",
                                                "dD_skip", "dgate", "dh0", "ddt_bias"};

/* The upstream gradients, and every gradient the problem has: from the fast backward (float,
 * poisoned before the call so that an element it never writes cannot pass) and from the
 * double reference. */
typedef struct ssm_bwd {
    float *d_y, *d_hT;
    size_t n[N_GRADS]; /* 0 for a gradient of an input the problem does not have */
    float *g[N_GRADS];
    double *ref[N_GRADS];
} ssm_bwd;

/* d_y and d_hT N(0,1); d_hT only when with_d_hT. */
static void bwd_make(ssm_bwd *b, const ssm_data *s, bool with_d_hT, uint64_t seed)
{
    tu_rng rng = {seed};
    const linseq_ssm1_problem *p = &s->p;
    memset(b, 0, sizeof *b);
    b->d_y = tu_alloc(s->n_y);
    tu_fill_normal(&rng, b->d_y, s->n_y, 1.0);
    if (with_d_hT) {
        b->d_hT = tu_alloc(s->n_state);
        tu_fill_normal(&rng, b->d_hT, s->n_state, 1.0);
    }
    const size_t D = (size_t)p->D;
    const size_t sizes[N_GRADS] = {s->n_y,
                                   s->n_y,
                                   D * (size_t)p->N,
                                   s->n_proj,
                                   s->n_proj,
                                   p->D_skip ? D : 0,
                                   p->gate ? s->n_y : 0,
                                   s->n_state,
                                   p->dt_softplus ? D : 0};
    for (int k = 0; k < N_GRADS; k++) {
        b->n[k] = sizes[k];
        if (!sizes[k]) continue;
        b->g[k] = tu_alloc_poisoned(sizes[k]);
        b->ref[k] = calloc(sizes[k], sizeof(double));
        if (!b->ref[k]) exit(2);
    }
}

static void bwd_free(ssm_bwd *b)
{
    free(b->d_y);
    free(b->d_hT);
    for (int k = 0; k < N_GRADS; k++) {
        free(b->g[k]);
        free(b->ref[k]);
    }
}

static linseq_ssm1_grads grads_of(float *const g[N_GRADS])
{
    linseq_ssm1_grads out = {.dx = g[GR_DX],
                             .ddt = g[GR_DDT],
                             .dA = g[GR_DA],
                             .dB_proj = g[GR_DB],
                             .dC_proj = g[GR_DC],
                             .dD_skip = g[GR_DD],
                             .dgate = g[GR_DGATE],
                             .dh0 = g[GR_DH0],
                             .ddt_bias = g[GR_DBIAS]};
    return out;
}

static ls_ssm1_grads_f64 ref_grads_of(double *const g[N_GRADS])
{
    ls_ssm1_grads_f64 out = {.dx = g[GR_DX],
                             .ddt = g[GR_DDT],
                             .dA = g[GR_DA],
                             .dB_proj = g[GR_DB],
                             .dC_proj = g[GR_DC],
                             .dD_skip = g[GR_DD],
                             .dgate = g[GR_DGATE],
                             .dh0 = g[GR_DH0],
                             .ddt_bias = g[GR_DBIAS]};
    return out;
}

static void run_backward(const ssm_data *s, ssm_bwd *b, const linseq_exec *exec)
{
    const linseq_ssm1_grads g = grads_of(b->g);
    CHECK_OK(ssm_backward(&s->p, exec, b->d_y, b->d_hT, &g));
}

static void run_reference_backward(const ssm_data *s, ssm_bwd *b)
{
    const ls_ssm1_grads_f64 g = ref_grads_of(b->ref);
    CHECK_OK(ls_ssm1_backward_reference(&s->p, b->d_y, b->d_hT, &g));
}

/* The largest error per gradient seen by a group of checks, printed as a record of the margin
 * under each tolerance. */
typedef struct worst_errors {
    double e[N_GRADS];
} worst_errors;

static void print_worst(const char *what, const worst_errors *w)
{
    printf("  %s, max rel err:", what);
    for (int k = 0; k < N_GRADS; k++) printf(" %s %.2g", grad_names[k], w->e[k]);
    printf("\n");
}

/* Fast float32 backward against the double reference, max|a - b| / max|ref| per gradient.
 * The float32 error has the forward's sources (the N-term sums and the state, whose rounding
 * errors decay at the rate a_t) plus the same for the adjoint dh, which also decays at a_t, and
 * the sums over tokens of dA, dD_skip, ddt_bias (two-level: ~(64 + T/64) ulp at worst) and over
 * the channels of a group of dB/dC (cancelling sums: relative to the largest term, not to the
 * result). Measured at most ~1e-6 over these shapes, T = 700 included; 2e-5 leaves room for
 * other compilers and libms, and any wrong term (a missing decay, a gradient on the wrong
 * token, a missed group or softplus slope) is O(1e-2) or more. */
#define BWD_TOL 2e-5

static void check_backward_against_reference(const ssm_spec *sp, bool with_d_hT, uint64_t seed,
                                             const char *label, worst_errors *worst)
{
    ssm_data s;
    ssm_make(&s, sp, seed);
    ssm_bwd b;
    bwd_make(&b, &s, with_d_hT, seed + 1);
    run_backward(&s, &b, NULL);
    run_reference_backward(&s, &b);
    for (int k = 0; k < N_GRADS; k++) {
        if (!b.n[k]) continue;
        const double err = tu_rel_err_d(b.g[k], b.ref[k], b.n[k]);
        CHECK(err <= BWD_TOL, "%s: %s rel err %.3g", label, grad_names[k], err);
        if (err > worst->e[k]) worst->e[k] = err;
    }
    bwd_free(&b);
    ssm_free(&s);
}

static void test_backward_against_reference(void)
{
    static const int64_t cu[] = {0, 5, 5, 70, 71, 200};
    /* one spec a line reads as a table (clang-format would put one field a line) */
    /* clang-format off */
    const ssm_spec specs[] = {
        {.B = 1, .T = 1, .D = 1, .N = 1},
        {.B = 2, .T = 1, .D = 64, .N = 16, .h0 = true, .skip = true},      /* decode step */
        {.B = 2, .T = 33, .D = 67, .N = 5, .gate = true, .h0 = true},      /* ragged block */
        /* several checkpoint segments and a partial last one; groups of one block each */
        {.B = 1, .T = 700, .D = 70, .N = 16, .G = 2, .gate = true, .skip = true, .h0 = true,
         .softplus = true, .bias = true},
        /* groups of three blocks (64, 64, 2 channels): dB/dC partials added over blocks */
        {.B = 2, .T = 40, .D = 260, .N = 5, .G = 2, .gate = true, .skip = true, .h0 = true},
        {.B = 1, .T = 130, .D = 130, .N = 7, .softplus = true, .bias = true, .skip = true},
        {.B = 3, .T = 17, .D = 96, .N = 7, .G = 3, .h0 = true, .skip = true},
        {.B = 1, .T = 50, .D = 12, .N = 3, .G = 12, .gate = true},         /* G == D */
        {.B = 2, .T = 9, .D = 200, .N = 16, .G = 4, .softplus = true, .bias = true, .h0 = true},
        {.B = 1, .T = 40, .D = 5, .N = 33, .softplus = true}, /* ddt_bias without dt_bias */
        {.B = 1, .T = 200, .D = 70, .N = 6, .G = 2, .gate = true, .skip = true, .h0 = true,
         .softplus = true, .bias = true, .cu_seqlens = cu, .n_seqs = 5}, /* empty sequence */
    };
    /* clang-format on */
    worst_errors worst = {{0}};
    char label[64];
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        for (int with_d_hT = 0; with_d_hT <= 1; with_d_hT++) {
            snprintf(label, sizeof label, "backward spec %zu, d_hT %d", i, with_d_hT);
            check_backward_against_reference(&specs[i], with_d_hT,
                                             2000 + 10 * i + (uint64_t)with_d_hT, label, &worst);
        }
    for (int act = LINSEQ_ACT_DEFAULT; act <= LINSEQ_ACT_RELU; act++) {
        ssm_spec sp = {.B = 2,
                       .T = 21,
                       .D = 70,
                       .N = 8,
                       .G = 2,
                       .gate = true,
                       .skip = true,
                       .h0 = true,
                       .softplus = true,
                       .bias = true,
                       .act = (linseq_activation)act};
        snprintf(label, sizeof label, "backward gate activation %d", act);
        check_backward_against_reference(&sp, true, 2200 + (uint64_t)act, label, &worst);
    }
    print_worst("backward vs double reference", &worst);
}

/* ------------------------------------------------------------------------------------ */
/* Finite differences of the double forward                                              */

/* L = sum(y d_y) + sum(hT d_hT), everything in double. */
static double ssm_loss(const ssm_data *s, const ssm_bwd *b, double *y, double *hT)
{
    CHECK_OK(ls_ssm1_reference_f64(&s->p, y, hT));
    double loss = 0.0;
    for (size_t i = 0; i < s->n_y; i++) loss += y[i] * b->d_y[i];
    if (b->d_hT)
        for (size_t i = 0; i < s->n_state; i++) loss += hT[i] * b->d_hT[i];
    return loss;
}

/* Central differences with h = 2^-10: each input element is moved to the float32 values
 * v + h and v - h (rounded where v has bits below their ulp; the quotient divides by the step
 * actually taken), and L is evaluated in double. Truncation error h^2/6 |L^(3)| ~ 1.6e-7
 * |L^(3)|; rounding 1e-16 |L| / h ~ 1e-12. For most inputs the third derivative is within a
 * few times the largest gradient (measured errors <= 8e-7 of max|grad|), but L depends on A
 * through exp(A dt), whose third derivative carries dt^3, and the raw dt near softplus's
 * threshold gives dt ~ 20: dA's quotient is off by up to 6e-6 of max|dA|, the same for the
 * double and the fast backward (which adds < 1e-6, see BWD_TOL). 2e-5 covers that; a wrong
 * term (h_t for h_{t-1}, a missing decay or softplus slope) is off by 1e-2 or more. Every
 * element of every input is checked, except gate elements within 2h of relu's kink. */
#define FD_STEP 0x1p-10
#define FD_TOL 2e-5

static void check_finite_differences(const ssm_spec *sp, uint64_t seed, const char *label,
                                     double worst[2])
{
    ssm_data s;
    ssm_make(&s, sp, seed);
    ssm_bwd b;
    bwd_make(&b, &s, true, seed + 1);
    run_backward(&s, &b, NULL);
    run_reference_backward(&s, &b);
    double *y = malloc(s.n_y * sizeof *y), *hT = malloc(s.n_state * sizeof *hT);
    if (!y || !hT) exit(2);

    const linseq_activation act = ssm1_gate_activation(&s.p);
    const struct {
        float *v;
        int grad;
    } inputs[] = {
        {s.x, GR_DX},       {s.dt, GR_DDT},    {s.A, GR_DA},
        {s.B_proj, GR_DB},  {s.C_proj, GR_DC}, {s.D_skip, GR_DD},
        {s.gate, GR_DGATE}, {s.h0, GR_DH0},    {s.dt_bias, GR_DBIAS},
    };
    for (size_t k = 0; k < sizeof inputs / sizeof inputs[0]; k++) {
        float *v = inputs[k].v;
        const int gi = inputs[k].grad;
        if (!v) continue;
        double scale = 0.0, err_ref = 0.0, err_fast = 0.0;
        for (size_t i = 0; i < b.n[gi]; i++) scale = fmax(scale, fabs(b.ref[gi][i]));
        for (size_t i = 0; i < b.n[gi]; i++) {
            const float saved = v[i];
            if (gi == GR_DGATE && act == LINSEQ_ACT_RELU && fabsf(saved) < 2 * FD_STEP) continue;
            const float up = (float)(saved + FD_STEP), down = (float)(saved - FD_STEP);
            v[i] = up;
            const double loss_up = ssm_loss(&s, &b, y, hT);
            v[i] = down;
            const double loss_down = ssm_loss(&s, &b, y, hT);
            v[i] = saved;
            const double fd = (loss_up - loss_down) / ((double)up - (double)down);
            err_ref = fmax(err_ref, fabs(fd - b.ref[gi][i]));
            err_fast = fmax(err_fast, fabs(fd - (double)b.g[gi][i]));
        }
        err_ref /= scale > 0.0 ? scale : 1.0;
        err_fast /= scale > 0.0 ? scale : 1.0;
        CHECK(err_ref <= FD_TOL, "%s: %s: finite differences vs reference backward %.3g", label,
              grad_names[gi], err_ref);
        CHECK(err_fast <= FD_TOL, "%s: %s: finite differences vs fast backward %.3g", label,
              grad_names[gi], err_fast);
        worst[0] = fmax(worst[0], err_ref);
        worst[1] = fmax(worst[1], err_fast);
    }
    free(y);
    free(hT);
    bwd_free(&b);
    ssm_free(&s);
}

static void test_finite_differences(void)
{
    static const int64_t cu[] = {0, 4, 4, 13};
    double worst[2] = {0.0, 0.0};
    char label[64];
    for (int act = LINSEQ_ACT_DEFAULT; act <= LINSEQ_ACT_RELU; act++) {
        ssm_spec sp = {.B = 2,
                       .T = 9,
                       .D = 6,
                       .N = 3,
                       .G = 2,
                       .gate = true,
                       .skip = true,
                       .h0 = true,
                       .softplus = true,
                       .bias = true,
                       .act = (linseq_activation)act};
        snprintf(label, sizeof label, "finite differences, activation %d", act);
        check_finite_differences(&sp, 2300 + (uint64_t)act, label, worst);
    }
    ssm_spec plain = {.B = 2, .T = 9, .D = 6, .N = 3, .G = 3, .h0 = true};
    check_finite_differences(&plain, 2310, "finite differences, dt as given", worst);
    ssm_spec varlen = {.B = 1,
                       .T = 13,
                       .D = 6,
                       .N = 3,
                       .G = 2,
                       .gate = true,
                       .skip = true,
                       .h0 = true,
                       .softplus = true,
                       .bias = true,
                       .cu_seqlens = cu,
                       .n_seqs = 3};
    check_finite_differences(&varlen, 2320, "finite differences, varlen", worst);
    printf("  finite differences, max err / max|grad|: reference backward %.2g, fast %.2g\n",
           worst[0], worst[1]);
}

/* ------------------------------------------------------------------------------------ */
/* In-kernel options against the same math outside the kernel                           */

/* The relative error of a float result against a double sum of float pieces. */
#define SUM_TOL 1e-5

/* dt_softplus in the kernel == softplus applied outside, the chain rule applied by hand:
 * ddt_raw = ddt * softplus'(dt_raw + dt_bias) (slope 1 above the threshold 20). Bitwise for
 * everything but ddt_bias, which the test sums in another order. */
static void test_backward_softplus_outside(void)
{
    ssm_spec sp = {.B = 2,
                   .T = 90,
                   .D = 80,
                   .N = 16,
                   .softplus = true,
                   .bias = true,
                   .gate = true,
                   .skip = true,
                   .h0 = true};
    ssm_data s;
    ssm_make(&s, &sp, 2400);
    ssm_bwd in, out;
    bwd_make(&in, &s, true, 2401);
    run_backward(&s, &in, NULL);

    float *dt_biased = tu_alloc(s.n_y), *dt_applied = tu_alloc(s.n_y), *slope = tu_alloc(s.n_y);
    for (size_t i = 0; i < s.n_y; i++) dt_biased[i] = s.dt[i] + s.dt_bias[i % (size_t)sp.D];
    kernel_math(LS_SSM_VSOFTPLUS, LINSEQ_ACT_IDENTITY, s.n_y, dt_biased, dt_applied);
    kernel_math(LS_SSM_VSOFTPLUS_GRAD, LINSEQ_ACT_IDENTITY, s.n_y, dt_biased, slope);
    ssm_data outside = s;
    outside.p.dt = dt_applied;
    outside.p.dt_softplus = false;
    outside.p.dt_bias = NULL;
    bwd_make(&out, &outside, true, 2401);
    run_backward(&outside, &out, NULL);

    size_t bad = 0;
    double *bias_sum = calloc((size_t)sp.D, sizeof(double));
    if (!bias_sum) exit(2);
    for (size_t i = 0; i < s.n_y; i++) {
        const float chained = out.g[GR_DDT][i] * slope[i];
        if (memcmp(&chained, &in.g[GR_DDT][i], sizeof chained) != 0) bad++;
        bias_sum[i % (size_t)sp.D] += chained;
    }
    CHECK(bad == 0, "softplus outside: %zu of ddt differ from ddt * softplus'", bad);
    for (int k = 0; k < N_GRADS; k++) {
        if (k == GR_DDT || k == GR_DBIAS) continue;
        CHECK(tu_same_bits(in.g[k], out.g[k], in.n[k]), "softplus outside: %s differs",
              grad_names[k]);
    }
    const double err = tu_rel_err_d(in.g[GR_DBIAS], bias_sum, (size_t)sp.D);
    CHECK(err <= SUM_TOL, "softplus outside: ddt_bias rel err %.3g against the sum of ddt", err);
    free(bias_sum);
    free(dt_biased);
    free(dt_applied);
    free(slope);
    bwd_free(&in);
    bwd_free(&out);
    ssm_free(&s);
}

/* For every activation, the gated problem's gradients == the ungated problem's with
 * d_y * act(gate) as its upstream gradient, and dgate == d_y * y_ungated * act'(gate). Bitwise:
 * the kernel does exactly these float operations. */
static void test_backward_gate_outside(void)
{
    for (int act = LINSEQ_ACT_DEFAULT; act <= LINSEQ_ACT_RELU; act++) {
        ssm_spec sp = {.B = 1,
                       .T = 70,
                       .D = 100,
                       .N = 16,
                       .gate = true,
                       .skip = true,
                       .h0 = true,
                       .act = (linseq_activation)act};
        ssm_data s;
        ssm_make(&s, &sp, 2500 + (uint64_t)act);
        const linseq_activation resolved = ssm1_gate_activation(&s.p);
        ssm_bwd gated, plain;
        bwd_make(&gated, &s, true, 2510);
        run_backward(&s, &gated, NULL);

        ssm_data ungated = s;
        ungated.p.gate = NULL;
        float *y_plain = tu_alloc(s.n_y);
        CHECK_OK(ssm_forward(&ungated.p, NULL, y_plain, NULL));
        bwd_make(&plain, &ungated, true, 2510);
        float *act_gate = tu_alloc(s.n_y), *act_slope = tu_alloc(s.n_y);
        kernel_math(LS_SSM_VACT, resolved, s.n_y, s.gate, act_gate);
        kernel_math(LS_SSM_VACT_GRAD, resolved, s.n_y, s.gate, act_slope);
        for (size_t i = 0; i < s.n_y; i++) plain.d_y[i] = gated.d_y[i] * act_gate[i];
        run_backward(&ungated, &plain, NULL);

        for (int k = 0; k < N_GRADS; k++) {
            if (k == GR_DGATE) continue;
            CHECK(tu_same_bits(gated.g[k], plain.g[k], gated.n[k]),
                  "activation %d: %s differs from the ungated problem's", act, grad_names[k]);
        }
        size_t bad = 0;
        for (size_t i = 0; i < s.n_y; i++) {
            const float expect = gated.d_y[i] * y_plain[i] * act_slope[i];
            if (memcmp(&expect, &gated.g[GR_DGATE][i], sizeof expect) != 0) bad++;
        }
        CHECK(bad == 0, "activation %d: %zu of dgate differ from d_y * y * act'(gate)", act, bad);
        free(act_gate);
        free(act_slope);
        free(y_plain);
        bwd_free(&gated);
        bwd_free(&plain);
        ssm_free(&s);
    }
}

/* G groups == B_proj and C_proj expanded to one group per channel: dB and dC of a group ==
 * the sum over its channels of the expanded problem's (within SUM_TOL: another summation
 * order), everything else bitwise. Groups of several blocks (D/G = 130) included. */
static void test_backward_groups_expanded(void)
{
    static const int64_t groups[] = {1, 2, 3, 8};
    static const int64_t widths[] = {96, 260, 96, 96};
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        ssm_spec sp = {.B = 2,
                       .T = 70,
                       .D = widths[gi],
                       .N = 5,
                       .G = groups[gi],
                       .gate = true,
                       .skip = true,
                       .h0 = true,
                       .softplus = true,
                       .bias = true};
        ssm_data s;
        ssm_make(&s, &sp, 2600 + gi);
        const int64_t G = sp.G, D = sp.D, N = sp.N, BT = sp.B * sp.T;
        float *B_wide = tu_alloc((size_t)(BT * D * N));
        float *C_wide = tu_alloc((size_t)(BT * D * N));
        for (int64_t bt = 0; bt < BT; bt++)
            for (int64_t d = 0; d < D; d++)
                for (int64_t n = 0; n < N; n++) {
                    const int64_t g = d / (D / G);
                    B_wide[(bt * D + d) * N + n] = s.B_proj[(bt * G + g) * N + n];
                    C_wide[(bt * D + d) * N + n] = s.C_proj[(bt * G + g) * N + n];
                }
        ssm_bwd grouped, wide;
        bwd_make(&grouped, &s, true, 2610);
        run_backward(&s, &grouped, NULL);
        ssm_data expanded = s;
        expanded.p.G = D;
        expanded.p.B_proj = B_wide;
        expanded.p.C_proj = C_wide;
        expanded.n_proj = (size_t)(BT * D * N);
        bwd_make(&wide, &expanded, true, 2610);
        run_backward(&expanded, &wide, NULL);

        for (int k = 0; k < N_GRADS; k++) {
            if (k == GR_DB || k == GR_DC) continue;
            CHECK(tu_same_bits(grouped.g[k], wide.g[k], grouped.n[k]),
                  "G = %lld: %s differs from the expanded problem's", (long long)G, grad_names[k]);
        }
        double *sum = calloc(s.n_proj, sizeof(double));
        if (!sum) exit(2);
        for (int k = GR_DB; k <= GR_DC; k++) {
            memset(sum, 0, s.n_proj * sizeof(double));
            for (int64_t bt = 0; bt < BT; bt++)
                for (int64_t d = 0; d < D; d++)
                    for (int64_t n = 0; n < N; n++)
                        sum[(bt * G + d / (D / G)) * N + n] += wide.g[k][(bt * D + d) * N + n];
            const double err = tu_rel_err_d(grouped.g[k], sum, s.n_proj);
            CHECK(err <= SUM_TOL, "G = %lld: %s rel err %.3g against the expanded sum",
                  (long long)G, grad_names[k], err);
        }
        free(sum);
        free(B_wide);
        free(C_wide);
        bwd_free(&grouped);
        bwd_free(&wide);
        ssm_free(&s);
    }
}

/* ------------------------------------------------------------------------------------ */
/* Varlen, chained pieces, thread counts                                                 */

/* Adds src (n floats) to a double sum. */
static void accumulate(double *sum, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) sum[i] += src[i];
}

/* The parameters shared by sequences: summed over calls by the tests. */
static const int shared_grads[] = {GR_DA, GR_DD, GR_DBIAS};

/* Varlen == one call per sequence: the per-token and per-sequence gradients bitwise, dA,
 * dD_skip and ddt_bias within SUM_TOL of the sum of the calls' (another summation order). An
 * empty sequence passes d_hT to dh0 unchanged. */
static void test_backward_varlen(void)
{
    static const int64_t cu[] = {0, 5, 5, 140, 141, 170};
    const int64_t n_seqs = 5, D = 70, N = 6, G = 2;
    for (int with_h0 = 0; with_h0 <= 1; with_h0++) {
        ssm_spec sp = {.B = 1,
                       .T = 170,
                       .D = D,
                       .N = N,
                       .G = G,
                       .gate = true,
                       .skip = true,
                       .h0 = with_h0,
                       .softplus = true,
                       .bias = true,
                       .cu_seqlens = cu,
                       .n_seqs = n_seqs};
        ssm_data s;
        ssm_make(&s, &sp, 2700 + (uint64_t)with_h0);
        ssm_bwd all;
        bwd_make(&all, &s, with_h0, 2710);
        run_backward(&s, &all, NULL);

        const size_t row = (size_t)(D * N);
        double *sums[N_GRADS] = {0};
        for (size_t k = 0; k < sizeof shared_grads / sizeof shared_grads[0]; k++) {
            sums[shared_grads[k]] = calloc(all.n[shared_grads[k]], sizeof(double));
            if (!sums[shared_grads[k]]) exit(2);
        }
        for (int64_t n = 0; n < n_seqs; n++) {
            const int64_t t0 = cu[n], len = cu[n + 1] - cu[n];
            float *dh0_all = all.g[GR_DH0] + n * row;
            if (len == 0) {
                bool passed = true;
                for (size_t i = 0; i < row; i++)
                    passed &= dh0_all[i] == (all.d_hT ? all.d_hT[n * row + i] : 0.0f);
                CHECK(passed, "varlen backward: empty sequence %lld did not pass d_hT to dh0",
                      (long long)n);
                continue;
            }
            ssm_data one = s;
            one.p.cu_seqlens = NULL;
            one.p.n_seqs = 0;
            one.p.T = len;
            one.p.x = s.x + t0 * D;
            one.p.dt = s.dt + t0 * D;
            one.p.gate = s.gate + t0 * D;
            one.p.B_proj = s.B_proj + t0 * G * N;
            one.p.C_proj = s.C_proj + t0 * G * N;
            one.p.h0 = s.h0 ? s.h0 + n * row : NULL;
            one.n_y = (size_t)(len * D);
            one.n_proj = (size_t)(len * G * N);
            one.n_state = row;
            ssm_bwd b;
            bwd_make(&b, &one, with_h0, 2720);
            memcpy(b.d_y, all.d_y + t0 * D, one.n_y * sizeof(float));
            if (b.d_hT) memcpy(b.d_hT, all.d_hT + n * row, row * sizeof(float));
            run_backward(&one, &b, NULL);
            const size_t offsets[N_GRADS] = {
                [GR_DX] = (size_t)(t0 * D),     [GR_DDT] = (size_t)(t0 * D),
                [GR_DB] = (size_t)(t0 * G * N), [GR_DC] = (size_t)(t0 * G * N),
                [GR_DGATE] = (size_t)(t0 * D),  [GR_DH0] = n * row};
            for (int k = 0; k < N_GRADS; k++) {
                if (sums[k]) {
                    accumulate(sums[k], b.g[k], b.n[k]);
                    continue;
                }
                CHECK(tu_same_bits(all.g[k] + offsets[k], b.g[k], b.n[k]),
                      "varlen backward: %s of sequence %lld differs from its own call",
                      grad_names[k], (long long)n);
            }
            bwd_free(&b);
        }
        for (size_t k = 0; k < sizeof shared_grads / sizeof shared_grads[0]; k++) {
            const int gk = shared_grads[k];
            const double err = tu_rel_err_d(all.g[gk], sums[gk], all.n[gk]);
            CHECK(err <= SUM_TOL, "varlen backward: %s rel err %.3g against the sum of the calls",
                  grad_names[gk], err);
            free(sums[gk]);
        }
        bwd_free(&all);
        ssm_free(&s);
    }
}

/* One long call == two pieces, the second starting from the first's hT and the first getting
 * the second's dh0 as its d_hT. The per-token gradients and dh0 bitwise (the recomputed states
 * and the carried gradient are the same floats whatever the segment boundaries); the shared
 * parameters within SUM_TOL of the sum of the pieces'. */
static void test_backward_chained(void)
{
    const int64_t B = 2, T = 150, D = 70, N = 8, first = 100, second = T - first;
    ssm_spec sp = {.B = B,
                   .T = T,
                   .D = D,
                   .N = N,
                   .gate = true,
                   .skip = true,
                   .h0 = true,
                   .softplus = true,
                   .bias = true};
    ssm_data s;
    ssm_make(&s, &sp, 2800);
    ssm_bwd whole;
    bwd_make(&whole, &s, true, 2810);
    run_backward(&s, &whole, NULL);

    ssm_data piece[2];
    ssm_bwd pb[2];
    const int64_t t0[2] = {0, first}, len[2] = {first, second};
    float *hT_first = tu_alloc(s.n_state);
    for (int i = 0; i < 2; i++) {
        ssm_spec psp = sp;
        psp.T = len[i];
        ssm_make(&piece[i], &psp, 2820); /* allocations of the right sizes, then overwritten */
        tu_slice_tokens(s.x, B, T, D, t0[i], len[i], piece[i].x);
        tu_slice_tokens(s.dt, B, T, D, t0[i], len[i], piece[i].dt);
        tu_slice_tokens(s.gate, B, T, D, t0[i], len[i], piece[i].gate);
        tu_slice_tokens(s.B_proj, B, T, N, t0[i], len[i], piece[i].B_proj);
        tu_slice_tokens(s.C_proj, B, T, N, t0[i], len[i], piece[i].C_proj);
        memcpy(piece[i].A, s.A, (size_t)(D * N) * sizeof(float));
        memcpy(piece[i].D_skip, s.D_skip, (size_t)D * sizeof(float));
        memcpy(piece[i].dt_bias, s.dt_bias, (size_t)D * sizeof(float));
        if (i == 0) memcpy(piece[0].h0, s.h0, s.n_state * sizeof(float));
        bwd_make(&pb[i], &piece[i], true, 2830);
        tu_slice_tokens(whole.d_y, B, T, D, t0[i], len[i], pb[i].d_y);
    }
    /* The second piece starts from the state the forward of the first one ends in. */
    float *y_first = tu_alloc(piece[0].n_y);
    CHECK_OK(ssm_forward(&piece[0].p, NULL, y_first, hT_first));
    memcpy(piece[1].h0, hT_first, s.n_state * sizeof(float));
    memcpy(pb[1].d_hT, whole.d_hT, s.n_state * sizeof(float));
    run_backward(&piece[1], &pb[1], NULL);
    memcpy(pb[0].d_hT, pb[1].g[GR_DH0], s.n_state * sizeof(float));
    run_backward(&piece[0], &pb[0], NULL);

    const int per_token[] = {GR_DX, GR_DDT, GR_DGATE, GR_DB, GR_DC};
    for (size_t k = 0; k < sizeof per_token / sizeof per_token[0]; k++) {
        const int gk = per_token[k];
        const int64_t width = gk == GR_DB || gk == GR_DC ? N : D;
        float *joined = tu_alloc_poisoned(whole.n[gk]);
        for (int i = 0; i < 2; i++)
            tu_place_tokens(pb[i].g[gk], B, T, width, t0[i], len[i], joined);
        CHECK(tu_same_bits(whole.g[gk], joined, whole.n[gk]),
              "chained backward: %s of the pieces differs from one call", grad_names[gk]);
        free(joined);
    }
    CHECK(tu_same_bits(whole.g[GR_DH0], pb[0].g[GR_DH0], s.n_state),
          "chained backward: dh0 of the pieces differs from one call");
    for (size_t k = 0; k < sizeof shared_grads / sizeof shared_grads[0]; k++) {
        const int gk = shared_grads[k];
        double *sum = calloc(whole.n[gk], sizeof(double));
        if (!sum) exit(2);
        accumulate(sum, pb[0].g[gk], whole.n[gk]);
        accumulate(sum, pb[1].g[gk], whole.n[gk]);
        const double err = tu_rel_err_d(whole.g[gk], sum, whole.n[gk]);
        CHECK(err <= SUM_TOL, "chained backward: %s rel err %.3g against the pieces' sum",
              grad_names[gk], err);
        free(sum);
    }
    free(hT_first);
    free(y_first);
    for (int i = 0; i < 2; i++) {
        bwd_free(&pb[i]);
        ssm_free(&piece[i]);
    }
    bwd_free(&whole);
    ssm_free(&s);
}

/* Thread counts 1, 2, 3 give bitwise identical gradients (several blocks per group, so the
 * partial sums of dB/dC, and varlen), and a call asking for a subset of the gradients gets the
 * same bits for them. */
static void test_backward_threads(void)
{
    static const int64_t cu[] = {0, 70, 71, 150};
    /* one spec a line reads as a table (clang-format would put one field a line) */
    /* clang-format off */
    const ssm_spec specs[] = {
        {.B = 3, .T = 40, .D = 260, .N = 7, .G = 2, .gate = true, .skip = true, .h0 = true,
         .softplus = true, .bias = true},
        {.B = 1, .T = 150, .D = 150, .N = 5, .G = 3, .softplus = true, .bias = true, .h0 = true,
         .cu_seqlens = cu, .n_seqs = 3},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        ssm_data s;
        ssm_make(&s, &specs[i], 2900 + i);
        ssm_bwd one, b;
        bwd_make(&one, &s, true, 2910);
        bwd_make(&b, &s, true, 2910);
        const linseq_exec single = {.threads = 1};
        run_backward(&s, &one, &single);
        for (int threads = 2; threads <= 3; threads++) {
            const linseq_exec ex = {.threads = threads};
            for (int k = 0; k < N_GRADS; k++)
                if (b.g[k]) tu_poison(b.g[k], b.n[k] * sizeof(float));
            run_backward(&s, &b, &ex);
            for (int k = 0; k < N_GRADS; k++)
                CHECK(tu_same_bits(one.g[k], b.g[k], one.n[k]),
                      "spec %zu: %s with %d threads differs from 1 thread", i, grad_names[k],
                      threads);
        }
        /* One gradient at a time: the others NULL. */
        for (int k = 0; k < N_GRADS; k++) {
            if (!b.g[k]) continue;
            float *only[N_GRADS] = {0};
            only[k] = b.g[k];
            tu_poison(b.g[k], b.n[k] * sizeof(float));
            const linseq_ssm1_grads g = grads_of(only);
            CHECK_OK(ssm_backward(&s.p, NULL, b.d_y, b.d_hT, &g));
            CHECK(tu_same_bits(one.g[k], b.g[k], one.n[k]),
                  "spec %zu: %s alone differs from %s with every gradient", i, grad_names[k],
                  grad_names[k]);
        }
        bwd_free(&one);
        bwd_free(&b);
        ssm_free(&s);
    }
}

/* Extreme steps: dt = softplus(30) = 30 (past the threshold), A dt down to -1000 (the decay
 * underflows to 0), dt = 0 (the decay is 1, nothing enters the state). Every gradient finite
 * and within BWD_TOL of the reference. */
static void test_backward_stability(void)
{
    for (int variant = 0; variant < 3; variant++) {
        ssm_spec sp = {.B = 2,
                       .T = 80,
                       .D = 70,
                       .N = 16,
                       .gate = true,
                       .skip = true,
                       .h0 = true,
                       .softplus = variant == 0,
                       .bias = variant == 0};
        ssm_data s;
        ssm_make(&s, &sp, 3000 + (uint64_t)variant);
        for (size_t i = 0; i < s.n_y; i++) {
            if (variant == 0) s.dt[i] = 30.0f - s.dt_bias[i % (size_t)sp.D];
            if (variant == 1) s.dt[i] = 250.0f;
            if (variant == 2) s.dt[i] = i % 3 ? 0.0f : s.dt[i];
        }
        if (variant == 1)
            for (int64_t i = 0; i < sp.D * sp.N; i++) s.A[i] = i % 2 ? -4.0f : -1e-3f;
        ssm_bwd b;
        bwd_make(&b, &s, true, 3010);
        run_backward(&s, &b, NULL);
        run_reference_backward(&s, &b);
        for (int k = 0; k < N_GRADS; k++) {
            if (!b.n[k]) continue;
            size_t bad = 0;
            for (size_t i = 0; i < b.n[k]; i++) bad += !isfinite(b.g[k][i]);
            CHECK(bad == 0, "stability %d: %zu of %s not finite", variant, bad, grad_names[k]);
            const double err = tu_rel_err_d(b.g[k], b.ref[k], b.n[k]);
            CHECK(err <= BWD_TOL, "stability %d: %s rel err %.3g", variant, grad_names[k], err);
        }
        bwd_free(&b);
        ssm_free(&s);
    }
}

/* ------------------------------------------------------------------------------------ */
/* Optional inputs of the backward (the invalid arguments are in test_bad_inputs.c).     */

static void test_backward_optional_inputs(void)
{
    /* The valid edge cases: dh0 without h0, ddt_bias without dt_bias, no gradient at all; and
     * a success clears the message of the failure before it. */
    float x = 1.0f, dt = 0.1f, A = -1.0f, Bv = 1.0f, Cv = 1.0f, d_y = 1.0f, dh0 = -1.0f;
    float ddt_bias = -1.0f;
    linseq_ssm1_problem p = {.B = 1,
                             .T = 1,
                             .D = 1,
                             .N = 1,
                             .x = &x,
                             .dt = &dt,
                             .A = &A,
                             .B_proj = &Bv,
                             .C_proj = &Cv,
                             .dt_softplus = true};
    linseq_ssm1_grads grads = {.dh0 = &dh0, .ddt_bias = &ddt_bias};
    CHECK(linseq_ssm1_backward(&p, NULL, &d_y, NULL, NULL) == LINSEQ_ERR_NULL_POINTER,
          "NULL grads");
    CHECK_OK(linseq_ssm1_backward(&p, NULL, &d_y, NULL, &grads));
    CHECK(linseq_last_error()[0] == '\0', "a success left the message \"%s\"", linseq_last_error());
    /* h_1 = dt B x with dt = softplus(0.1): dL/dh0 = exp(A dt) C, ddt_bias = softplus'(0.1)
     * (B x C + A exp(A dt) h0 C) with h0 = 0. */
    const double step = log1p(exp(0.1));
    CHECK(fabs(dh0 - exp(-step)) < 1e-6, "dh0 without h0 = %g, expected %g", dh0, exp(-step));
    CHECK(fabs(ddt_bias - 1.0 / (1.0 + exp(-0.1))) < 1e-6, "ddt_bias without dt_bias = %g",
          ddt_bias);
    const linseq_ssm1_grads none = {0};
    CHECK_OK(linseq_ssm1_backward(&p, NULL, &d_y, NULL, &none));
}

/* The public entry points run the active ISA's kernels: the same bits as the _isa entry points
 * given ls_isa_active(). */
static void test_public_entry_points(void)
{
    ssm_spec sp = {.B = 2,
                   .T = 70,
                   .D = 70,
                   .N = 16,
                   .gate = true,
                   .skip = true,
                   .h0 = true,
                   .softplus = true,
                   .bias = true};
    ssm_data s;
    ssm_make(&s, &sp, 3200);
    float *y = tu_alloc(s.n_y), *hT = tu_alloc(s.n_state);
    float *y_isa = tu_alloc_poisoned(s.n_y), *hT_isa = tu_alloc_poisoned(s.n_state);
    CHECK_OK(linseq_ssm1_forward(&s.p, NULL, y, hT));
    CHECK_OK(ls_ssm1_forward_isa(&s.p, NULL, y_isa, hT_isa, ls_isa_active()));
    CHECK(tu_same_bits(y, y_isa, s.n_y) && tu_same_bits(hT, hT_isa, s.n_state),
          "linseq_ssm1_forward differs from the %s kernels", ls_isa_name(ls_isa_active()));
    ssm_bwd pub, isa;
    bwd_make(&pub, &s, true, 3210);
    bwd_make(&isa, &s, true, 3210);
    const linseq_ssm1_grads g_pub = grads_of(pub.g), g_isa = grads_of(isa.g);
    CHECK_OK(linseq_ssm1_backward(&s.p, NULL, pub.d_y, pub.d_hT, &g_pub));
    CHECK_OK(ls_ssm1_backward_isa(&s.p, NULL, isa.d_y, isa.d_hT, &g_isa, ls_isa_active()));
    for (int k = 0; k < N_GRADS; k++)
        CHECK(tu_same_bits(pub.g[k], isa.g[k], pub.n[k]),
              "linseq_ssm1_backward: %s differs from the %s kernels", grad_names[k],
              ls_isa_name(ls_isa_active()));
    bwd_free(&pub);
    bwd_free(&isa);
    free(y);
    free(hT);
    free(y_isa);
    free(hT_isa);
    ssm_free(&s);
}

int main(void)
{
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) {
            printf("ssm1 %s: not available on this CPU, skipped\n", ls_isa_name((ls_isa)isa));
            continue;
        }
        test_isa = (ls_isa)isa;
        const tu_mark mark = tu_mark_now();
        test_hand_example();
        test_against_reference();
        test_softplus_outside();
        test_gate_outside();
        test_groups_expanded();
        test_varlen();
        test_prefill_then_decode();
        test_threads();
        test_backward_against_reference();
        test_finite_differences();
        test_backward_softplus_outside();
        test_backward_gate_outside();
        test_backward_groups_expanded();
        test_backward_varlen();
        test_backward_chained();
        test_backward_threads();
        test_backward_stability();
        tu_mark tally = {0, 0};
        tu_tally_add(&tally, mark);
        char label[64];
        snprintf(label, sizeof label, "ssm1 forward+backward %s", ls_isa_name(test_isa));
        tu_report(label, tally, "vs the double reference and its finite differences");
    }
    test_public_entry_points();
    test_backward_optional_inputs();
    return tu_finish("test_ssm1");
}
