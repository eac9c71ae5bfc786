/* The EMA (the template op): every ISA's kernel against the double reference, decode == the
 * forward one token at a time, hT == h0 in place, padding requests, thread counts, and the
 * invalid arguments each named. The numeric tests run through ls_ema_*_isa once per ISA the
 * CPU has; the table of invalid arguments goes through the public entry points. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ema/ema.h"
#include "testutil.h"

/* The EMA's definition (docs/semantics.md) in double, one token at a time: y [B,T,D] and
 * hT [B,D], either may be NULL. */
static void ema_reference(const linseq_ema_problem *p, double *y, double *hT)
{
    const int64_t T = p->T, D = p->D;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t d = 0; d < D; d++) {
            const double a = p->a[d];
            double s = p->h0 ? p->h0[b * D + d] : 0.0;
            for (int64_t t = 0; t < T; t++) {
                s = a * s + (1.0 - a) * p->x[(b * T + t) * D + d];
                if (y) y[(b * T + t) * D + d] = s;
            }
            if (hT) hT[b * D + d] = s;
        }
}

static ls_isa test_isa = LS_ISA_SCALAR;

typedef struct ema_data {
    linseq_ema_problem p;
    float *x, *a, *h0;
    size_t n_y, n_s;
} ema_data;

/* Inputs of B, T, D; a in [0, 1] with the ends 0 and 1 present (when D >= 2). */
static ema_data make(int64_t B, int64_t T, int64_t D, bool h0, uint64_t seed)
{
    tu_rng r = {seed};
    ema_data e = {.n_y = (size_t)(B * T * D), .n_s = (size_t)(B * D)};
    e.x = tu_alloc(e.n_y);
    e.a = tu_alloc((size_t)D);
    tu_fill_normal(&r, e.x, e.n_y, 1.0);
    tu_fill_uniform(&r, e.a, (size_t)D, 0.0, 1.0);
    if (D >= 2) e.a[0] = 0.0f, e.a[D - 1] = 1.0f;
    if (h0) {
        e.h0 = tu_alloc(e.n_s);
        tu_fill_normal(&r, e.h0, e.n_s, 1.0);
    }
    e.p = (linseq_ema_problem){.B = B, .T = T, .D = D, .x = e.x, .a = e.a, .h0 = e.h0};
    return e;
}

static void drop(ema_data *e) { free(e->x), free(e->a), free(e->h0); }

static void test_against_reference(void)
{
    static const struct {
        int64_t B, T, D;
        bool h0;
    } specs[] = {{1, 1, 1, true},
                 {2, 7, 5, false},
                 {3, 33, 70, true},
                 {2, 40, 131, true},
                 {1, 3, 64, false}};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        ema_data e = make(specs[i].B, specs[i].T, specs[i].D, specs[i].h0, 100 + i);
        float *y = tu_alloc_poisoned(e.n_y), *hT = tu_alloc_poisoned(e.n_s);
        double *ry = malloc(e.n_y * sizeof(double)), *rh = malloc(e.n_s * sizeof(double));
        CHECK_OK(ls_ema_forward_isa(&e.p, NULL, y, hT, test_isa));
        ema_reference(&e.p, ry, rh);
        const double ey = tu_rel_err_d(y, ry, e.n_y), eh = tu_rel_err_d(hT, rh, e.n_s);
        CHECK(ey < 1e-5 && eh < 1e-5, "spec %zu: error y %.2e, hT %.2e vs the reference", i, ey,
              eh);
        /* without hT the same y */
        float *y2 = tu_alloc_poisoned(e.n_y);
        CHECK_OK(ls_ema_forward_isa(&e.p, NULL, y2, NULL, test_isa));
        CHECK(tu_same_bits(y, y2, e.n_y), "spec %zu: y differs without hT", i);
        free(y), free(hT), free(y2), free(ry), free(rh);
        drop(&e);
    }
}

/* Decode over a pool with mapped rows (and one padding request), one token at a time, gives
 * the bits of one forward call; rows not named stay untouched. */
