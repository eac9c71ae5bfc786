/* linseq_ssd_segment_forward / _backward: S_end = P S_start + R per (sequence, head).
 *   - P against exp(A sum_t dt_t) and R against the double recurrence from zeros (the one
 *     from ssd_fixture.c, docs/semantics.md), in the recurrent mode and at several chunk sizes;
 *   - the map: P h0 + R equals linseq_ssd_forward's end state from h0;
 *   - the backward against central differences of the double loss sum(P d_P) + sum(R d_R),
 *     with dC, dD and dz zero (they do not enter);
 *   - softplus with dt_bias, the dt clamp, groups, N-first states, varlen with an empty
 *     sequence, D and z present; every ISA, 1/2/3 threads bitwise; bad inputs refused with
 *     nothing written. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ssd/ssd.h"
#include "ssd_fixture.h"
#include "testutil.h"

/* ---- the definition in double ---------------------------------------------------------- */

/* P [N_seq,H] = exp(A sum dt); R (the state layout) = the recurrence from zeros:
 * S = exp(dt A) S + dt x B^T per token (the problem has no h0). */
static void reference(const linseq_ssd_problem *p, double *P, double *R)
{
    ssd_reference(p, NULL, R);
    const int64_t n_seqs = p->cu_seqlens ? p->n_seqs : p->B;
    for (int64_t s = 0; s < n_seqs; s++)
        for (int64_t h = 0; h < p->H; h++) {
            int64_t first, last;
            ssd_ref_tokens(p, s, &first, &last);
            double sum = 0.0;
            for (int64_t bt = first; bt < last; bt++) sum += ssd_ref_dt(p, bt, h);
            P[s * p->H + h] = exp(p->A[h] * sum);
        }
}

/* ---- data ------------------------------------------------------------------------------- */

static ls_isa test_isa = LS_ISA_SCALAR;

/* h0 is drawn for the map (the problem itself has none); one spec a line reads as a table
 * (clang-format would put one field a line) */
/* clang-format off */
static const ssd_spec SPECS[] = {
    {.name = "plain", .B = 2, .T = 70, .H = 2, .P = 8, .N = 4, .G = 1, .h0 = true},
    {.name = "softplus, clamp, groups, D, z, N-first", .B = 1, .T = 90, .H = 4, .P = 8, .N = 6,
     .G = 2, .h0 = true, .D = true, .D_per_channel = true, .z = true, .softplus = true,
     .dt_max = 0.25f, .n_first = true},
    {.name = "varlen with an empty sequence, softplus", .B = 1, .T = 130, .H = 2, .P = 4, .N = 8,
     .G = 1, .h0 = true, .softplus = true, .cu = ssd_cu_empty, .n_seqs = 4},
};
/* clang-format on */
#define N_SPECS (sizeof SPECS / sizeof SPECS[0])

/* A fixture's problem without h0, and the upstream gradients of P and R (n_p of them). */
typedef struct segment_case {
    ssd_fixture f;
    float *d_P, *d_R;
    size_t n_p;
} segment_case;

/* Every buffer drawn, present in the problem or not, in this test's order: small |A|, so
 * that P = exp(A sum dt) stays far from 0 over these lengths and its share counts, and one
 * dt above softplus's threshold. */
static segment_case make(const ssd_spec *s, uint64_t seed)
{
    segment_case c;
    ssd_fixture *e = &c.f;
    ssd_fixture_alloc(e, s);
    e->p.h0 = NULL; /* the summary starts from zeros; h0 serves the map */
    c.n_p = (size_t)(e->n_rows * s->H);
    c.d_R = tu_alloc(e->n_s), c.d_P = tu_alloc(c.n_p);
    tu_rng r = {seed};
    tu_fill_normal(&r, e->x, e->n_y, 1.0);
    tu_fill_normal(&r, e->z, e->n_y, 1.0);
    tu_fill_uniform(&r, e->dt, e->n_dt, s->softplus ? -4.0 : 0.01, s->softplus ? 0.0 : 0.3);
    if (s->softplus) e->dt[1] = 22.0f;
    tu_fill_uniform(&r, e->A, (size_t)s->H, -0.3, -0.02);
    tu_fill_uniform(&r, e->dt_bias, (size_t)s->H, -1.0, 1.0);
    tu_fill_normal(&r, e->D, (size_t)(s->H * s->P), 1.0);
    tu_fill_normal(&r, e->Bp, e->n_bc, 1.0);
    tu_fill_normal(&r, e->Cp, e->n_bc, 1.0);
    tu_fill_normal(&r, e->h0, e->n_s, 0.5);
    tu_fill_normal(&r, c.d_R, e->n_s, 1.0);
    tu_fill_normal(&r, c.d_P, c.n_p, 1.0);
    return c;
}

