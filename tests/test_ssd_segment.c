/* linseq_ssd_segment_forward / _backward: S_end = P S_start + R per (sequence, head).
 *   - P against exp(A sum_t dt_t) and R against the double recurrence from zeros (written
 *     here from docs/semantics.md), in the recurrent mode and at several chunk sizes;
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
#include "testutil.h"

/* ---- the definition in double ---------------------------------------------------------- */

static double ref_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

static double ref_dt(const linseq_ssd_problem *p, int64_t bt, int64_t h)
{
    double d = p->dt[bt * p->H + h];
    if (p->dt_softplus) d = ref_softplus(d + (p->dt_bias ? p->dt_bias[h] : 0.0));
    if (p->dt_max > p->dt_min) d = fmin(fmax(d, p->dt_min), p->dt_max);
    return d;
}

static int64_t state_at(const linseq_ssd_problem *p, int64_t row, int64_t h, int64_t i, int64_t n)
{
    const int64_t base = (row * p->H + h) * p->P * p->N;
    return p->state_n_first ? base + n * p->P + i : base + i * p->N + n;
}

static int64_t n_seqs_of(const linseq_ssd_problem *p) { return p->cu_seqlens ? p->n_seqs : p->B; }

/* P [N_seq,H] = exp(A sum dt); R (the state layout) = the recurrence from zeros:
 * S = exp(dt A) S + dt x B^T per token. */
static void reference(const linseq_ssd_problem *p, double *P, double *R)
{
    const int64_t H = p->H, Pd = p->P, N = p->N, G = p->G ? p->G : 1;
    double *S = malloc((size_t)(Pd * N) * sizeof *S);
    for (int64_t s = 0; s < n_seqs_of(p); s++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / (H / G);
            const int64_t first = p->cu_seqlens ? p->cu_seqlens[s] : s * p->T;
            const int64_t last = p->cu_seqlens ? p->cu_seqlens[s + 1] : (s + 1) * p->T;
            double sum = 0.0;
            memset(S, 0, (size_t)(Pd * N) * sizeof *S);
            for (int64_t bt = first; bt < last; bt++) {
                const double d = ref_dt(p, bt, h), decay = exp(d * p->A[h]);
                sum += d;
                const float *x = p->x + (bt * H + h) * Pd, *Bv = p->B_proj + (bt * G + g) * N;
                for (int64_t i = 0; i < Pd; i++)
                    for (int64_t n = 0; n < N; n++)
                        S[i * N + n] = decay * S[i * N + n] + d * x[i] * Bv[n];
            }
            P[s * H + h] = exp(p->A[h] * sum);
            for (int64_t i = 0; i < Pd; i++)
                for (int64_t n = 0; n < N; n++) R[state_at(p, s, h, i, n)] = S[i * N + n];
        }
    free(S);
}

/* ---- data ------------------------------------------------------------------------------- */

static ls_isa test_isa = LS_ISA_SCALAR;

typedef struct spec {
    const char *name;
    int64_t B, T, H, P, N, G;
    bool extras, softplus, clamp, n_first; /* extras: D (per channel) and z given */
    const int64_t *cu;
    int64_t n_seqs;
} spec;

static const int64_t CU[] = {0, 37, 37, 100, 130};

static const spec SPECS[] = {
    {"plain", 2, 70, 2, 8, 4, 1, false, false, false, false, NULL, 0},
    {"softplus, clamp, groups, D, z, N-first", 1, 90, 4, 8, 6, 2, true, true, true, true, NULL, 0},
    {"varlen with an empty sequence, softplus", 1, 130, 2, 4, 8, 1, false, true, false, false, CU,
     4},
};
#define N_SPECS (sizeof SPECS / sizeof SPECS[0])

typedef struct data {
    linseq_ssd_problem p;
    float *x, *dt, *A, *Bp, *Cp, *D, *z, *bias, *h0, *d_P, *d_R;
    size_t n_y, n_dt, n_bc, n_s, n_p, n_d;
} data;

