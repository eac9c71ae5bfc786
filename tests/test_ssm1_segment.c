/* linseq_ssm1_segment_forward / _backward: the diagonal map h_end = P * h_start + R.
 *   - P against the double reference recurrence (ssm1_ref.c) run with x = 0 from h0 = 1 (its
 *     end state is the product of the per-token decays), R against the reference from zeros;
 *   - the map: P * h0 + R equals the forward's end state from h0;
 *   - the backward against the reference backwards of those two runs (R's gradients from the
 *     first, P's dA and ddt from the second), and central differences of the reference loss;
 *   - softplus with dt_bias and across its threshold, groups, varlen with an empty sequence,
 *     the gate and skip present (they must not enter), channel_first against token-major; every
 *     ISA, 1/2/3 threads bitwise; bad inputs refused with nothing written. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "simd/isa.h"
#include "ssm/ssm_internal.h"
#include "testutil.h"

static const double TOL = 1e-4;

typedef struct {
    const char *name;
    int64_t B, T, D, N, G;
    bool softplus, varlen, extras; /* extras: gate and D_skip present */
} config;

static const config CONFIGS[] = {
    {"plain dt", 2, 70, 8, 5, 1, false, false, false},
    {"softplus, groups, gate, skip", 2, 70, 12, 4, 3, true, false, true},
    {"varlen softplus", 1, 90, 8, 6, 2, true, true, false},
};

static const int64_t CU[] = {0, 33, 33, 90};

typedef struct {
    linseq_ssm1_problem p;
    float *x, *dt, *A, *Bp, *Cp, *Dk, *gate, *bias, *h0, *d_P, *d_R;
    int64_t n_seqs;
    size_t n_tok, n_proj, n_state;
    const float *up_P, *up_R; /* what the calls get: d_P and d_R, or NULL where zeroed */
} seg_case;

static void make_case(seg_case *c, const config *cf, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    tu_rng r = {seed};
    c->n_seqs = cf->varlen ? 3 : cf->B;
    c->n_tok = (size_t)(cf->B * cf->T * cf->D);
    c->n_proj = (size_t)(cf->B * cf->T * cf->G * cf->N);
    c->n_state = (size_t)(c->n_seqs * cf->D * cf->N);
    c->x = tu_alloc(c->n_tok), c->dt = tu_alloc(c->n_tok), c->gate = tu_alloc(c->n_tok);
    c->A = tu_alloc((size_t)(cf->D * cf->N));
    c->Bp = tu_alloc(c->n_proj), c->Cp = tu_alloc(c->n_proj);
    c->Dk = tu_alloc((size_t)cf->D), c->bias = tu_alloc((size_t)cf->D);
    c->h0 = tu_alloc(c->n_state), c->d_P = tu_alloc(c->n_state), c->d_R = tu_alloc(c->n_state);
    tu_fill_normal(&r, c->x, c->n_tok, 1.0);
    tu_fill_normal(&r, c->gate, c->n_tok, 1.0);
    tu_fill_uniform(&r, c->A, (size_t)(cf->D * cf->N), -4.0, -0.1);
    tu_fill_normal(&r, c->Bp, c->n_proj, 1.0);
    tu_fill_normal(&r, c->Cp, c->n_proj, 1.0);
    tu_fill_normal(&r, c->Dk, (size_t)cf->D, 1.0);
    tu_fill_uniform(&r, c->bias, (size_t)cf->D, -2.0, 0.0);
    tu_fill_normal(&r, c->h0, c->n_state, 1.0);
    tu_fill_normal(&r, c->d_P, c->n_state, 1.0);
    tu_fill_normal(&r, c->d_R, c->n_state, 1.0);
    if (cf->softplus) {
        tu_fill_normal(&r, c->dt, c->n_tok, 1.0);
        c->dt[3] = 21.0f; /* above softplus's threshold */
    } else {
        tu_fill_uniform(&r, c->dt, c->n_tok, 1e-3, 0.3);
    }
    c->p = (linseq_ssm1_problem){.B = cf->B,
                                 .T = cf->T,
                                 .D = cf->D,
                                 .N = cf->N,
                                 .G = cf->G,
                                 .cu_seqlens = cf->varlen ? CU : NULL,
                                 .n_seqs = cf->varlen ? 3 : 0,
                                 .x = c->x,
                                 .dt = c->dt,
                                 .A = c->A,
                                 .B_proj = c->Bp,
                                 .C_proj = c->Cp,
                                 .D_skip = cf->extras ? c->Dk : NULL,
                                 .gate = cf->extras ? c->gate : NULL,
                                 .dt_softplus = cf->softplus,
                                 .dt_bias = cf->softplus ? c->bias : NULL};
}