static void test_decode_steps(void)
{
    const int64_t B = 3, T = 9, D = 70, n_rows = 6;
    const int64_t rows[] = {4, -1, 1}; /* request 1 is padding */
    ema_data e = make(B, T, D, true, 7);
    float *y = tu_alloc(e.n_y), *hT = tu_alloc(e.n_s);
    CHECK_OK(ls_ema_forward_isa(&e.p, NULL, y, hT, test_isa));

    float *pool = tu_alloc((size_t)(n_rows * D)), *pool0 = tu_alloc((size_t)(n_rows * D));
    tu_rng r = {99};
    tu_fill_normal(&r, pool, (size_t)(n_rows * D), 1.0);
    for (int64_t b = 0; b < B; b++)
        if (rows[b] >= 0) memcpy(pool + rows[b] * D, e.h0 + b * D, (size_t)D * sizeof(float));
    memcpy(pool0, pool, (size_t)(n_rows * D) * sizeof(float));

    float *xt = tu_alloc((size_t)(B * D)), *yt = tu_alloc((size_t)(B * D));
    float *ys = tu_alloc(e.n_y);
    bool padding_zero = true;
    for (int64_t t = 0; t < T; t++) {
        tu_slice_tokens(e.x, B, T, D, t, 1, xt);
        tu_poison(yt, (size_t)(B * D) * sizeof(float));
        linseq_ema_problem step = {.B = B, .T = 1, .D = D, .x = xt, .a = e.a};
        CHECK_OK(ls_ema_decode_isa(&step, NULL, pool, n_rows, rows, yt, test_isa));
        for (int64_t d = 0; d < D; d++) padding_zero &= yt[1 * D + d] == 0.0f;
        tu_place_tokens(yt, B, T, D, t, 1, ys);
    }
    CHECK(padding_zero, "decode: the padding request's y is not 0");
    for (int64_t b = 0; b < B; b += 2) {
        CHECK(tu_same_bits(ys + b * T * D, y + b * T * D, (size_t)(T * D)),
              "decode: request %lld's y differs from the forward's", (long long)b);
        CHECK(tu_same_bits(pool + rows[b] * D, hT + b * D, (size_t)D),
              "decode: request %lld's row differs from the forward's hT", (long long)b);
    }
    for (int64_t row = 0; row < n_rows; row++)
        if (row != 4 && row != 1)
            CHECK(tu_same_bits(pool + row * D, pool0 + row * D, (size_t)D),
                  "decode: row %lld, named by no request, changed", (long long)row);

    /* state_rows NULL: request b uses row b */
    memcpy(pool, e.h0, e.n_s * sizeof(float));
    tu_slice_tokens(e.x, B, T, D, 0, 1, xt);
    linseq_ema_problem step = {.B = B, .T = 1, .D = D, .x = xt, .a = e.a};
    CHECK_OK(ls_ema_decode_isa(&step, NULL, pool, B, NULL, yt, test_isa));
    for (int64_t b = 0; b < B; b++)
        CHECK(tu_same_bits(yt + b * D, y + b * T * D, (size_t)D),
              "decode without state_rows: request %lld's y differs", (long long)b);
    free(y), free(hT), free(pool), free(pool0), free(xt), free(yt), free(ys);
    drop(&e);
}

/* hT == h0: the state is updated in place, with the bits of a separate hT. */
static void test_in_place(void)
{
    ema_data e = make(2, 12, 100, true, 11);
    float *y = tu_alloc(e.n_y), *hT = tu_alloc(e.n_s), *y2 = tu_alloc(e.n_y);
    CHECK_OK(ls_ema_forward_isa(&e.p, NULL, y, hT, test_isa));
    CHECK_OK(ls_ema_forward_isa(&e.p, NULL, y2, e.h0, test_isa));
    CHECK(tu_same_bits(e.h0, hT, e.n_s), "in place: h0 after the call differs from hT");
    CHECK(tu_same_bits(y, y2, e.n_y), "in place: y differs");
    free(y), free(hT), free(y2);
    drop(&e);
}

static void test_threads(void)
{
    ema_data e = make(4, 64, 2000, true, 13); /* enough work for 3 threads */
    float *y1 = tu_alloc(e.n_y), *h1 = tu_alloc(e.n_s);
    float *y = tu_alloc(e.n_y), *h = tu_alloc(e.n_s);
    linseq_exec one = {.threads = 1};
    CHECK_OK(ls_ema_forward_isa(&e.p, &one, y1, h1, test_isa));
    for (int threads = 2; threads <= 3; threads++) {
        linseq_exec ex = {.threads = threads};
        CHECK_OK(ls_ema_forward_isa(&e.p, &ex, y, h, test_isa));
        CHECK(tu_same_bits(y1, y, e.n_y) && tu_same_bits(h1, h, e.n_s), "%d threads differ from 1",
              threads);
    }
    free(y1), free(h1), free(y), free(h);
    drop(&e);
}

