/* Decode over a pool of state rows (linseq_ssm1_decode, linseq_conv1d_decode): each request
 * advances the row it names, in place, as a forward from that row would (checked bitwise) and
 * within float32 rounding of the double reference (conv: the shift register and the circular
 * buffer of cache_seqlens); padding requests (negative rows) get y = 0 and
 * touch no state; rows nobody names are never written; every argument is validated (named in
 * the message, nothing written). On every ISA the CPU has. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half_float.h"
#include "rows_pool.h"
#include "simd/isa.h"
#include "ssm/ssm_internal.h"
#include "testutil.h"

static ls_isa test_isa = LS_ISA_SCALAR;

typedef struct pool_case {
    int64_t B, D, N, G, n_rows;
    linseq_ssm1_problem p; /* T = 1, h0 NULL */
    float *x, *dt, *A, *Bp, *Cp, *Dk, *gate, *bias, *pool;
    size_t row_floats;
} pool_case;

static void pool_make(pool_case *c, int64_t B, int64_t D, int64_t N, int64_t G, int64_t n_rows,
                      uint64_t seed)
{
    tu_rng rng = {seed};
    memset(c, 0, sizeof *c);
    c->B = B, c->D = D, c->N = N, c->G = G, c->n_rows = n_rows;
    c->row_floats = (size_t)(D * N);
    c->x = tu_alloc((size_t)(B * D)), c->dt = tu_alloc((size_t)(B * D));
    c->gate = tu_alloc((size_t)(B * D));
    c->Bp = tu_alloc((size_t)(B * G * N)), c->Cp = tu_alloc((size_t)(B * G * N));
    c->A = tu_alloc((size_t)(D * N)), c->Dk = tu_alloc((size_t)D), c->bias = tu_alloc((size_t)D);
    c->pool = tu_alloc((size_t)n_rows * c->row_floats);
    tu_fill_normal(&rng, c->x, (size_t)(B * D), 1.0);
    tu_fill_normal(&rng, c->dt, (size_t)(B * D), 1.0);
    tu_fill_normal(&rng, c->gate, (size_t)(B * D), 1.0);
    tu_fill_normal(&rng, c->Bp, (size_t)(B * G * N), 1.0);
    tu_fill_normal(&rng, c->Cp, (size_t)(B * G * N), 1.0);
    tu_fill_uniform(&rng, c->A, (size_t)(D * N), -4.0, -0.1);
    tu_fill_normal(&rng, c->Dk, (size_t)D, 1.0);
    tu_fill_uniform(&rng, c->bias, (size_t)D, -6.0, -2.0);
    tu_fill_normal(&rng, c->pool, (size_t)n_rows * c->row_floats, 0.5);
    c->p = (linseq_ssm1_problem){.B = B,
                                 .T = 1,
                                 .D = D,
                                 .N = N,
                                 .G = G,
                                 .x = c->x,
                                 .dt = c->dt,
                                 .A = c->A,
                                 .B_proj = c->Bp,
                                 .C_proj = c->Cp,
                                 .D_skip = c->Dk,
                                 .gate = c->gate,
                                 .dt_softplus = true,
                                 .dt_bias = c->bias};
}

