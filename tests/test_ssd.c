/* SSD (Mamba2): every ISA's kernels, chunked at each chunk size and recurrent, against the
 * double reference over the options (groups, D per head or channel, the z gate, dt_bias with
 * softplus, the dt clamp, N-first states, packed sequences with an empty one); decode == the
 * recurrent forward one token at a time; hT == h0 in place; thread counts bitwise; the
 * backward against central differences of the double reference; the invalid arguments each
 * named. The numeric tests run through ls_ssd_*_isa once per ISA the CPU has; the problems
 * and the double reference are ssd_fixture.c's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half_float.h"
#include "ssd/ssd.h"
#include "ssd_fixture.h"
#include "rows_pool.h"
#include "testutil.h"

static ls_isa test_isa = LS_ISA_SCALAR;

/* one spec a line reads as a table (clang-format would put one field a line) */
/* clang-format off */
static const ssd_spec specs[] = {
    {.B = 1, .T = 1, .H = 2, .P = 8, .N = 4, .h0 = true, .D = true},
    {.B = 2, .T = 70, .H = 4, .P = 16, .N = 8, .G = 2, .z = true, .D = true},
    {.B = 1, .T = 130, .H = 6, .P = 20, .N = 17, .G = 3, .h0 = true, .softplus = true,
     .dt_max = 0.6f, .D = true, .D_per_channel = true},
    {.B = 2, .T = 65, .H = 2, .P = 64, .N = 128, .h0 = true, .n_first = true, .z = true},
    {.B = 1, .T = 130, .H = 3, .P = 16, .N = 8, .h0 = true, .softplus = true, .z = true,
     .D = true, .cu = ssd_cu_empty, .n_seqs = 4},
};
/* clang-format on */
#define N_SPECS (sizeof specs / sizeof specs[0])

/* ---- forward -------------------------------------------------------------------------- */

static void test_against_reference(void)
{
    static const struct {
        linseq_mode mode;
        int chunk;
    } execs[] = {{LINSEQ_MODE_RECURRENT, 0},
                 {LINSEQ_MODE_DEFAULT, 0},
                 {LINSEQ_MODE_CHUNKED, 16},
                 {LINSEQ_MODE_CHUNKED, 32},
                 {LINSEQ_MODE_CHUNKED, 128}};
    for (size_t i = 0; i < N_SPECS; i++) {
        ssd_fixture e;
        ssd_fixture_make(&e, &specs[i], 100 + i);
        double *ry = malloc(e.n_y * sizeof(double)), *rh = malloc(e.n_s * sizeof(double));
        ssd_reference(&e.p, ry, rh);
        for (size_t k = 0; k < sizeof execs / sizeof execs[0]; k++) {
            linseq_exec ex = {.mode = execs[k].mode, .chunk_size = execs[k].chunk};
            float *y = tu_alloc_poisoned(e.n_y), *hT = tu_alloc_poisoned(e.n_s);
            CHECK_OK(ls_ssd_forward_isa(&e.p, &ex, y, hT, test_isa));
            const double ey = tu_rel_err_d(y, ry, e.n_y), eh = tu_rel_err_d(hT, rh, e.n_s);
            CHECK(ey < 2e-5 && eh < 2e-5,
                  "spec %zu, mode %d chunk %d: error y %.2e, hT %.2e vs the reference", i,
                  (int)execs[k].mode, execs[k].chunk, ey, eh);
            free(y), free(hT);
        }
        free(ry), free(rh);
        ssd_fixture_free(&e);
    }
}

/* Token t of every request of p as a T = 1 problem without h0: each per-token input p has,
 * sliced into the buffers of `one` (a fixture of p's spec at T = 1). */
static linseq_ssd_problem token_step(const linseq_ssd_problem *p, int64_t t, ssd_fixture *one)
{
    linseq_ssd_problem step = *p;
    step.T = 1, step.h0 = NULL;
    const int64_t hp = p->H * p->P, gn = (p->G ? p->G : 1) * p->N;
    const struct {
        const float **input;
        float *token;
        int64_t width;
    } parts[] = {{&step.x, one->x, hp},
                 {&step.z, one->z, hp},
                 {&step.dt, one->dt, p->H},
                 {&step.B_proj, one->Bp, gn},
                 {&step.C_proj, one->Cp, gn}};
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
        if (!*parts[k].input) continue;
        tu_slice_tokens(*parts[k].input, p->B, p->T, parts[k].width, t, 1, parts[k].token);
        *parts[k].input = parts[k].token;
    }
    return step;
}