static void free_case(seg_case *c)
{
    free(c->x), free(c->dt), free(c->gate), free(c->A), free(c->Bp), free(c->Cp), free(c->Dk);
    free(c->bias), free(c->h0), free(c->d_P), free(c->d_R);
}

/* The problem of the P run: x = 0 from h0 = 1 (caller frees *zeros and *ones). */
static linseq_ssm1_problem p_run(const seg_case *c, float **zeros, float **ones)
{
    *zeros = tu_alloc(c->n_tok);
    *ones = tu_alloc(c->n_state);
    for (size_t i = 0; i < c->n_state; i++) (*ones)[i] = 1.0f;
    linseq_ssm1_problem q = c->p;
    q.x = *zeros;
    q.h0 = *ones;
    return q;
}

static void reference_summary(const seg_case *c, double *P, double *R)
{
    double *y = calloc(c->n_tok, sizeof(double));
    float *zeros, *ones;
    const linseq_ssm1_problem q = p_run(c, &zeros, &ones);
    CHECK_OK(ls_ssm1_reference_f64(&q, y, P));
    CHECK_OK(ls_ssm1_reference_f64(&c->p, y, R));
    free(y), free(zeros), free(ones);
}

static double reference_loss(const seg_case *c)
{
    double *P = calloc(c->n_state, sizeof(double)), *R = calloc(c->n_state, sizeof(double));
    reference_summary(c, P, R);
    double L = 0.0;
    for (size_t i = 0; i < c->n_state; i++) L += P[i] * c->d_P[i] + R[i] * c->d_R[i];
    free(P), free(R);
    return L;
}

/* Elements of dx ddt dA dB dC dD dgate ddt_bias. */
static void grad_sizes(const seg_case *c, size_t n[8])
{
    const size_t D = (size_t)c->p.D;
    const size_t s[8] = {c->n_tok,  c->n_tok, D * (size_t)c->p.N, c->n_proj,
                         c->n_proj, D,        c->n_tok,           D};
    memcpy(n, s, sizeof s);
}

/* dx and dB of the R run; dA, ddt and ddt_bias of both runs summed; dC, dD and dgate zero. */
static void reference_grads(const seg_case *c, double *ref[8])
{
    size_t n[8];
    grad_sizes(c, n);
    double *pg[8];
    for (int i = 0; i < 8; i++) {
        ref[i] = calloc(n[i] + 1, sizeof(double));
        pg[i] = calloc(n[i] + 1, sizeof(double));
    }
    float *d_y = tu_alloc(c->n_tok), *zeros, *ones;
    const bool sp = c->p.dt_softplus;
    const ls_ssm1_grads_f64 gr = {.dx = ref[0],
                                  .ddt = ref[1],
                                  .dA = ref[2],
                                  .dB_proj = ref[3],
                                  .ddt_bias = sp ? ref[7] : NULL};
    const ls_ssm1_grads_f64 gp = {
        .dx = pg[0], .ddt = pg[1], .dA = pg[2], .dB_proj = pg[3], .ddt_bias = sp ? pg[7] : NULL};
    CHECK_OK(ls_ssm1_backward_reference(&c->p, d_y, c->d_R, &gr));
    const linseq_ssm1_problem q = p_run(c, &zeros, &ones);
    CHECK_OK(ls_ssm1_backward_reference(&q, d_y, c->d_P, &gp));
    for (int i = 1; i < 8; i++)
        if (i == 1 || i == 2 || i == 7)
            for (size_t k = 0; k < n[i]; k++) ref[i][k] += pg[i][k];
    for (int i = 0; i < 8; i++) free(pg[i]);
    free(d_y), free(zeros), free(ones);
}