static void pool_free(pool_case *c)
{
    float *all[] = {c->x, c->dt, c->gate, c->Bp, c->Cp, c->A, c->Dk, c->bias, c->pool};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* Request b alone as a B = 1 problem (its token's rows of every per-token input). */
static linseq_ssm1_problem request(const pool_case *c, int64_t b)
{
    linseq_ssm1_problem q = c->p;
    q.B = 1;
    q.x_strides = (linseq_strides){0, 0, 0, 0}; /* c->x holds every layout's values densely */
    q.x = c->x + b * c->D, q.dt = c->dt + b * c->D, q.gate = c->gate + b * c->D;
    q.B_proj = c->Bp + b * c->G * c->N, q.C_proj = c->Cp + b * c->G * c->N;
    return q;
}

/* One decode call against a one-token forward per request from a copy of the pool, and the
 * double reference; rows not named unchanged. */
static void check_decode(pool_case *c, const int64_t *rows, const char *what)
{
    const int64_t B = c->B, D = c->D;
    const size_t pool_floats = (size_t)c->n_rows * c->row_floats;
    float *before = tu_alloc(pool_floats), *y = tu_alloc_poisoned((size_t)(B * D));
    memcpy(before, c->pool, pool_floats * sizeof(float));
    const linseq_exec ex = {.threads = 3};
    CHECK_OK(ls_ssm1_decode_isa(&c->p, &ex, c->pool, c->n_rows, rows, y, test_isa));

    bool *named = calloc((size_t)c->n_rows, sizeof *named);
    float *y1 = tu_alloc((size_t)D), *h1 = tu_alloc(c->row_floats);
    double *yd = malloc((size_t)D * sizeof *yd), *hd = malloc(c->row_floats * sizeof *hd);
    for (int64_t b = 0; b < B; b++) {
        const int64_t row = rows ? rows[b] : b;
        if (row < 0) {
            bool zero = true;
            for (int64_t d = 0; d < D; d++) zero = zero && y[b * D + d] == 0.0f;
            CHECK(zero, "%s %s: padding request %lld: y is not 0", ls_isa_name(test_isa), what,
                  (long long)b);
            continue;
        }
        named[row] = true;
        linseq_ssm1_problem q = request(c, b);
        q.h0 = before + (size_t)row * c->row_floats;
        CHECK_OK(ls_ssm1_forward_isa(&q, NULL, y1, h1, test_isa));
        CHECK(tu_same_bits(y1, y + b * D, (size_t)D) &&
                  tu_same_bits(h1, c->pool + (size_t)row * c->row_floats, c->row_floats),
              "%s %s: request %lld (row %lld) differs from its one-token forward",
              ls_isa_name(test_isa), what, (long long)b, (long long)row);
        CHECK_OK(ls_ssm1_reference_f64(&q, yd, hd));
        const double ey = tu_rel_err_d(y + b * D, yd, (size_t)D);
        const double eh = tu_rel_err_d(c->pool + (size_t)row * c->row_floats, hd, c->row_floats);
        CHECK(ey < 2e-5 && eh < 2e-5,
              "%s %s: request %lld vs the double reference: y %.2e, "
              "state %.2e",
              ls_isa_name(test_isa), what, (long long)b, ey, eh);
    }
    for (int64_t r = 0; r < c->n_rows; r++)
        if (!named[r])
            CHECK(tu_same_bits(c->pool + (size_t)r * c->row_floats,
                               before + (size_t)r * c->row_floats, c->row_floats),
                  "%s %s: row %lld was not named but changed", ls_isa_name(test_isa), what,
                  (long long)r);
    free(before), free(y), free(named), free(y1), free(h1), free(yd), free(hd);
}

static void test_pools(void)
{
    pool_case c;
    /* rows out of order, a padding request, rows not named; D spans two blocks, groups too */
    pool_make(&c, 5, 96, 16, 3, 9, 11);
    const int64_t rows[] = {7, -1, 0, 3, 8};
    check_decode(&c, rows, "state_rows {7,-1,0,3,8}");
    check_decode(&c, rows, "the same rows again (states advanced in place)");
    check_decode(&c, NULL, "state_rows NULL (rows 0 .. B-1)");
    /* every request padding: nothing at all changes */
    const int64_t none[] = {-1, -5, -1, -2, -1};
    check_decode(&c, none, "every request padding");
    pool_free(&c);
    /* N not a multiple of the vector width, one group */
    pool_make(&c, 3, 40, 5, 1, 4, 12);
    const int64_t rows2[] = {2, 0, 3};
    check_decode(&c, rows2, "N = 5");
    /* channel_first and x as a transposed [D,B] view: with T = 1 y is [B,D] either way */
    float *x_view = tu_alloc((size_t)(c.B * c.D));
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t d = 0; d < c.D; d++) x_view[d * c.B + b] = c.x[b * c.D + d];
    c.p.channel_first = true;
    c.p.x = x_view;
    c.p.x_strides = (linseq_strides){1, 0, c.B, 0};
    check_decode(&c, rows2, "channel_first, x a [D,B] view");
    free(x_view);
    pool_free(&c);
}

/* ---- validation --------------------------------------------------------------------- */

static void expect_fail(pool_case *c, const linseq_ssm1_problem *p, int64_t n_rows,
                        const int64_t *rows, float *state, float *y, linseq_status want,
                        const char *needle)
{
    const size_t pool_floats = (size_t)c->n_rows * c->row_floats;
    float *before = tu_alloc(pool_floats);
    memcpy(before, c->pool, pool_floats * sizeof(float));
    float *y_before = tu_alloc((size_t)(c->B * c->D));
    if (y) memcpy(y_before, y, (size_t)(c->B * c->D) * sizeof(float));
    const linseq_status st = linseq_ssm1_decode(p, NULL, state, n_rows, rows, y);
    CHECK(st == want, "%s: got %s, expected %s (%s)", needle, linseq_status_string(st),
          linseq_status_string(want), linseq_last_error());
    CHECK(strstr(linseq_last_error(), needle) != NULL, "message '%s' does not name '%s'",
          linseq_last_error(), needle);
    CHECK(tu_same_bits(c->pool, before, pool_floats), "%s: the pool changed on error", needle);
    CHECK(!y || tu_same_bits(y, y_before, (size_t)(c->B * c->D)), "%s: y changed on error", needle);
    free(before), free(y_before);
}

static void test_bad_inputs(void)
{
    pool_case c;
    pool_make(&c, 3, 16, 4, 1, 4, 13);
    float *y = tu_alloc_poisoned((size_t)(3 * 16));
    float *pool = c.pool;
    const int64_t ok_rows[] = {0, 1, 2};
    linseq_ssm1_problem q = c.p;
    q.T = 2;
    expect_fail(&c, &q, 4, ok_rows, pool, y, LINSEQ_ERR_INVALID_SIZE, "T = 2");
    q = c.p;
    q.h0 = pool;
    expect_fail(&c, &q, 4, ok_rows, pool, y, LINSEQ_ERR_INVALID_VALUE, "h0");
    const int64_t cu[] = {0, 1};
    q = c.p;
    q.B = 1, q.cu_seqlens = cu, q.n_seqs = 1;
    expect_fail(&c, &q, 4, ok_rows, pool, y, LINSEQ_ERR_INVALID_VALUE, "cu_seqlens");
    expect_fail(&c, &c.p, 0, ok_rows, pool, y, LINSEQ_ERR_INVALID_SIZE, "n_state_rows");
    expect_fail(&c, &c.p, 2, NULL, pool, y, LINSEQ_ERR_SHAPE_MISMATCH, "n_state_rows = 2 < B");
    const int64_t past[] = {0, 4, 1};
    expect_fail(&c, &c.p, 4, past, pool, y, LINSEQ_ERR_INVALID_VALUE, "state_rows[1] = 4");
    const int64_t twice[] = {2, 0, 2};
    expect_fail(&c, &c.p, 4, twice, pool, y, LINSEQ_ERR_INVALID_VALUE, "names row 2 twice");
    expect_fail(&c, &c.p, 4, ok_rows, NULL, y, LINSEQ_ERR_NULL_POINTER, "'state'");
    expect_fail(&c, &c.p, 4, ok_rows, pool, NULL, LINSEQ_ERR_NULL_POINTER, "'y'");
    /* the pool over an input, y over the pool, state_rows inside the pool */
    q = c.p;
    q.x = pool + 5;
    expect_fail(&c, &q, 4, ok_rows, pool, y, LINSEQ_ERR_ALIASING, "'state' overlaps input 'x'");
    expect_fail(&c, &c.p, 4, ok_rows, pool, pool + 8, LINSEQ_ERR_ALIASING, "overlaps output 'y'");
    expect_fail(&c, &c.p, 4, (const int64_t *)(void *)pool, pool, y, LINSEQ_ERR_ALIASING,
                "state_rows");
    free(y);
    pool_free(&c);
}

/* ---- conv1d decode ------------------------------------------------------------------- */

typedef struct conv_pool {
    linseq_conv1d_problem p; /* B requests, T new tokens, no conv_state */
    float *x, *weight, *bias, *pool;
    int64_t n_rows, L;
} conv_pool;

static void conv_pool_make(conv_pool *c, int64_t B, int64_t T, int64_t D, int64_t W, int64_t L,
                           int64_t n_rows, uint64_t seed)
{
    tu_rng rng = {seed};
    memset(c, 0, sizeof *c);
    c->n_rows = n_rows, c->L = L;
    c->x = tu_alloc((size_t)(B * T * D)), c->weight = tu_alloc((size_t)(D * W));
    c->bias = tu_alloc((size_t)D), c->pool = tu_alloc((size_t)(n_rows * D * L));
    tu_fill_normal(&rng, c->x, (size_t)(B * T * D), 1.0);
    tu_fill_uniform(&rng, c->weight, (size_t)(D * W), -0.5, 0.5);
    tu_fill_uniform(&rng, c->bias, (size_t)D, -0.5, 0.5);
    tu_fill_normal(&rng, c->pool, (size_t)(n_rows * D * L), 1.0);
    c->p = (linseq_conv1d_problem){.B = B,
                                   .T = T,
                                   .D = D,
                                   .W = W,
                                   .x = c->x,
                                   .weight = c->weight,
                                   .bias = c->bias,
                                   .activation = LINSEQ_ACT_SILU};
}

static void conv_pool_free(conv_pool *c)
{
    free(c->x), free(c->weight), free(c->bias), free(c->pool);
}

/* One decode call against the double reference on a copy of the pool: y within float32
 * rounding, the pool (copies only) bitwise; rows not named unchanged. */
static void check_conv_decode(conv_pool *c, const int64_t *rows, const int64_t *cache,
                              const char *what)
{
    const linseq_conv1d_problem *p = &c->p;
    const int64_t B = p->B, T = p->T, D = p->D;
    const size_t pool_floats = (size_t)(c->n_rows * D * c->L), n_y = (size_t)(B * T * D);
    float *expect_pool = tu_alloc(pool_floats), *y = tu_alloc_poisoned(n_y);
    float *y_tm = tu_alloc(n_y);
    double *y_ref = malloc(n_y * sizeof *y_ref);
    memcpy(expect_pool, c->pool, pool_floats * sizeof(float));
    CHECK_OK(ls_conv1d_decode_reference(p, expect_pool, c->L, rows, cache, y_ref));
    const linseq_exec ex = {.threads = 2};
    CHECK_OK(ls_conv1d_decode_isa(p, &ex, c->pool, c->n_rows, c->L, rows, cache, y, test_isa));
    /* y in the problem's layout -> token-major */
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t d = 0; d < D; d++)
                y_tm[(b * T + t) * D + d] =
                    p->channel_first ? y[(b * D + d) * T + t] : y[(b * T + t) * D + d];
    const double err = tu_rel_err_d(y_tm, y_ref, n_y);
    CHECK(err < 2e-6, "%s conv %s: y vs the double reference %.2e", ls_isa_name(test_isa), what,
          err);
    CHECK(tu_same_bits(c->pool, expect_pool, pool_floats),
          "%s conv %s: the pool differs from the reference's (rows named, shifted or written "
          "circularly; the others untouched)",
          ls_isa_name(test_isa), what);
    free(expect_pool), free(y), free(y_tm), free(y_ref);
}