static data make(const spec *s, uint64_t seed)
{
    tu_rng r = {seed};
    const int64_t BT = s->B * s->T, rows = s->cu ? s->n_seqs : s->B;
    data e = {.n_y = (size_t)(BT * s->H * s->P),
              .n_dt = (size_t)(BT * s->H),
              .n_bc = (size_t)(BT * s->G * s->N),
              .n_s = (size_t)(rows * s->H * s->P * s->N),
              .n_p = (size_t)(rows * s->H),
              .n_d = (size_t)(s->H * s->P)};
    e.x = tu_alloc(e.n_y), e.z = tu_alloc(e.n_y), e.dt = tu_alloc(e.n_dt);
    e.A = tu_alloc((size_t)s->H), e.bias = tu_alloc((size_t)s->H), e.D = tu_alloc(e.n_d);
    e.Bp = tu_alloc(e.n_bc), e.Cp = tu_alloc(e.n_bc);
    e.h0 = tu_alloc(e.n_s), e.d_R = tu_alloc(e.n_s), e.d_P = tu_alloc(e.n_p);
    tu_fill_normal(&r, e.x, e.n_y, 1.0);
    tu_fill_normal(&r, e.z, e.n_y, 1.0);
    tu_fill_uniform(&r, e.dt, e.n_dt, s->softplus ? -4.0 : 0.01, s->softplus ? 0.0 : 0.3);
    if (s->softplus) e.dt[1] = 22.0f; /* above softplus's threshold */
    /* small |A|: P = exp(A sum dt) stays far from 0 over these lengths, so its share counts */
    tu_fill_uniform(&r, e.A, (size_t)s->H, -0.3, -0.02);
    tu_fill_uniform(&r, e.bias, (size_t)s->H, -1.0, 1.0);
    tu_fill_normal(&r, e.D, e.n_d, 1.0);
    tu_fill_normal(&r, e.Bp, e.n_bc, 1.0);
    tu_fill_normal(&r, e.Cp, e.n_bc, 1.0);
    tu_fill_normal(&r, e.h0, e.n_s, 0.5);
    tu_fill_normal(&r, e.d_R, e.n_s, 1.0);
    tu_fill_normal(&r, e.d_P, e.n_p, 1.0);
    e.p = (linseq_ssd_problem){.B = s->B,
                               .T = s->T,
                               .H = s->H,
                               .P = s->P,
                               .N = s->N,
                               .G = s->G,
                               .cu_seqlens = s->cu,
                               .n_seqs = s->n_seqs,
                               .x = e.x,
                               .dt = e.dt,
                               .A = e.A,
                               .B_proj = e.Bp,
                               .C_proj = e.Cp,
                               .D_skip = s->extras ? e.D : NULL,
                               .z = s->extras ? e.z : NULL,
                               .dt_bias = s->softplus ? e.bias : NULL,
                               .dt_softplus = s->softplus,
                               .D_per_channel = s->extras,
                               .state_n_first = s->n_first,
                               .dt_min = s->clamp ? 0.05f : 0.0f,
                               .dt_max = s->clamp ? 0.25f : 0.0f};
    return e;
}