static linseq_ssm1_grads grads_of(float *const g[8])
{
    return (linseq_ssm1_grads){.dx = g[0],
                               .ddt = g[1],
                               .dA = g[2],
                               .dB_proj = g[3],
                               .dC_proj = g[4],
                               .dD_skip = g[5],
                               .dgate = g[6],
                               .ddt_bias = g[7]};
}

static void check_isa(const seg_case *c, const double *Pref, const double *Rref,
                      double *const ref[8], ls_isa isa, const char *what)
{
    float *P = tu_alloc_poisoned(c->n_state), *R = tu_alloc_poisoned(c->n_state);
    const linseq_exec one = {.threads = 1};
    CHECK_OK(ls_ssm1_segment_forward_isa(&c->p, &one, P, R, isa));
    const double eP = tu_rel_err_d(P, Pref, c->n_state), eR = tu_rel_err_d(R, Rref, c->n_state);
    CHECK(eP <= TOL && eR <= TOL, "%s [%s]: P err %.3g, R err %.3g", what, ls_isa_name(isa), eP,
          eR);
    /* the map against the forward from h0 */
    linseq_ssm1_problem from_h0 = c->p;
    from_h0.h0 = c->h0;
    float *y = tu_alloc(c->n_tok), *hT = tu_alloc(c->n_state);
    double *mapped = calloc(c->n_state, sizeof(double));
    CHECK_OK(ls_ssm1_forward_isa(&from_h0, &one, y, hT, isa));
    for (size_t i = 0; i < c->n_state; i++) mapped[i] = (double)P[i] * c->h0[i] + R[i];
    const double eS = tu_rel_err_d(hT, mapped, c->n_state);
    CHECK(eS <= TOL, "%s [%s]: P * h0 + R vs the forward: err %.3g", what, ls_isa_name(isa), eS);
    /* the backward, with 1 and 3 threads */
    static const char *const names[8] = {"dx", "dB", "dA", "dB", "dC", "dD", "dgate", "ddt_bias"};
    size_t n[8];
    grad_sizes(c, n);
    float *g1[8] = {0}, *g3[8] = {0};
    for (int i = 0; i < 8; i++) {
        const bool exists = (i != 5 && i != 6) || c->p.gate;
        if (exists && (i != 7 || c->p.dt_softplus))
            g1[i] = tu_alloc_poisoned(n[i]), g3[i] = tu_alloc_poisoned(n[i]);
    }
    const linseq_ssm1_grads a = grads_of(g1), b = grads_of(g3);
    const linseq_exec three = {.threads = 3};
    CHECK_OK(ls_ssm1_segment_backward_isa(&c->p, &one, c->up_P, c->up_R, &a, isa));
    CHECK_OK(ls_ssm1_segment_backward_isa(&c->p, &three, c->up_P, c->up_R, &b, isa));
    for (int i = 0; i < 8; i++) {
        if (!g1[i]) continue;
        const double e = tu_rel_err_d(g1[i], ref[i], n[i]);
        CHECK(e <= TOL, "%s [%s]: %s err %.3g", what, ls_isa_name(isa), i == 1 ? "ddt" : names[i],
              e);
        CHECK(tu_same_bits(g1[i], g3[i], n[i]), "%s [%s]: gradient %d differs with 3 threads", what,
              ls_isa_name(isa), i);
        free(g1[i]), free(g3[i]);
    }
    float *P3 = tu_alloc(c->n_state), *R3 = tu_alloc(c->n_state);
    const linseq_exec two = {.threads = 2};
    CHECK_OK(ls_ssm1_segment_forward_isa(&c->p, &two, P3, R3, isa));
    CHECK(tu_same_bits(P, P3, c->n_state) && tu_same_bits(R, R3, c->n_state),
          "%s [%s]: 2 threads differ from 1", what, ls_isa_name(isa));
    free(P), free(R), free(P3), free(R3), free(y), free(hT), free(mapped);
}