/* A shift-register step with state_len = W-1 is the forward from conv_state = the row: the
 * same bits for y and for the new state (conv_state_out). */
static void check_conv_decode_is_forward(conv_pool *c, const int64_t *rows)
{
    const linseq_conv1d_problem *p = &c->p;
    const int64_t B = p->B, T = p->T, D = p->D, W = p->W;
    const size_t row_floats = (size_t)(D * (W - 1));
    float *before = tu_alloc((size_t)c->n_rows * row_floats);
    memcpy(before, c->pool, (size_t)c->n_rows * row_floats * sizeof(float));
    float *y = tu_alloc_poisoned((size_t)(B * T * D));
    CHECK_OK(ls_conv1d_decode_isa(p, NULL, c->pool, c->n_rows, W - 1, rows, NULL, y, test_isa));
    float *y1 = tu_alloc((size_t)(T * D)), *s1 = tu_alloc(row_floats);
    for (int64_t b = 0; b < B; b++) {
        if (rows[b] < 0) continue;
        linseq_conv1d_problem q = *p;
        q.B = 1, q.x = c->x + b * T * D, q.conv_state = before + rows[b] * (int64_t)row_floats;
        CHECK_OK(ls_conv1d_forward_isa(&q, NULL, y1, s1, test_isa));
        CHECK(tu_same_bits(y1, y + b * T * D, (size_t)(T * D)) &&
                  tu_same_bits(s1, c->pool + rows[b] * (int64_t)row_floats, row_floats),
              "%s conv decode request %lld differs from the forward from its state",
              ls_isa_name(test_isa), (long long)b);
    }
    free(before), free(y), free(y1), free(s1);
}