/* Decode over a pool with mapped rows (one padding request), one token at a time, gives the
 * bits of the recurrent forward; rows not named stay untouched. */
static void test_decode_steps(void)
{
    ssd_spec s = {.B = 3,
                  .T = 9,
                  .H = 4,
                  .P = 16,
                  .N = 8,
                  .G = 2,
                  .h0 = true,
                  .D = true,
                  .z = true,
                  .softplus = true};
    for (int n_first = 0; n_first < 2; n_first++) {
        s.n_first = n_first;
        ssd_fixture e;
        ssd_fixture_make(&e, &s, 7);
        const int64_t n_rows = 6, rows[] = {4, -1, 1}, row_size = s.H * s.P * s.N;
        const int64_t tok = s.H * s.P;
        float *y = tu_alloc(e.n_y), *hT = tu_alloc(e.n_s);
        linseq_exec rec = {.mode = LINSEQ_MODE_RECURRENT};
        CHECK_OK(ls_ssd_forward_isa(&e.p, &rec, y, hT, test_isa));
        float *pool = tu_alloc((size_t)(n_rows * row_size)),
              *pool0 = tu_alloc((size_t)(n_rows * row_size));
        tu_rng r = {99};
        tu_fill_normal(&r, pool, (size_t)(n_rows * row_size), 1.0);
        for (int64_t b = 0; b < s.B; b++)
            if (rows[b] >= 0)
                memcpy(pool + rows[b] * row_size, e.h0 + b * row_size, (size_t)row_size * 4);
        memcpy(pool0, pool, (size_t)(n_rows * row_size) * sizeof(float));
        ssd_spec one_token = s;
        one_token.T = 1;
        ssd_fixture one;
        ssd_fixture_alloc(&one, &one_token);
        float *yt = tu_alloc((size_t)(s.B * tok)), *ys = tu_alloc(e.n_y);
        bool padding_zero = true;
        for (int64_t t = 0; t < s.T; t++) {
            const linseq_ssd_problem step = token_step(&e.p, t, &one);
            tu_poison(yt, (size_t)(s.B * tok) * sizeof(float));
            CHECK_OK(ls_ssd_decode_isa(&step, NULL, pool, n_rows, rows, yt, test_isa));
            for (int64_t i = 0; i < tok; i++) padding_zero &= yt[tok + i] == 0.0f;
            tu_place_tokens(yt, s.B, s.T, tok, t, 1, ys);
        }
        CHECK(padding_zero, "decode: the padding request's y is not 0");
        for (int64_t b = 0; b < s.B; b += 2) {
            CHECK(tu_same_bits(ys + b * s.T * tok, y + b * s.T * tok, (size_t)(s.T * tok)),
                  "decode (n_first %d): request %lld's y differs from the recurrent forward's",
                  n_first, (long long)b);
            CHECK(tu_same_bits(pool + rows[b] * row_size, hT + b * row_size, (size_t)row_size),
                  "decode (n_first %d): request %lld's row differs from hT", n_first, (long long)b);
        }
        for (int64_t row = 0; row < n_rows; row++)
            if (row != 4 && row != 1)
                CHECK(tu_same_bits(pool + row * row_size, pool0 + row * row_size, (size_t)row_size),
                      "decode: row %lld, named by no request, changed", (long long)row);
        free(y), free(hT), free(pool), free(pool0), free(yt), free(ys);
        ssd_fixture_free(&one);
        ssd_fixture_free(&e);
    }
}

/* One decode step over a serving engine's rows (ls_ssd_decode_rows_isa): bf16 and float32
 * rows a stride apart, one request moved to another row, one in place, one padding; the
 * states are the plain decode's on the widened rows, rounded once, in the destination rows
 * only, and y is its y bit for bit; both state layouts. */