static void test_bad_inputs(void)
{
    ema_data e = make(2, 3, 8, true, 17);
    float *y = tu_alloc(e.n_y), *hT = tu_alloc(e.n_s), *pool = tu_alloc(16 * 8);
    linseq_ema_problem p = e.p;
    CHECK_FAILS(linseq_ema_forward(NULL, NULL, y, hT), LINSEQ_ERR_NULL_POINTER, "problem");
    p.x = NULL;
    CHECK_FAILS(linseq_ema_forward(&p, NULL, y, hT), LINSEQ_ERR_NULL_POINTER, "x");
    p = e.p, p.a = NULL;
    CHECK_FAILS(linseq_ema_forward(&p, NULL, y, hT), LINSEQ_ERR_NULL_POINTER, "'a'");
    CHECK_FAILS(linseq_ema_forward(&e.p, NULL, NULL, hT), LINSEQ_ERR_NULL_POINTER, "y");
    p = e.p, p.D = 0;
    CHECK_FAILS(linseq_ema_forward(&p, NULL, y, hT), LINSEQ_ERR_INVALID_SIZE, "D");
    p = e.p, p.T = -1;
    CHECK_FAILS(linseq_ema_forward(&p, NULL, y, hT), LINSEQ_ERR_INVALID_SIZE, "T");
    e.a[3] = 1.5f;
    CHECK_FAILS(linseq_ema_forward(&e.p, NULL, y, hT), LINSEQ_ERR_INVALID_VALUE, "a[3]");
    e.a[3] = -0.25f;
    CHECK_FAILS(linseq_ema_forward(&e.p, NULL, y, hT), LINSEQ_ERR_INVALID_VALUE, "a[3]");
    e.a[3] = NAN;
    CHECK_FAILS(linseq_ema_decode(&(linseq_ema_problem){.B = 2, .T = 1, .D = 8, .x = e.x, .a = e.a},
                                  NULL, pool, 16, NULL, y),
                LINSEQ_ERR_INVALID_VALUE, "a[3]");
    e.a[3] = 0.5f;
    CHECK_FAILS(linseq_ema_forward(&e.p, NULL, y, e.x), LINSEQ_ERR_ALIASING, "hT");
    linseq_exec bf16 = {.dtype = LINSEQ_DTYPE_BF16};
    CHECK_FAILS(linseq_ema_forward(&e.p, &bf16, y, hT), LINSEQ_ERR_UNSUPPORTED,
                "linseq_ema_forward");

    linseq_ema_problem d = {.B = 2, .T = 1, .D = 8, .x = e.x, .a = e.a};
    CHECK_OK(linseq_ema_decode(&d, NULL, pool, 16, NULL, y));
    d.T = 2;
    CHECK_FAILS(linseq_ema_decode(&d, NULL, pool, 16, NULL, y), LINSEQ_ERR_INVALID_SIZE, "T = 2");
    d.T = 1, d.h0 = e.h0;
    CHECK_FAILS(linseq_ema_decode(&d, NULL, pool, 16, NULL, y), LINSEQ_ERR_INVALID_VALUE, "h0");
    d.h0 = NULL;
    CHECK_FAILS(linseq_ema_decode(&d, NULL, pool, 1, NULL, y), LINSEQ_ERR_SHAPE_MISMATCH,
                "n_state_rows");
    CHECK_FAILS(linseq_ema_decode(&d, NULL, NULL, 16, NULL, y), LINSEQ_ERR_NULL_POINTER, "state");
    const int64_t same[] = {3, 3}, past[] = {0, 16};
    CHECK_FAILS(linseq_ema_decode(&d, NULL, pool, 16, same, y), LINSEQ_ERR_INVALID_VALUE,
                "state_rows");
    CHECK_FAILS(linseq_ema_decode(&d, NULL, pool, 16, past, y), LINSEQ_ERR_INVALID_VALUE,
                "state_rows");
    CHECK_OK(linseq_ema_forward(&e.p, NULL, y, hT));
    CHECK(linseq_last_error()[0] == '\0', "a success left the message \"%s\"", linseq_last_error());
    free(y), free(hT), free(pool);
    drop(&e);
}

int main(void)
{
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) {
            printf("ema %s: not available on this CPU, skipped\n", ls_isa_name((ls_isa)isa));
            continue;
        }
        test_isa = (ls_isa)isa;
        const tu_mark mark = tu_mark_now();
        test_against_reference();
        test_decode_steps();
        test_in_place();
        test_threads();
        tu_mark tally = {0, 0};
        tu_tally_add(&tally, mark);
        char label[64];
        snprintf(label, sizeof label, "ema forward+decode %s", ls_isa_name(test_isa));
        tu_report(label, tally, "vs the double reference, decode, in place, threads");
    }
    test_bad_inputs();
    return tu_finish("test_ema");
}