static void drop(data *e)
{
    free(e->x), free(e->z), free(e->dt), free(e->A), free(e->bias), free(e->D);
    free(e->Bp), free(e->Cp), free(e->h0), free(e->d_R), free(e->d_P);
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
        data e = make(&SPECS[i], 300 + i);
        double *rP = malloc(e.n_p * sizeof *rP), *rR = malloc(e.n_s * sizeof *rR);
        reference(&e.p, rP, rR);
        for (size_t k = 0; k < sizeof execs / sizeof execs[0]; k++) {
            linseq_exec ex = {.mode = execs[k].mode, .chunk_size = execs[k].chunk};
            float *P = tu_alloc_poisoned(e.n_p), *R = tu_alloc_poisoned(e.n_s);
            CHECK_OK(ls_ssd_segment_forward_isa(&e.p, &ex, P, R, test_isa));
            const double eP = tu_rel_err_d(P, rP, e.n_p), eR = tu_rel_err_d(R, rR, e.n_s);
            CHECK(eP < 1e-6 && eR < 2e-5, "%s, mode %d chunk %d: error P %.2e, R %.2e",
                  SPECS[i].name, (int)execs[k].mode, execs[k].chunk, eP, eR);
            /* R NULL: P alone, the same bits */
            float *P2 = tu_alloc_poisoned(e.n_p);
            CHECK_OK(ls_ssd_segment_forward_isa(&e.p, &ex, P2, NULL, test_isa));
            CHECK(tu_same_bits(P, P2, e.n_p), "%s: P without R differs", SPECS[i].name);
            free(P), free(R), free(P2);
        }
        free(rP), free(rR);
        drop(&e);
    }
}

/* P h0 + R is the forward's end state from h0 (the map, applied to a start state). */
static void test_map_is_the_forward(void)
{
    for (size_t i = 0; i < N_SPECS; i++) {
        data e = make(&SPECS[i], 400 + i);
        float *P = tu_alloc(e.n_p), *R = tu_alloc(e.n_s), *y = tu_alloc(e.n_y);
        float *hT = tu_alloc(e.n_s);
        double *mapped = malloc(e.n_s * sizeof *mapped);
        CHECK_OK(ls_ssd_segment_forward_isa(&e.p, NULL, P, R, test_isa));
        linseq_ssd_problem from = e.p;
        from.h0 = e.h0;
        CHECK_OK(ls_ssd_forward_isa(&from, NULL, y, hT, test_isa));
        const int64_t per = e.p.P * e.p.N;
        for (size_t k = 0; k < e.n_s; k++) mapped[k] = (double)P[k / (size_t)per] * e.h0[k] + R[k];
        const double err = tu_rel_err_d(hT, mapped, e.n_s);
        CHECK(err < 2e-5, "%s: P h0 + R vs the forward's end state from h0: %.2e", SPECS[i].name,
              err);
        free(P), free(R), free(y), free(hT), free(mapped);
        drop(&e);
    }
}

static void test_threads(void)
{
    data e = make(&SPECS[1], 500);
    float *P1 = tu_alloc(e.n_p), *R1 = tu_alloc(e.n_s), *P2 = tu_alloc(e.n_p);
    float *R2 = tu_alloc(e.n_s), *dx1 = tu_alloc(e.n_y), *dx2 = tu_alloc(e.n_y);
    float *ddt1 = tu_alloc(e.n_dt), *ddt2 = tu_alloc(e.n_dt);
    float dA1[4], dA2[4];
    linseq_exec one = {.threads = 1};
    CHECK_OK(ls_ssd_segment_forward_isa(&e.p, &one, P1, R1, test_isa));
    linseq_ssd_grads g1 = {.dx = dx1, .ddt = ddt1, .dA = dA1};
    CHECK_OK(ls_ssd_segment_backward_isa(&e.p, &one, e.d_P, e.d_R, &g1, test_isa));
    for (int threads = 2; threads <= 3; threads++) {
        linseq_exec ex = {.threads = threads};
        CHECK_OK(ls_ssd_segment_forward_isa(&e.p, &ex, P2, R2, test_isa));
        linseq_ssd_grads g2 = {.dx = dx2, .ddt = ddt2, .dA = dA2};
        CHECK_OK(ls_ssd_segment_backward_isa(&e.p, &ex, e.d_P, e.d_R, &g2, test_isa));
        CHECK(tu_same_bits(P1, P2, e.n_p) && tu_same_bits(R1, R2, e.n_s) &&
                  tu_same_bits(dx1, dx2, e.n_y) && tu_same_bits(ddt1, ddt2, e.n_dt) &&
                  tu_same_bits(dA1, dA2, 4),
              "%d threads differ from 1", threads);
    }
    free(P1), free(R1), free(P2), free(R2), free(dx1), free(dx2), free(ddt1), free(ddt2);
    drop(&e);
}