static void test_conv_pools(void)
{
    conv_pool c;
    const int64_t rows[] = {4, -1, 0, 2};
    /* state_len = W-1, one token and three tokens: the forward's bits */
    conv_pool_make(&c, 4, 1, 80, 4, 3, 6, 21);
    check_conv_decode_is_forward(&c, rows);
    conv_pool_free(&c);
    conv_pool_make(&c, 4, 3, 80, 4, 3, 6, 22);
    check_conv_decode_is_forward(&c, rows);
    conv_pool_free(&c);
    /* longer states, shift register and circular buffer, against the reference */
    conv_pool_make(&c, 4, 3, 70, 4, 7, 6, 23);
    check_conv_decode(&c, rows, NULL, "shift register, state_len 7, T 3");
    check_conv_decode(&c, NULL, NULL, "shift register, state_rows NULL");
    const int64_t cache[] = {0, 5, 6, 7 * 5 + 2};
    check_conv_decode(&c, rows, cache, "circular, cache_seqlens {0,5,6,37}");
    const int64_t cache2[] = {1, 1, 3, 13};
    check_conv_decode(&c, rows, cache2, "circular again");
    const int64_t none[] = {-1, -1, -3, -1};
    check_conv_decode(&c, none, cache, "every request padding");
    conv_pool_free(&c);
    /* more new tokens than the state holds */
    conv_pool_make(&c, 4, 9, 40, 3, 4, 6, 24);
    check_conv_decode(&c, rows, NULL, "shift register, T 9 > state_len 4");
    check_conv_decode(&c, rows, cache, "circular, T 9 > state_len 4");
    conv_pool_free(&c);
    /* channel_first x and y, and x a strided view; W = 1 (no window) */
    conv_pool_make(&c, 4, 2, 70, 4, 5, 6, 25);
    float *x_cf = tu_alloc((size_t)(4 * 2 * 70));
    for (int64_t b = 0; b < 4; b++)
        for (int64_t t = 0; t < 2; t++)
            for (int64_t d = 0; d < 70; d++) x_cf[(b * 70 + d) * 2 + t] = c.x[(b * 2 + t) * 70 + d];
    c.p.x = x_cf, c.p.channel_first = true;
    check_conv_decode(&c, rows, cache, "channel_first");
    c.p.channel_first = false;
    c.p.x_strides = (linseq_strides){70 * 2, 1, 2, 0};
    check_conv_decode(&c, rows, NULL, "x a transposed view");
    free(x_cf);
    conv_pool_free(&c);
    conv_pool_make(&c, 4, 2, 33, 1, 1, 6, 26);
    check_conv_decode(&c, rows, cache, "W = 1");
    conv_pool_free(&c);
    /* one token, no cache_seqlens (its own path): ragged channel blocks, the common width
     * (state_len W-1, and W: transformers' rows) and others, a longer state, W = 1,
     * channel_first x, no bias */
    static const int64_t one_token[][3] = {
        {4, 3, 70}, {4, 4, 35}, {3, 6, 37}, {5, 4, 21}, {1, 1, 18}};
    for (size_t i = 0; i < sizeof one_token / sizeof one_token[0]; i++) {
        const int64_t W = one_token[i][0], L = one_token[i][1], D = one_token[i][2];
        char what[64];
        conv_pool_make(&c, 4, 1, D, W, L, 6, 30 + i);
        snprintf(what, sizeof what, "one token, W %lld, state_len %lld, D %lld", (long long)W,
                 (long long)L, (long long)D);
        check_conv_decode(&c, rows, NULL, what);
        if (L == W - 1) check_conv_decode_is_forward(&c, rows);
        c.p.channel_first = true; /* with T = 1 the layouts hold the same floats */
        c.p.bias = NULL;
        check_conv_decode(&c, rows, NULL, "one token, channel_first, no bias");
        conv_pool_free(&c);
    }
}

/* Tap-major rows (states) and a [W,D] weight (weights) hold the same values in another
 * order: a decode over them gives the bits of the decode in the default layouts for y, and
 * that pool's new rows transposed; 1 and 3 threads (the one-token step over tap-major rows
 * runs by channel spans over every request). Then the double reference and the forward from
 * each row, in those layouts. */