static void test_decode_rows(void)
{
    ssd_spec s = {
        .B = 3, .T = 1, .H = 4, .P = 16, .N = 8, .G = 2, .D = true, .z = true, .softplus = true};
    enum { N_ROWS = 6, GAP = 3 };
    static const int64_t src[] = {4, -1, 1}, dst[] = {5, -1, 1};
    for (int n_first = 0; n_first < 2; n_first++)
        for (int dtype = LINSEQ_POOL_F32; dtype <= LINSEQ_POOL_BF16; dtype++) {
            s.n_first = n_first;
            ssd_fixture e;
            ssd_fixture_make(&e, &s, 31);
            e.p.h0 = NULL;
            rows_pool pool;
            rows_pool_make(&pool, (linseq_pool_dtype)dtype, N_ROWS, s.H * s.P * s.N, GAP, 17);
            float *y_ref = tu_alloc(e.n_y), *y = tu_alloc_poisoned(e.n_y);
            CHECK_OK(ls_ssd_decode_isa(&e.p, NULL, pool.dense, N_ROWS, src, y_ref, test_isa));
            const ls_state_rows rows = rows_pool_rows(&pool, src, dst);
            CHECK_OK(ls_ssd_decode_rows_isa(&e.p, NULL, &rows, N_ROWS, y, test_isa));
            CHECK(tu_same_bits(y, y_ref, e.n_y) && rows_pool_holds(&pool, pool.dense, src, dst, 3),
                  "decode rows (n_first %d, %s pool): y or rows differ from the plain decode's",
                  n_first, dtype ? "bf16" : "f32");
            free(y_ref), free(y);
            rows_pool_free(&pool);
            ssd_fixture_free(&e);
        }
}

/* bf16 rows of whole vectors (N = 40: two of 16 and a tail) whose states hold subnormal,
 * infinite and NaN values: the new states' rounding (AVX512-BF16's instruction where the CPU
 * has it, else integer arithmetic) gives the bits of the plain decode on the widened rows,
 * rounded once, on every ISA. The kernels read subnormal states as zeros (core/fp_mode.h),
 * the plain decode as well. */
static void test_decode_bf16_rows_extremes(void)
{
    const ssd_spec s = {.B = 2, .T = 1, .H = 2, .P = 16, .N = 40, .D = true, .softplus = true};
    static const int64_t src[] = {0, 2}, dst[] = {1, 2};
    ssd_fixture e;
    ssd_fixture_make(&e, &s, 43);
    e.p.h0 = NULL;
    const int64_t row = s.H * s.P * s.N;
    rows_pool pool;
    rows_pool_make(&pool, LINSEQ_POOL_BF16, 3, row, 0, 29);
    uint16_t *h = (uint16_t *)(void *)pool.data, *before = (uint16_t *)(void *)pool.before;
    int subnormal = 0;
    for (int64_t i = 0; i < 3 * row; i++) {
        if (i < row) h[i] = ls_f32_to_bf16(ls_bf16_to_f32(h[i]) * 1e-39f);
        if (i == 2 * row + 5) h[i] = 0x7f80;  /* +inf */
        if (i == 2 * row + 77) h[i] = 0xffc1; /* a NaN */
        before[i] = h[i];
        pool.dense[i] = ls_bf16_to_f32(h[i]);
        subnormal += fpclassify(pool.dense[i]) == FP_SUBNORMAL;
    }
    float *y_ref = tu_alloc(e.n_y), *y = tu_alloc_poisoned(e.n_y);
    CHECK_OK(ls_ssd_decode_isa(&e.p, NULL, pool.dense, 3, src, y_ref, test_isa));
    const ls_state_rows rows = rows_pool_rows(&pool, src, dst);
    CHECK_OK(ls_ssd_decode_rows_isa(&e.p, NULL, &rows, 3, y, test_isa));
    CHECK(subnormal > 100 && tu_same_bits(y, y_ref, e.n_y) &&
              rows_pool_holds(&pool, pool.dense, src, dst, 2),
          "bf16 rows with subnormal (%d), inf and NaN states: y or rows differ from the plain "
          "decode rounded once",
          subnormal);
    free(y_ref), free(y);
    rows_pool_free(&pool);
    ssd_fixture_free(&e);
}

/* hT == h0 in place, and thread counts, bitwise. */
static void test_in_place_and_threads(void)
{
    ssd_fixture e;
    ssd_fixture_make(&e, &specs[2], 11);
    float *y = tu_alloc(e.n_y), *hT = tu_alloc(e.n_s), *y2 = tu_alloc(e.n_y);
    float *h2 = tu_alloc(e.n_s);
    linseq_exec one = {.threads = 1};
    CHECK_OK(ls_ssd_forward_isa(&e.p, &one, y, hT, test_isa));
    for (int threads = 2; threads <= 3; threads++) {
        linseq_exec ex = {.threads = threads};
        CHECK_OK(ls_ssd_forward_isa(&e.p, &ex, y2, h2, test_isa));
        CHECK(tu_same_bits(y, y2, e.n_y) && tu_same_bits(hT, h2, e.n_s), "%d threads differ from 1",
              threads);
    }
    CHECK_OK(ls_ssd_forward_isa(&e.p, NULL, y2, e.h0, test_isa));
    CHECK(tu_same_bits(e.h0, hT, e.n_s) && tu_same_bits(y, y2, e.n_y),
          "in place: h0 after the call, or y, differs");
    free(y), free(hT), free(y2), free(h2);
    ssd_fixture_free(&e);
}