/* Central differences of the reference loss at a few elements of dt and A. */
static void check_finite_differences(seg_case *c, double *const ref[8], const char *what)
{
    float *const inputs[3] = {c->dt, c->A, c->x};
    const size_t counts[3] = {c->n_tok, (size_t)(c->p.D * c->p.N), c->n_tok};
    const int grad_of[3] = {1, 2, 0};
    for (int t = 0; t < 3; t++)
        for (int probe = 0; probe < 3; probe++) {
            const size_t at = (size_t)(probe * 7919 + 5) % counts[t];
            float *x = inputs[t] + at;
            const float x0 = *x, up = x0 + 1e-3f, down = x0 - 1e-3f;
            *x = up;
            const double Lu = reference_loss(c);
            *x = down;
            const double Ld = reference_loss(c);
            *x = x0;
            const double fd = (Lu - Ld) / ((double)up - (double)down), an = ref[grad_of[t]][at];
            CHECK(fabs(fd - an) <= 2e-3 * (1.0 + fabs(an)),
                  "%s: input %d [%zu]: finite difference %.6g, reference %.6g", what, t, at, fd,
                  an);
        }
}

/* [B,T,C] token-major -> [B,C,T] (C = channels times states). */
static float *to_channel_first(const float *src, int64_t B, int64_t T, int64_t C)
{
    float *dst = tu_alloc((size_t)(B * T * C));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < C; c++) dst[(b * C + c) * T + t] = src[(b * T + t) * C + c];
    return dst;
}

/* channel_first inputs give the token-major summary and gradients (transposed back). */
static void check_channel_first(const seg_case *c, ls_isa isa)
{
    const int64_t B = c->p.B, T = c->p.T, D = c->p.D, GN = c->p.G * c->p.N;
    linseq_ssm1_problem q = c->p;
    q.channel_first = true;
    float *x = to_channel_first(c->x, B, T, D), *dt = to_channel_first(c->dt, B, T, D);
    float *Bp = to_channel_first(c->Bp, B, T, GN), *Cp = to_channel_first(c->Cp, B, T, GN);
    q.x = x, q.dt = dt, q.B_proj = Bp, q.C_proj = Cp, q.gate = NULL, q.D_skip = NULL;
    float *P = tu_alloc(c->n_state), *R = tu_alloc(c->n_state);
    float *Pc = tu_alloc(c->n_state), *Rc = tu_alloc(c->n_state);
    float *ddt = tu_alloc(c->n_tok), *ddt_c = tu_alloc(c->n_tok);
    const linseq_exec one = {.threads = 1};
    linseq_ssm1_problem tm = c->p;
    tm.gate = NULL, tm.D_skip = NULL;
    CHECK_OK(ls_ssm1_segment_forward_isa(&tm, &one, P, R, isa));
    CHECK_OK(ls_ssm1_segment_forward_isa(&q, &one, Pc, Rc, isa));
    const linseq_ssm1_grads g = {.ddt = ddt}, gc = {.ddt = ddt_c};
    CHECK_OK(ls_ssm1_segment_backward_isa(&tm, &one, c->d_P, c->d_R, &g, isa));
    CHECK_OK(ls_ssm1_segment_backward_isa(&q, &one, c->d_P, c->d_R, &gc, isa));
    float *ddt_t = to_channel_first(ddt, B, T, D);
    CHECK(tu_rel_err(Pc, P, c->n_state) <= 1e-6 && tu_rel_err(Rc, R, c->n_state) <= 1e-5 &&
              tu_rel_err(ddt_c, ddt_t, c->n_tok) <= 1e-5,
          "[%s] channel_first differs from token-major", ls_isa_name(isa));
    free(x), free(dt), free(Bp), free(Cp), free(P), free(R), free(Pc), free(Rc), free(ddt);
    free(ddt_c), free(ddt_t);
}

/* A refused call: the status and a message naming the argument. */
static void expect(linseq_status got, linseq_status want, const char *needle, const char *what)
{
    CHECK(got == want && strstr(linseq_last_error(), needle), "%s: %s (%s), expected %s naming %s",
          what, linseq_status_string(got), linseq_last_error(), linseq_status_string(want), needle);
}