static void check_conv_layouts(conv_pool *c, const int64_t *rows, const int64_t *cache,
                               const char *what, bool states, bool weights)
{
    const int64_t B = c->p.B, T = c->p.T, D = c->p.D, L = c->L;
    const size_t pool_floats = (size_t)(c->n_rows * D * L), n_y = (size_t)(B * T * D);
    float *ref_pool = tu_alloc(pool_floats), *tm_pool = tu_alloc(pool_floats);
    float *back = tu_alloc(pool_floats), *y_ref = tu_alloc(n_y), *y = tu_alloc_poisoned(n_y);
    float *weight = tu_alloc((size_t)(D * c->p.W));
    tu_tap_layout(weight, c->weight, 1, D, c->p.W, weights, false);
    linseq_conv1d_problem tm = c->p;
    tm.state_tap_major = states, tm.weight_tap_major = weights, tm.weight = weight;
    for (int threads = 1; threads <= 3; threads += 2) {
        const linseq_exec ex = {.threads = threads};
        memcpy(ref_pool, c->pool, pool_floats * sizeof(float));
        tu_tap_layout(tm_pool, c->pool, c->n_rows, D, L, states, false);
        CHECK_OK(
            ls_conv1d_decode_isa(&c->p, &ex, ref_pool, c->n_rows, L, rows, cache, y_ref, test_isa));
        CHECK_OK(ls_conv1d_decode_isa(&tm, &ex, tm_pool, c->n_rows, L, rows, cache, y, test_isa));
        tu_tap_layout(back, tm_pool, c->n_rows, D, L, states, true);
        CHECK(tu_same_bits(y, y_ref, n_y) && tu_same_bits(back, ref_pool, pool_floats),
              "%s conv %s, tap-major states %d weight %d, %d threads: differs from the default "
              "layouts'",
              ls_isa_name(test_isa), what, states, weights, threads);
    }
    conv_pool tc = *c;
    tc.p = tm;
    check_conv_decode(&tc, rows, cache, what);
    if (rows && !cache && L == c->p.W - 1 && c->p.W > 1 && !c->p.channel_first)
        check_conv_decode_is_forward(&tc, rows);
    free(ref_pool), free(tm_pool), free(back), free(y_ref), free(y), free(weight);
}

static void check_conv_tap_major(conv_pool *c, const int64_t *rows, const int64_t *cache,
                                 const char *what)
{
    for (int layouts = 1; layouts < 4; layouts++)
        check_conv_layouts(c, rows, cache, what, layouts & 1, layouts & 2);
}

static void test_conv_tap_major(void)
{
    conv_pool c;
    const int64_t rows[] = {4, -1, 0, 2}, cache[] = {0, 5, 6, 7 * 5 + 2};
    /* one token: the span path (D past one span of channels, ragged; W 4 and others); then
     * several tokens, a circular buffer, channel_first x */
    static const int64_t shapes[][4] = {{1, 4, 3, 300}, {1, 3, 6, 37}, {1, 5, 4, 21},
                                        {1, 1, 1, 18},  {3, 4, 7, 70}, {9, 3, 4, 40}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t T = shapes[i][0], W = shapes[i][1], L = shapes[i][2], D = shapes[i][3];
        char what[80];
        conv_pool_make(&c, 4, T, D, W, L, 6, 40 + i);
        snprintf(what, sizeof what, "T %lld, W %lld, state_len %lld, D %lld", (long long)T,
                 (long long)W, (long long)L, (long long)D);
        check_conv_tap_major(&c, rows, NULL, what);
        check_conv_tap_major(&c, NULL, NULL, what);
        check_conv_tap_major(&c, rows, cache, what);
        if (T == 1) {
            c.p.channel_first = true; /* T = 1: x's floats are the same */
            c.p.bias = NULL;
            check_conv_tap_major(&c, rows, NULL, "one token, channel_first, no bias");
        }
        conv_pool_free(&c);
    }
}

/* The serving step (one token, tap-major states and weight): bfloat16 x and y give the
 * float32 step's y on the widened x rounded once and its states bit for bit; over a serving
 * engine's rows (ls_conv1d_decode_rows_isa: float32 or bf16 rows a stride apart, one request
 * moved to another row, one in place, one padding) the rows are the float32 step's, rounded
 * once, in the destination rows only. 1 and 3 threads; D past one span, ragged. */