/* ---- backward ------------------------------------------------------------------------- */

/* L = sum(y * d_y) + sum(hT * d_hT) in double. */
static double ref_loss(const linseq_ssd_problem *p, const float *d_y, const float *d_hT, size_t n_y,
                       size_t n_s)
{
    double *y = malloc(n_y * sizeof *y), *hT = malloc(n_s * sizeof *hT), loss = 0.0;
    ssd_reference(p, y, hT);
    for (size_t i = 0; i < n_y; i++) loss += y[i] * d_y[i];
    for (size_t i = 0; i < n_s; i++) loss += hT[i] * d_hT[i];
    free(y), free(hT);
    return loss;
}

/* Each gradient against the central difference of the double loss at a few elements. */
static void check_gradient(const char *what, ssd_fixture *e, float *input, const float *grad,
                           size_t n, const float *d_y, const float *d_hT)
{
    double worst = 0.0;
    for (size_t k = 0; k < 6 && k < n; k++) {
        const size_t i = k * (n - 1) / 5;
        const float keep = input[i];
        const double h = 1e-3 * fmax(1.0, fabs(keep));
        input[i] = (float)(keep + h);
        const double up = ref_loss(&e->p, d_y, d_hT, e->n_y, e->n_s);
        const double h_up = (double)input[i] - keep;
        input[i] = (float)(keep - h);
        const double down = ref_loss(&e->p, d_y, d_hT, e->n_y, e->n_s);
        const double h_down = keep - (double)input[i];
        input[i] = keep;
        const double fd = (up - down) / (h_up + h_down);
        const double err = fabs(fd - grad[i]) / fmax(1.0, fabs(fd));
        worst = fmax(worst, err);
    }
    CHECK(worst < 2e-4, "%s: gradient vs central differences, worst relative error %.2e", what,
          worst);
}

static void test_backward(void)
{
    /* one spec a line reads as a table (clang-format would put one field a line) */
    /* clang-format off */
    static const ssd_spec small[] = {
        {.B = 2, .T = 11, .H = 4, .P = 3, .N = 5, .G = 2, .h0 = true, .D = true, .z = true},
        {.B = 1, .T = 23, .H = 2, .P = 4, .N = 3, .h0 = true, .softplus = true, .dt_max = 0.6f,
         .D = true, .D_per_channel = true, .n_first = true},
        {.B = 1, .T = 130, .H = 3, .P = 16, .N = 8, .h0 = true, .softplus = true, .z = true,
         .D = true, .cu = ssd_cu_empty, .n_seqs = 4},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        const ssd_spec *s = &small[i];
        ssd_fixture e;
        ssd_fixture_make(&e, s, 300 + i);
        tu_rng r = {400 + i};
        float *d_y = tu_alloc(e.n_y), *d_hT = tu_alloc(e.n_s);
        tu_fill_normal(&r, d_y, e.n_y, 1.0);
        tu_fill_normal(&r, d_hT, e.n_s, 1.0);
        const size_t n_dt = e.n_dt, n_bc = e.n_bc, n_d = e.n_d;
        linseq_ssd_grads g = {.dx = tu_alloc(e.n_y),
                              .ddt = tu_alloc(n_dt),
                              .dA = tu_alloc((size_t)s->H),
                              .dB_proj = tu_alloc(n_bc),
                              .dC_proj = tu_alloc(n_bc),
                              .dD_skip = tu_alloc(n_d),
                              .dz = s->z ? tu_alloc(e.n_y) : NULL,
                              .dh0 = tu_alloc(e.n_s),
                              .ddt_bias = s->softplus ? tu_alloc((size_t)s->H) : NULL};
        linseq_exec ex = {.chunk_size = 16};
        CHECK_OK(ls_ssd_backward_isa(&e.p, &ex, d_y, d_hT, &g, test_isa));
        char what[64];
#define GRAD(name, input, grad, n)                                                                 \
    do {                                                                                           \
        snprintf(what, sizeof what, "spec %zu %s", i, name);                                       \
        check_gradient(what, &e, input, grad, n, d_y, d_hT);                                       \
    } while (0)
        GRAD("dx", e.x, g.dx, e.n_y);
        GRAD("ddt", e.dt, g.ddt, n_dt);
        GRAD("dA", e.A, g.dA, (size_t)s->H);
        GRAD("dB", e.Bp, g.dB_proj, n_bc);
        GRAD("dC", e.Cp, g.dC_proj, n_bc);
        GRAD("dD", e.D, g.dD_skip, n_d);
        GRAD("dh0", e.h0, g.dh0, e.n_s);
        if (s->z) GRAD("dz", e.z, g.dz, e.n_y);
        if (s->softplus) GRAD("ddt_bias", e.dt_bias, g.ddt_bias, (size_t)s->H);
#undef GRAD
        /* thread counts bitwise, and the same gradients one at a time */
        linseq_ssd_grads g1 = {.dx = tu_alloc(e.n_y), .dB_proj = tu_alloc(n_bc)};
        for (int threads = 1; threads <= 3; threads++) {
            linseq_exec et = {.chunk_size = 16, .threads = threads};
            CHECK_OK(ls_ssd_backward_isa(&e.p, &et, d_y, d_hT, &g1, test_isa));
            CHECK(tu_same_bits(g.dx, g1.dx, e.n_y) && tu_same_bits(g.dB_proj, g1.dB_proj, n_bc),
                  "spec %zu: %d threads, or fewer gradients asked, change dx or dB", i, threads);
        }
        free(g1.dx), free(g1.dB_proj);
        free(g.dx), free(g.ddt), free(g.dA), free(g.dB_proj), free(g.dC_proj), free(g.dD_skip);
        free(g.dz), free(g.dh0), free(g.ddt_bias), free(d_y), free(d_hT);
        ssd_fixture_free(&e);
    }
}