static void check_bad_inputs(void)
{
    seg_case c;
    make_case(&c, &CONFIGS[0], 3);
    float *P = tu_alloc(c.n_state), *R = tu_alloc(c.n_state), *dx = tu_alloc(c.n_tok);
    float *dh0 = tu_alloc(c.n_state);
    const size_t bytes[3] = {c.n_state * 4, c.n_state * 4, c.n_tok * 4};
    float *const outs[3] = {P, R, dx};
    for (int i = 0; i < 3; i++) tu_poison(outs[i], bytes[i]);
    linseq_ssm1_problem p = c.p;
    p.h0 = c.h0;
    expect(linseq_ssm1_segment_forward(&p, NULL, P, R), LINSEQ_ERR_INVALID_VALUE, "h0",
           "forward with h0");
    expect(linseq_ssm1_segment_forward(&c.p, NULL, NULL, R), LINSEQ_ERR_NULL_POINTER, "'P'",
           "forward without P");
    expect(linseq_ssm1_segment_forward(&c.p, NULL, P, c.x), LINSEQ_ERR_ALIASING, "'R'", "R over x");
    const linseq_exec cuda = {.device = LINSEQ_DEVICE_CUDA};
    expect(linseq_ssm1_segment_forward(&c.p, &cuda, P, R), LINSEQ_ERR_UNSUPPORTED, "CUDA",
           "forward on CUDA");
    p = c.p;
    p.N = 0;
    expect(linseq_ssm1_segment_forward(&p, NULL, P, R), LINSEQ_ERR_INVALID_SIZE, "N", "N = 0");
    linseq_ssm1_grads g = {.dx = dx, .dh0 = dh0};
    expect(linseq_ssm1_segment_backward(&c.p, NULL, c.d_P, c.d_R, &g), LINSEQ_ERR_INVALID_VALUE,
           "dh0", "backward with dh0");
    g.dh0 = NULL;
    g.ddt_bias = dh0;
    expect(linseq_ssm1_segment_backward(&c.p, NULL, c.d_P, c.d_R, &g), LINSEQ_ERR_INVALID_VALUE,
           "ddt_bias", "ddt_bias without softplus");
    expect(linseq_ssm1_segment_backward(&c.p, NULL, c.d_P, c.d_R, NULL), LINSEQ_ERR_NULL_POINTER,
           "grads", "no grads");
    g.ddt_bias = NULL;
    g.dx = c.x;
    expect(linseq_ssm1_segment_backward(&c.p, NULL, c.d_P, c.d_R, &g), LINSEQ_ERR_ALIASING, "'dx'",
           "dx over x");
    for (int i = 0; i < 3; i++) CHECK(tu_is_poisoned(outs[i], bytes[i]), "output %d written", i);
    free(P), free(R), free(dx), free(dh0);
    free_case(&c);
}

int main(void)
{
    tu_mark tally[LS_ISA_COUNT] = {{0}};
    for (size_t k = 0; k < sizeof CONFIGS / sizeof CONFIGS[0]; k++) {
        /* both upstream gradients, then each alone (the other NULL): each share on its own */
        for (int up = 0; up < 3; up++) {
            seg_case c;
            make_case(&c, &CONFIGS[k], 500 + k);
            c.up_P = up == 2 ? NULL : c.d_P;
            c.up_R = up == 1 ? NULL : c.d_R;
            if (up == 1) memset(c.d_R, 0, c.n_state * sizeof(float));
            if (up == 2) memset(c.d_P, 0, c.n_state * sizeof(float));
            double *Pref = calloc(c.n_state, sizeof(double)),
                   *Rref = calloc(c.n_state, sizeof(double));
            double *ref[8];
            reference_summary(&c, Pref, Rref);
            reference_grads(&c, ref);
            check_finite_differences(&c, ref, CONFIGS[k].name);
            for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
                if (!ls_isa_available((ls_isa)isa)) continue;
                const tu_mark mark = tu_mark_now();
                check_isa(&c, Pref, Rref, ref, (ls_isa)isa, CONFIGS[k].name);
                if (!CONFIGS[k].varlen) check_channel_first(&c, (ls_isa)isa);
                tu_tally_add(&tally[isa], mark);
            }
            for (int i = 0; i < 8; i++) free(ref[i]);
            free(Pref), free(Rref);
            free_case(&c);
        }
    }
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) continue;
        char label[64];
        snprintf(label, sizeof label, "ssm1 segment %s", ls_isa_name((ls_isa)isa));
        tu_report(label, tally[isa], "P, R, P * h0 + R and the backward vs double; threads");
    }
    check_bad_inputs();
    return tu_finish("test_ssm1_segment");
}