static void test_conv_serving_step(void)
{
    enum { B = 3, W = 4, L = 3, N_ROWS = 6, GAP = 5 };
    const int64_t D = 300, row = L * D;
    static const int64_t src[B] = {4, -1, 1}, dst[B] = {5, -1, 1};
    conv_pool c;
    conv_pool_make(&c, B, 1, D, W, L, N_ROWS, 77);
    float *weight = tu_alloc((size_t)(D * W));
    tu_tap_layout(weight, c.weight, 1, D, W, true, false);
    c.p.state_tap_major = c.p.weight_tap_major = true, c.p.weight = weight;
    uint16_t *x16 = malloc((size_t)(B * D) * sizeof *x16), *y16 = malloc((size_t)(B * D) * 2);
    float *x_wide = tu_alloc((size_t)(B * D)), *y_ref = tu_alloc((size_t)(B * D));
    for (int64_t i = 0; i < B * D; i++) x_wide[i] = ls_bf16_to_f32(x16[i] = ls_f32_to_bf16(c.x[i]));
    for (int threads = 1; threads <= 3; threads += 2)
        for (int dtype = LINSEQ_POOL_F32; dtype <= LINSEQ_POOL_BF16; dtype++) {
            rows_pool pool;
            rows_pool_make(&pool, (linseq_pool_dtype)dtype, N_ROWS, row, GAP, 3);
            linseq_conv1d_problem f32 = c.p, bf = c.p;
            f32.x = x_wide, bf.x = (const float *)(void *)x16;
            const linseq_exec ex = {.threads = threads},
                              ex16 = {.threads = threads, .dtype = LINSEQ_DTYPE_BF16};
            CHECK_OK(
                ls_conv1d_decode_isa(&f32, &ex, pool.dense, N_ROWS, L, src, NULL, y_ref, test_isa));
            const ls_state_rows rows = rows_pool_rows(&pool, src, dst);
            memset(y16, 0xff, (size_t)(B * D) * 2);
            CHECK_OK(ls_conv1d_decode_rows_isa(&bf, &ex16, &rows, N_ROWS, (float *)(void *)y16,
                                               test_isa));
            bool ok = rows_pool_holds(&pool, pool.dense, src, dst, B);
            for (int64_t i = 0; i < B * D; i++) ok &= y16[i] == ls_f32_to_bf16(y_ref[i]);
            CHECK(ok,
                  "%s conv serving step, %s rows, bf16 x and y, %d threads: differs from the "
                  "float32 step rounded once",
                  ls_isa_name(test_isa), dtype ? "bf16" : "f32", threads);
            rows_pool_free(&pool);
        }
    /* the plain decode on a float32 pool takes bf16 x and y too, with the same bits */
    float *pool32 = tu_alloc((size_t)(N_ROWS * row)), *pool16 = tu_alloc((size_t)(N_ROWS * row));
    tu_tap_layout(pool32, c.pool, N_ROWS, D, L, true, false);
    memcpy(pool16, pool32, (size_t)(N_ROWS * row) * sizeof(float));
    linseq_conv1d_problem f32 = c.p, bf = c.p;
    f32.x = x_wide, bf.x = (const float *)(void *)x16;
    const linseq_exec ex16 = {.dtype = LINSEQ_DTYPE_BF16};
    CHECK_OK(ls_conv1d_decode_isa(&f32, NULL, pool32, N_ROWS, L, src, NULL, y_ref, test_isa));
    CHECK_OK(ls_conv1d_decode_isa(&bf, &ex16, pool16, N_ROWS, L, src, NULL, (float *)(void *)y16,
                                  test_isa));
    bool same = tu_same_bits(pool16, pool32, (size_t)(N_ROWS * row));
    for (int64_t i = 0; i < B * D; i++) same &= y16[i] == ls_f32_to_bf16(y_ref[i]);
    CHECK(same,
          "%s conv decode, bf16 x and y over a float32 pool: differs from the float32 "
          "step rounded once",
          ls_isa_name(test_isa));
    /* bf16 x and y outside the serving step: refused by name, nothing written */
    bf.state_tap_major = false;
    memcpy(pool16, pool32, (size_t)(N_ROWS * row) * sizeof(float));
    CHECK(ls_conv1d_decode_isa(&bf, &ex16, pool16, N_ROWS, L, src, NULL, (float *)(void *)y16,
                               test_isa) == LINSEQ_ERR_UNSUPPORTED &&
              strstr(linseq_last_error(), "state_tap_major") &&
              tu_same_bits(pool16, pool32, (size_t)(N_ROWS * row)),
          "conv decode, bf16 x over channel-major states: not refused by name ('%s')",
          linseq_last_error());
    free(pool32), free(pool16);
    free(x16), free(y16), free(x_wide), free(y_ref), free(weight);
    conv_pool_free(&c);
}

/* The serving step over bf16 rows moves each kept input and the new one as a store of its
 * widened value would (the kernel moves their bits and quiets a NaN): every bf16 bit pattern
 * in the rows, signalling NaNs, infinities and subnormals included, and x's patterns. */
static void test_conv_bf16_rows_every_value(void)
{
    enum { B = 84, W = 4, L = 3, D = 261 }; /* B * L * D >= 65536; D: two spans and a ragged one */
    const int64_t row = L * D, n = B * row;
    uint16_t *data = malloc((size_t)n * 2), *before = malloc((size_t)n * 2);
    uint16_t *x16 = malloc((size_t)(B * D) * 2), *y16 = malloc((size_t)(B * D) * 2);
    float *weight = tu_alloc((size_t)(W * D)), *bias = tu_alloc((size_t)D);
    int64_t rows[B];
    for (int64_t i = 0; i < n; i++) data[i] = before[i] = (uint16_t)i;
    for (int64_t i = 0; i < B * D; i++) x16[i] = (uint16_t)(0x7f81 + i * 7919);
    for (int64_t b = 0; b < B; b++) rows[b] = b;
    const linseq_conv1d_problem p = {.B = B,
                                     .T = 1,
                                     .D = D,
                                     .W = W,
                                     .x = (const float *)(void *)x16,
                                     .weight = weight,
                                     .bias = bias,
                                     .activation = LINSEQ_ACT_SILU,
                                     .state_tap_major = true,
                                     .weight_tap_major = true};
    const ls_state_rows r = {.from = data,
                             .to = data,
                             .dtype = LINSEQ_POOL_BF16,
                             .stride = row,
                             .src = rows,
                             .dst = rows};
    const linseq_exec ex = {.threads = 1, .dtype = LINSEQ_DTYPE_BF16};
    CHECK_OK(ls_conv1d_decode_rows_isa(&p, &ex, &r, B, (float *)(void *)y16, test_isa));
    int64_t bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t d = 0; d < D; d++) {
                const uint16_t moved =
                    i + 1 < L ? before[b * row + (i + 1) * D + d] : x16[b * D + d];
                bad += data[b * row + i * D + d] != ls_f32_to_bf16(ls_bf16_to_f32(moved));
            }
    CHECK(bad == 0,
          "%s conv serving step over bf16 rows: %lld state elements are not the "
          "widened value rounded",
          ls_isa_name(test_isa), (long long)bad);
    free(data), free(before), free(x16), free(y16), free(weight), free(bias);
}