static void drop(segment_case *c)
{
    free(c->d_R), free(c->d_P);
    ssd_fixture_free(&c->f);
}

/* ---- forward ---------------------------------------------------------------------------- */

static void test_forward(void)
{
    static const struct {
        linseq_mode mode;
        int chunk;
    } execs[] = {{LINSEQ_MODE_RECURRENT, 0},
                 {LINSEQ_MODE_DEFAULT, 0},
                 {LINSEQ_MODE_CHUNKED, 16},
                 {LINSEQ_MODE_CHUNKED, 128}};
    for (size_t i = 0; i < N_SPECS; i++) {
        segment_case c = make(&SPECS[i], 300 + i);
        ssd_fixture *e = &c.f;
        double *rP = malloc(c.n_p * sizeof *rP), *rR = malloc(e->n_s * sizeof *rR);
        reference(&e->p, rP, rR);
        for (size_t k = 0; k < sizeof execs / sizeof execs[0]; k++) {
            linseq_exec ex = {.mode = execs[k].mode, .chunk_size = execs[k].chunk};
            float *P = tu_alloc_poisoned(c.n_p), *R = tu_alloc_poisoned(e->n_s);
            CHECK_OK(ls_ssd_segment_forward_isa(&e->p, &ex, P, R, test_isa));
            const double eP = tu_rel_err_d(P, rP, c.n_p), eR = tu_rel_err_d(R, rR, e->n_s);
            CHECK(eP < 1e-6 && eR < 2e-5, "%s, mode %d chunk %d: error P %.2e, R %.2e",
                  SPECS[i].name, (int)execs[k].mode, execs[k].chunk, eP, eR);
            /* R NULL: P alone, the same bits */
            float *P2 = tu_alloc_poisoned(c.n_p);
            CHECK_OK(ls_ssd_segment_forward_isa(&e->p, &ex, P2, NULL, test_isa));
            CHECK(tu_same_bits(P, P2, c.n_p), "%s: P without R differs", SPECS[i].name);
            free(P), free(R), free(P2);
        }
        free(rP), free(rR);
        drop(&c);
    }
}

/* P h0 + R is the forward's end state from h0 (the map, applied to a start state). */
static void test_map_is_the_forward(void)
{
    for (size_t i = 0; i < N_SPECS; i++) {
        segment_case c = make(&SPECS[i], 400 + i);
        ssd_fixture *e = &c.f;
        float *P = tu_alloc(c.n_p), *R = tu_alloc(e->n_s), *y = tu_alloc(e->n_y);
        float *hT = tu_alloc(e->n_s);
        double *mapped = malloc(e->n_s * sizeof *mapped);
        CHECK_OK(ls_ssd_segment_forward_isa(&e->p, NULL, P, R, test_isa));
        linseq_ssd_problem from = e->p;
        from.h0 = e->h0;
        CHECK_OK(ls_ssd_forward_isa(&from, NULL, y, hT, test_isa));
        const int64_t per = e->p.P * e->p.N;
        for (size_t k = 0; k < e->n_s; k++)
            mapped[k] = (double)P[k / (size_t)per] * e->h0[k] + R[k];
        const double err = tu_rel_err_d(hT, mapped, e->n_s);
        CHECK(err < 2e-5, "%s: P h0 + R vs the forward's end state from h0: %.2e", SPECS[i].name,
              err);
        free(P), free(R), free(y), free(hT), free(mapped);
        drop(&c);
    }
}