/* ---- backward --------------------------------------------------------------------------- */

static double ref_loss(const data *e)
{
    double *P = malloc(e->n_p * sizeof *P), *R = malloc(e->n_s * sizeof *R), loss = 0.0;
    reference(&e->p, P, R);
    for (size_t i = 0; i < e->n_p; i++) loss += P[i] * e->d_P[i];
    for (size_t i = 0; i < e->n_s; i++) loss += R[i] * e->d_R[i];
    free(P), free(R);
    return loss;
}

/* A gradient against the central difference of the double loss at a few elements. */
static void check_gradient(const char *what, data *e, float *input, const float *grad, size_t n)
{
    double worst = 0.0;
    for (size_t k = 0; k < 7 && k < n; k++) {
        const size_t i = k * (n - 1) / 6;
        const float keep = input[i];
        const double h = 1e-3 * fmax(1.0, fabs(keep));
        input[i] = (float)(keep + h);
        const double up = ref_loss(e), h_up = (double)input[i] - keep;
        input[i] = (float)(keep - h);
        const double down = ref_loss(e), h_down = keep - (double)input[i];
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
        const spec *s = &SPECS[i];
        data e = make(s, 600 + i);
        float *dx = tu_alloc_poisoned(e.n_y), *ddt = tu_alloc_poisoned(e.n_dt);
        float *dB = tu_alloc_poisoned(e.n_bc), *dC = tu_alloc_poisoned(e.n_bc);
        float *dA = tu_alloc_poisoned((size_t)s->H), *dbias = tu_alloc_poisoned((size_t)s->H);
        float *dD = tu_alloc_poisoned(e.n_d), *dz = tu_alloc_poisoned(e.n_y);
        linseq_ssd_grads g = {.dx = dx,
                              .ddt = ddt,
                              .dA = dA,
                              .dB_proj = dB,
                              .dC_proj = dC,
                              .dD_skip = s->extras ? dD : NULL,
                              .dz = s->extras ? dz : NULL,
                              .ddt_bias = s->softplus ? dbias : NULL};
        CHECK_OK(ls_ssd_segment_backward_isa(&e.p, NULL, e.d_P, e.d_R, &g, test_isa));
        check_gradient("dx", &e, e.x, dx, e.n_y);
        check_gradient("ddt", &e, e.dt, ddt, e.n_dt);
        check_gradient("dA", &e, e.A, dA, (size_t)s->H);
        check_gradient("dB", &e, e.Bp, dB, e.n_bc);
        if (s->softplus) check_gradient("ddt_bias", &e, e.bias, dbias, (size_t)s->H);
        CHECK(all_zero(dC, e.n_bc), "%s: dC is not zero", s->name);
        if (s->extras)
            CHECK(all_zero(dD, e.n_d) && all_zero(dz, e.n_y), "%s: dD or dz is not zero", s->name);
        /* d_P alone (d_R NULL), and d_R alone: the two shares add up */
        float *dx_p = tu_alloc(e.n_y), *ddt_p = tu_alloc(e.n_dt), *dx_r = tu_alloc(e.n_y);
        float *ddt_r = tu_alloc(e.n_dt);
        linseq_ssd_grads gp = {.dx = dx_p, .ddt = ddt_p}, gr = {.dx = dx_r, .ddt = ddt_r};
        CHECK_OK(ls_ssd_segment_backward_isa(&e.p, NULL, e.d_P, NULL, &gp, test_isa));
        CHECK_OK(ls_ssd_segment_backward_isa(&e.p, NULL, NULL, e.d_R, &gr, test_isa));
        CHECK(all_zero(dx_p, e.n_y), "%s: dx from d_P alone is not zero (x does not enter P)",
              s->name);
        double worst = 0.0;
        for (size_t k = 0; k < e.n_dt; k++)
            worst = fmax(worst, fabs((double)ddt_p[k] + ddt_r[k] - ddt[k]) /
                                    fmax(1.0, fabs((double)ddt[k])));
        CHECK(worst < 1e-5, "%s: ddt(d_P) + ddt(d_R) vs ddt(both): %.2e", s->name, worst);
        free(dx_p), free(ddt_p), free(dx_r), free(ddt_r);
        free(dx), free(ddt), free(dB), free(dC), free(dA), free(dbias), free(dD), free(dz);
        drop(&e);
    }
}