/* float32 bit patterns of every kind: every exponent (NaNs and infinities among them), and
 * every 97th a subnormal, every 13th halfway between two bf16; vectors with and without such
 * lanes. */
static void fill_rounding_cases(float *v, int64_t n, uint32_t salt)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = ((uint32_t)i + salt) * 2654435761u;
        if (i % 97 == 5)
            bits &= 0x807fffffu;
        else if (i % 13 == 1)
            bits = (bits & 0xffff0000u) | 0x8000u;
        memcpy(&v[i], &bits, sizeof bits);
    }
}

/* The serving step rounds to bf16 as ls_f32_to_bf16 for every kind of value: ties,
 * subnormals, infinities and NaNs, whole vectors and a ragged edge; on CPUs with AVX512-BF16
 * by its instruction, which flushes a subnormal (a vector holding one takes the integer
 * rounding). Its y with bf16 x (y = bias here: zero taps and window, no activation; the
 * kernels' arithmetic flushes subnormals, core/fp_mode.h, so y = the float32 step's, rounded),
 * and a float32 x moved into bf16 rows (a move, not arithmetic: subnormals kept). */
static void test_conv_bf16_rounding(void)
{
    enum { B = 2, W = 4, L = 3, D = 1037 }; /* several spans and a ragged edge */
    float *weight = tu_alloc((size_t)(W * D)), *bias = tu_alloc((size_t)D);
    float *x32 = tu_alloc((size_t)(B * D)), *y32 = tu_alloc((size_t)(B * D));
    float *pool32 = tu_alloc((size_t)(B * L * D));
    uint16_t *x16 = calloc((size_t)(B * D), 2), *y16 = malloc((size_t)(B * D) * 2);
    uint16_t *pool16 = calloc((size_t)(B * L * D), 2);
    fill_rounding_cases(bias, D, 0);
    static const int64_t rows[B] = {1, 0};
    const linseq_conv1d_problem f32 = {.B = B,
                                       .T = 1,
                                       .D = D,
                                       .W = W,
                                       .x = x32,
                                       .weight = weight,
                                       .bias = bias,
                                       .activation = LINSEQ_ACT_IDENTITY,
                                       .state_tap_major = true,
                                       .weight_tap_major = true};
    linseq_conv1d_problem bf = f32;
    bf.x = (const float *)(void *)x16;
    CHECK_OK(ls_conv1d_decode_isa(&f32, NULL, pool32, B, L, rows, NULL, y32, test_isa));
    const ls_state_rows r = {.from = pool16,
                             .to = pool16,
                             .dtype = LINSEQ_POOL_BF16,
                             .stride = L * D,
                             .src = rows,
                             .dst = rows};
    const linseq_exec ex = {.threads = 1, .dtype = LINSEQ_DTYPE_BF16};
    CHECK_OK(ls_conv1d_decode_rows_isa(&bf, &ex, &r, B, (float *)(void *)y16, test_isa));
    int64_t bad = 0;
    for (int64_t i = 0; i < B * D; i++) bad += y16[i] != ls_f32_to_bf16(y32[i]);
    CHECK(bad == 0, "%s conv serving step: %lld bf16 outputs are not the float32 y rounded once",
          ls_isa_name(test_isa), (long long)bad);
    /* float32 x and y over the bf16 rows: the newest position holds x rounded */
    fill_rounding_cases(x32, B * D, 7);
    const linseq_exec ex32 = {.threads = 1};
    CHECK_OK(ls_conv1d_decode_rows_isa(&f32, &ex32, &r, B, y32, test_isa));
    bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t d = 0; d < D; d++)
            bad += pool16[rows[b] * L * D + (L - 1) * D + d] != ls_f32_to_bf16(x32[b * D + d]);
    CHECK(bad == 0,
          "%s conv serving step, float32 x over bf16 rows: %lld new entries are not x rounded",
          ls_isa_name(test_isa), (long long)bad);
    free(weight), free(bias), free(x32), free(y32), free(pool32);
    free(x16), free(y16), free(pool16);
}

/* Width 1 keeps no window (state_len W - 1 = 0): a decode over a bf16 tap-major pool is
 * refused by name as the float32 one is, and nothing is written. The fuzzer found the step
 * over a serving engine's rows writing the new input one row before the pool. */
static void test_conv_width1_pool_refused(void)
{
    enum { B = 2, D = 20, N_ROWS = 3, AT = 40 };
    float x[B * D], weight[D], y[B * D];
    uint16_t buffer[64], before[64]; /* the pool at buffer + AT, guards around it */
    for (int i = 0; i < B * D; i++) x[i] = 0.25f * (float)(i % 7);
    for (int i = 0; i < D; i++) weight[i] = 0.5f;
    for (int i = 0; i < 64; i++) buffer[i] = before[i] = (uint16_t)(0x3f80 + i);
    const linseq_conv1d_problem p = {.B = B,
                                     .T = 1,
                                     .D = D,
                                     .W = 1,
                                     .x = x,
                                     .weight = weight,
                                     .state_tap_major = true,
                                     .weight_tap_major = true};
    const int64_t src[B] = {0, 2};
    const linseq_state_pool sp = {
        .data = buffer + AT, .n_rows = N_ROWS, .dtype = LINSEQ_POOL_BF16, .src_rows = src};
    float *out[] = {y};
    const linseq_status st = linseq_op_decode_pool("causal_conv1d", &p, NULL, &sp, out);
    const bool untouched = memcmp(buffer, before, sizeof buffer) == 0;
    CHECK(st != LINSEQ_OK && strstr(linseq_last_error(), "state_len") && untouched,
          "conv W = 1 over a bf16 tap-major pool: status %d ('%s'), memory %s", (int)st,
          linseq_last_error(), untouched ? "untouched" : "WRITTEN");
}