/* ---- invalid arguments ----------------------------------------------------------------- */

static void test_bad_inputs(void)
{
    ssd_fixture e;
    ssd_fixture_make(&e, &specs[1], 17);
    float *y = tu_alloc(e.n_y), *hT = tu_alloc(e.n_s);
    linseq_ssd_problem p = e.p;
    p.G = 3;
    CHECK_FAILS(linseq_ssd_forward(&p, NULL, y, hT), LINSEQ_ERR_SHAPE_MISMATCH, "G = 3");
    p = e.p, p.dt_bias = e.A;
    CHECK_FAILS(linseq_ssd_forward(&p, NULL, y, hT), LINSEQ_ERR_INVALID_VALUE, "dt_bias");
    p = e.p, p.dt_min = 1.0f, p.dt_max = 0.5f;
    CHECK_FAILS(linseq_ssd_forward(&p, NULL, y, hT), LINSEQ_ERR_INVALID_VALUE, "dt_min");
    p = e.p, p.dt_max = NAN;
    CHECK_FAILS(linseq_ssd_forward(&p, NULL, y, hT), LINSEQ_ERR_INVALID_VALUE, "dt_max");
    e.A[1] = 0.5f;
    CHECK_FAILS(linseq_ssd_forward(&e.p, NULL, y, hT), LINSEQ_ERR_INVALID_VALUE, "A[1]");
    e.A[1] = -1.0f;
    p = e.p, p.P = 0;
    CHECK_FAILS(linseq_ssd_forward(&p, NULL, y, hT), LINSEQ_ERR_INVALID_SIZE, "P");
    CHECK_FAILS(linseq_ssd_forward(&e.p, NULL, y, e.x), LINSEQ_ERR_ALIASING, "hT");
    CHECK_FAILS(linseq_ssd_backward(&e.p, NULL, y, NULL, NULL), LINSEQ_ERR_NULL_POINTER, "grads");
    linseq_ssd_grads g = {0};
    CHECK_FAILS(linseq_ssd_backward(&e.p, NULL, NULL, NULL, &g), LINSEQ_ERR_NULL_POINTER, "d_y");
    CHECK_OK(linseq_ssd_forward(&e.p, NULL, y, hT));
    CHECK(linseq_last_error()[0] == '\0', "a success left the message \"%s\"", linseq_last_error());
    free(y), free(hT);
    ssd_fixture_free(&e);
}

/* The numeric tests, through ls_ssd_*_isa with this ISA. */
static void numeric_tests(ls_isa isa)
{
    test_isa = isa;
    test_against_reference();
    test_decode_steps();
    test_decode_rows();
    test_decode_bf16_rows_extremes();
    test_in_place_and_threads();
    test_backward();
}

int main(void)
{
    ssd_each_isa("ssd", numeric_tests,
                 "vs the double reference, decode, in place, threads, gradients");
    test_bad_inputs();
    return tu_finish("test_ssd");
}