static void test_threads(void)
{
    segment_case c = make(&SPECS[1], 500);
    ssd_fixture *e = &c.f;
    float *P1 = tu_alloc(c.n_p), *R1 = tu_alloc(e->n_s), *P2 = tu_alloc(c.n_p);
    float *R2 = tu_alloc(e->n_s), *dx1 = tu_alloc(e->n_y), *dx2 = tu_alloc(e->n_y);
    float *ddt1 = tu_alloc(e->n_dt), *ddt2 = tu_alloc(e->n_dt);
    float dA1[4], dA2[4];
    linseq_exec one = {.threads = 1};
    CHECK_OK(ls_ssd_segment_forward_isa(&e->p, &one, P1, R1, test_isa));
    linseq_ssd_grads g1 = {.dx = dx1, .ddt = ddt1, .dA = dA1};
    CHECK_OK(ls_ssd_segment_backward_isa(&e->p, &one, c.d_P, c.d_R, &g1, test_isa));
    for (int threads = 2; threads <= 3; threads++) {
        linseq_exec ex = {.threads = threads};
        CHECK_OK(ls_ssd_segment_forward_isa(&e->p, &ex, P2, R2, test_isa));
        linseq_ssd_grads g2 = {.dx = dx2, .ddt = ddt2, .dA = dA2};
        CHECK_OK(ls_ssd_segment_backward_isa(&e->p, &ex, c.d_P, c.d_R, &g2, test_isa));
        CHECK(tu_same_bits(P1, P2, c.n_p) && tu_same_bits(R1, R2, e->n_s) &&
                  tu_same_bits(dx1, dx2, e->n_y) && tu_same_bits(ddt1, ddt2, e->n_dt) &&
                  tu_same_bits(dA1, dA2, 4),
              "%d threads differ from 1", threads);
    }
    free(P1), free(R1), free(P2), free(R2), free(dx1), free(dx2), free(ddt1), free(ddt2);
    drop(&c);
}

/* ---- backward --------------------------------------------------------------------------- */

static double ref_loss(const segment_case *c)
{
    const size_t n_s = c->f.n_s;
    double *P = malloc(c->n_p * sizeof *P), *R = malloc(n_s * sizeof *R), loss = 0.0;
    reference(&c->f.p, P, R);
    for (size_t i = 0; i < c->n_p; i++) loss += P[i] * c->d_P[i];
    for (size_t i = 0; i < n_s; i++) loss += R[i] * c->d_R[i];
    free(P), free(R);
    return loss;
}

/* A gradient against the central difference of the double loss at a few elements. */
static void check_gradient(const char *what, const segment_case *c, float *input, const float *grad,
                           size_t n)
{
    double worst = 0.0;
    for (size_t k = 0; k < 7 && k < n; k++) {
        const size_t i = k * (n - 1) / 6;
        const float keep = input[i];
        const double h = 1e-3 * fmax(1.0, fabs(keep));
        input[i] = (float)(keep + h);
        const double up = ref_loss(c), h_up = (double)input[i] - keep;
        input[i] = (float)(keep - h);
        const double down = ref_loss(c), h_down = keep - (double)input[i];
        input[i] = keep;
        const double fd = (up - down) / (h_up + h_down);
        worst = fmax(worst, fabs(fd - grad[i]) / fmax(1.0, fabs(fd)));
    }
    CHECK(worst < 2e-4, "%s: gradient vs central differences, worst relative error %.2e", what,
          worst);
}

static bool all_zero(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] != 0.0f) return false;
    return true;
}

static void test_backward(void)
{
    for (size_t i = 0; i < N_SPECS; i++) {
        const ssd_spec *s = &SPECS[i];
        segment_case c = make(s, 600 + i);
        ssd_fixture *e = &c.f;
        float *dx = tu_alloc_poisoned(e->n_y), *ddt = tu_alloc_poisoned(e->n_dt);
        float *dB = tu_alloc_poisoned(e->n_bc), *dC = tu_alloc_poisoned(e->n_bc);
        float *dA = tu_alloc_poisoned((size_t)s->H), *dbias = tu_alloc_poisoned((size_t)s->H);
        float *dD = tu_alloc_poisoned(e->n_d), *dz = tu_alloc_poisoned(e->n_y);
        linseq_ssd_grads g = {.dx = dx,
                              .ddt = ddt,
                              .dA = dA,
                              .dB_proj = dB,
                              .dC_proj = dC,
                              .dD_skip = s->D ? dD : NULL,
                              .dz = s->z ? dz : NULL,
                              .ddt_bias = s->softplus ? dbias : NULL};
        CHECK_OK(ls_ssd_segment_backward_isa(&e->p, NULL, c.d_P, c.d_R, &g, test_isa));
        check_gradient("dx", &c, e->x, dx, e->n_y);
        check_gradient("ddt", &c, e->dt, ddt, e->n_dt);
        check_gradient("dA", &c, e->A, dA, (size_t)s->H);
        check_gradient("dB", &c, e->Bp, dB, e->n_bc);
        if (s->softplus) check_gradient("ddt_bias", &c, e->dt_bias, dbias, (size_t)s->H);
        CHECK(all_zero(dC, e->n_bc), "%s: dC is not zero", s->name);
        if (s->D && s->z)
            CHECK(all_zero(dD, e->n_d) && all_zero(dz, e->n_y), "%s: dD or dz is not zero",
                  s->name);
        /* d_P alone (d_R NULL), and d_R alone: the two shares add up */
        float *dx_p = tu_alloc(e->n_y), *ddt_p = tu_alloc(e->n_dt), *dx_r = tu_alloc(e->n_y);
        float *ddt_r = tu_alloc(e->n_dt);
        linseq_ssd_grads gp = {.dx = dx_p, .ddt = ddt_p}, gr = {.dx = dx_r, .ddt = ddt_r};
        CHECK_OK(ls_ssd_segment_backward_isa(&e->p, NULL, c.d_P, NULL, &gp, test_isa));
        CHECK_OK(ls_ssd_segment_backward_isa(&e->p, NULL, NULL, c.d_R, &gr, test_isa));
        CHECK(all_zero(dx_p, e->n_y), "%s: dx from d_P alone is not zero (x does not enter P)",
              s->name);
        double worst = 0.0;
        for (size_t k = 0; k < e->n_dt; k++)
            worst = fmax(worst, fabs((double)ddt_p[k] + ddt_r[k] - ddt[k]) /
                                    fmax(1.0, fabs((double)ddt[k])));
        CHECK(worst < 1e-5, "%s: ddt(d_P) + ddt(d_R) vs ddt(both): %.2e", s->name, worst);
        free(dx_p), free(ddt_p), free(dx_r), free(ddt_r);
        free(dx), free(ddt), free(dB), free(dC), free(dA), free(dbias), free(dD), free(dz);
        drop(&c);
    }
}