/* ---- refusals --------------------------------------------------------------------------- */

static void test_bad_inputs(void)
{
    data e = make(&SPECS[1], 700);
    float *P = tu_alloc(e.n_p), *R = tu_alloc(e.n_s), *dx = tu_alloc(e.n_y);
    for (size_t i = 0; i < e.n_p; i++) P[i] = 7.0f;
    linseq_ssd_problem p = e.p;
    p.h0 = e.h0;
    CHECK_FAILS(linseq_ssd_segment_forward(&p, NULL, P, R), LINSEQ_ERR_INVALID_VALUE, "h0");
    CHECK_FAILS(linseq_ssd_segment_forward(&e.p, NULL, NULL, R), LINSEQ_ERR_NULL_POINTER, "P");
    p = e.p, p.G = 3;
    CHECK_FAILS(linseq_ssd_segment_forward(&p, NULL, P, R), LINSEQ_ERR_SHAPE_MISMATCH, "G = 3");
    linseq_exec bf16 = {.dtype = LINSEQ_DTYPE_BF16};
    CHECK_FAILS(linseq_ssd_segment_forward(&e.p, &bf16, P, R), LINSEQ_ERR_UNSUPPORTED, "float32");
    e.A[2] = 0.5f;
    CHECK_FAILS(linseq_ssd_segment_forward(&e.p, NULL, P, R), LINSEQ_ERR_INVALID_VALUE, "A[2]");
    e.A[2] = -1.0f;
    for (size_t i = 0; i < e.n_p; i++) CHECK(P[i] == 7.0f, "a refused call wrote P[%zu]", i);
    CHECK_FAILS(linseq_ssd_segment_backward(&e.p, NULL, e.d_P, e.d_R, NULL),
                LINSEQ_ERR_NULL_POINTER, "grads");
    linseq_ssd_grads g = {.dx = dx, .dh0 = R};
    CHECK_FAILS(linseq_ssd_segment_backward(&e.p, NULL, e.d_P, e.d_R, &g), LINSEQ_ERR_INVALID_VALUE,
                "dh0");
    g = (linseq_ssd_grads){.dx = dx, .ddt = e.dt};
    CHECK_FAILS(linseq_ssd_segment_backward(&e.p, NULL, e.d_P, e.d_R, &g), LINSEQ_ERR_ALIASING,
                "ddt");
    CHECK_OK(linseq_ssd_segment_forward(&e.p, NULL, P, R));
    CHECK(linseq_last_error()[0] == '\0', "a success left the message \"%s\"", linseq_last_error());
    free(P), free(R), free(dx);
    drop(&e);
}

int main(void)
{
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) {
            printf("ssd_segment %s: not available on this CPU, skipped\n",
                   ls_isa_name((ls_isa)isa));
            continue;
        }
        test_isa = (ls_isa)isa;
        const tu_mark mark = tu_mark_now();
        test_forward();
        test_map_is_the_forward();
        test_threads();
        test_backward();
        tu_mark tally = {0, 0};
        tu_tally_add(&tally, mark);
        char label[64];
        snprintf(label, sizeof label, "ssd_segment %s", ls_isa_name(test_isa));
        tu_report(label, tally, "P and R vs the double reference, the map, threads, gradients");
    }
    test_bad_inputs();
    return tu_finish("test_ssd_segment");
}