static void conv_expect_fail(conv_pool *c, const linseq_conv1d_problem *p, float *state,
                             int64_t n_rows, int64_t L, const int64_t *rows, const int64_t *cache,
                             float *y, linseq_status want, const char *needle)
{
    const size_t pool_floats = (size_t)(c->n_rows * c->p.D * c->L);
    float *before = tu_alloc(pool_floats);
    memcpy(before, c->pool, pool_floats * sizeof(float));
    const linseq_status st = linseq_conv1d_decode(p, NULL, state, n_rows, L, rows, cache, y);
    CHECK(st == want, "conv %s: got %s, expected %s (%s)", needle, linseq_status_string(st),
          linseq_status_string(want), linseq_last_error());
    CHECK(strstr(linseq_last_error(), needle) != NULL, "conv: message '%s' does not name '%s'",
          linseq_last_error(), needle);
    CHECK(tu_same_bits(c->pool, before, pool_floats), "conv %s: the pool changed on error", needle);
    free(before);
}

static void test_conv_bad_inputs(void)
{
    conv_pool c;
    conv_pool_make(&c, 3, 2, 16, 4, 5, 4, 27);
    float *y = tu_alloc((size_t)(3 * 2 * 16)), *pool = c.pool;
    const int64_t rows[] = {0, 1, 2}, cache[] = {0, 4, 9};
    conv_expect_fail(&c, &c.p, NULL, 4, 5, rows, cache, y, LINSEQ_ERR_NULL_POINTER, "'state'");
    conv_expect_fail(&c, &c.p, pool, 4, 5, rows, cache, NULL, LINSEQ_ERR_NULL_POINTER, "'y'");
    conv_expect_fail(&c, &c.p, pool, 4, 2, rows, cache, y, LINSEQ_ERR_INVALID_SIZE,
                     "state_len = 2");
    conv_expect_fail(&c, &c.p, pool, 0, 5, rows, cache, y, LINSEQ_ERR_INVALID_SIZE, "n_state_rows");
    conv_expect_fail(&c, &c.p, pool, 2, 5, NULL, cache, y, LINSEQ_ERR_SHAPE_MISMATCH,
                     "n_state_rows = 2 < B");
    const int64_t past[] = {0, 4, 1}, twice[] = {1, 1, 0}, negative[] = {0, -2, 3};
    conv_expect_fail(&c, &c.p, pool, 4, 5, past, cache, y, LINSEQ_ERR_INVALID_VALUE,
                     "state_rows[1] = 4");
    conv_expect_fail(&c, &c.p, pool, 4, 5, twice, cache, y, LINSEQ_ERR_INVALID_VALUE,
                     "names row 1 twice");
    conv_expect_fail(&c, &c.p, pool, 4, 5, rows, negative, y, LINSEQ_ERR_INVALID_VALUE,
                     "cache_seqlens[1] = -2");
    linseq_conv1d_problem q = c.p;
    q.conv_state = pool;
    conv_expect_fail(&c, &q, pool, 4, 5, rows, cache, y, LINSEQ_ERR_INVALID_VALUE, "conv_state");
    q = c.p;
    q.x = pool + 3;
    conv_expect_fail(&c, &q, pool, 4, 5, rows, cache, y, LINSEQ_ERR_ALIASING,
                     "'state' overlaps input 'x'");
    conv_expect_fail(&c, &c.p, pool, 4, 5, rows, cache, pool + 10, LINSEQ_ERR_ALIASING,
                     "overlaps output 'y'");
    conv_expect_fail(&c, &c.p, pool, 4, 5, rows, (const int64_t *)(void *)(pool + 4), y,
                     LINSEQ_ERR_ALIASING, "cache_seqlens");
    q = c.p;
    q.x_strides = (linseq_strides){32, 16, 1, 2};
    conv_expect_fail(&c, &q, pool, 4, 5, rows, cache, y, LINSEQ_ERR_INVALID_VALUE,
                     "x_strides.state");
    free(y);
    conv_pool_free(&c);
}

int main(void)
{
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) {
            printf("decode pools %s: not available on this CPU, skipped\n",
                   ls_isa_name((ls_isa)isa));
            continue;
        }
        test_isa = (ls_isa)isa;
        const tu_mark mark = tu_mark_now();
        test_pools();
        test_conv_pools();
        test_conv_tap_major();
        test_conv_serving_step();
        test_conv_bf16_rows_every_value();
        test_conv_bf16_rounding();
        tu_mark tally = {0, 0};
        tu_tally_add(&tally, mark);
        char label[64];
        snprintf(label, sizeof label, "ssm1 and conv1d decode pools %s", ls_isa_name(test_isa));
        tu_report(label, tally, "vs one-token forwards and the double reference");
    }
    test_bad_inputs();
    test_conv_bad_inputs();
    test_conv_width1_pool_refused();
    return tu_finish("test_decode_pools");
}