/* ---- refusals --------------------------------------------------------------------------- */

static void test_bad_inputs(void)
{
    segment_case c = make(&SPECS[1], 700);
    ssd_fixture *e = &c.f;
    float *P = tu_alloc(c.n_p), *R = tu_alloc(e->n_s), *dx = tu_alloc(e->n_y);
    for (size_t i = 0; i < c.n_p; i++) P[i] = 7.0f;
    linseq_ssd_problem p = e->p;
    p.h0 = e->h0;
    CHECK_FAILS(linseq_ssd_segment_forward(&p, NULL, P, R), LINSEQ_ERR_INVALID_VALUE, "h0");
    CHECK_FAILS(linseq_ssd_segment_forward(&e->p, NULL, NULL, R), LINSEQ_ERR_NULL_POINTER, "P");
    p = e->p, p.G = 3;
    CHECK_FAILS(linseq_ssd_segment_forward(&p, NULL, P, R), LINSEQ_ERR_SHAPE_MISMATCH, "G = 3");
    linseq_exec bf16 = {.dtype = LINSEQ_DTYPE_BF16};
    CHECK_FAILS(linseq_ssd_segment_forward(&e->p, &bf16, P, R), LINSEQ_ERR_UNSUPPORTED, "float32");
    e->A[2] = 0.5f;
    CHECK_FAILS(linseq_ssd_segment_forward(&e->p, NULL, P, R), LINSEQ_ERR_INVALID_VALUE, "A[2]");
    e->A[2] = -1.0f;
    for (size_t i = 0; i < c.n_p; i++) CHECK(P[i] == 7.0f, "a refused call wrote P[%zu]", i);
    CHECK_FAILS(linseq_ssd_segment_backward(&e->p, NULL, c.d_P, c.d_R, NULL),
                LINSEQ_ERR_NULL_POINTER, "grads");
    linseq_ssd_grads g = {.dx = dx, .dh0 = R};
    CHECK_FAILS(linseq_ssd_segment_backward(&e->p, NULL, c.d_P, c.d_R, &g),
                LINSEQ_ERR_INVALID_VALUE, "dh0");
    g = (linseq_ssd_grads){.dx = dx, .ddt = e->dt};
    CHECK_FAILS(linseq_ssd_segment_backward(&e->p, NULL, c.d_P, c.d_R, &g), LINSEQ_ERR_ALIASING,
                "ddt");
    CHECK_OK(linseq_ssd_segment_forward(&e->p, NULL, P, R));
    CHECK(linseq_last_error()[0] == '\0', "a success left the message \"%s\"", linseq_last_error());
    free(P), free(R), free(dx);
    drop(&c);
}

/* The numeric tests, through ls_ssd_segment_*_isa with this ISA. */
static void numeric_tests(ls_isa isa)
{
    test_isa = isa;
    test_forward();
    test_map_is_the_forward();
    test_threads();
    test_backward();
}

int main(void)
{
    ssd_each_isa("ssd_segment", numeric_tests,
                 "P and R vs the double reference, the map, threads, gradients");
    test_bad_inputs();
    return tu_finish("test_ssd_segment");
}
