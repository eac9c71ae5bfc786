/* linseq_kda_segment_forward / _backward: a segment's transition P and zero-start end state R.
 *   - P and R against the double reference recurrence (kda_ref.c) run from the start state
 *     [0 | I] with the values [v | 0]: its end state is [R | P] token by token;
 *   - the affine map itself: P S0 + R equals the forward's end state from S0;
 *   - the backward against the reference backward of that run, and against central
 *     differences of the reference's sum(P * d_P) + sum(R * d_R);
 *   - every option (decays down to -1000 and -inf, l2norm, logits, the gate, GVA, varlen with
 *     an empty sequence, V-first states), every ISA, chunk sizes 16 and 64, and 1/2/3 threads
 *     bitwise; bad inputs refused with nothing written. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kda/kda_internal.h"
#include "kda/kda_kernels.h"
#include "kda_fixture.h"
#include "simd/isa.h"
#include "testutil.h"

static const double TOL = 1e-4;

typedef struct {
    kda_fixture f;
    float *A_log, *dt_bias, *d_P, *d_R;
    int64_t HV, N, gK;
    size_t n_P, n_R;
    const float *up_P, *up_R; /* what the backward gets: d_P and d_R, or NULL where zeroed */
} seg_case;

typedef struct {
    const char *name;
    linseq_decay decay;
    gate_regime regime;
    bool l2norm, v_first, varlen, gate, logit;
    int64_t H, HV, K, V;
} config;

static const config CONFIGS[] = {
    {"plain delta rule", LINSEQ_DECAY_NONE, GATE_ZERO, false, false, false, false, false, 1, 1, 8,
     8},
    {"per-head, l2norm", LINSEQ_DECAY_PER_HEAD, GATE_RAND, true, false, false, false, false, 2, 2,
     16, 12},
    {"per-channel GVA V-first", LINSEQ_DECAY_PER_CHANNEL, GATE_RAND, true, true, false, false,
     false, 1, 2, 12, 20},
    {"per-channel extreme varlen", LINSEQ_DECAY_PER_CHANNEL, GATE_EXTREME, true, false, true, false,
     false, 1, 2, 16, 8},
    {"per-head extreme logits", LINSEQ_DECAY_PER_HEAD, GATE_EXTREME, false, false, false, false,
     true, 1, 1, 8, 16},
    {"per-channel gate in kernel", LINSEQ_DECAY_PER_CHANNEL, GATE_RAND, true, false, true, true,
     false, 2, 2, 8, 8},
};

static const int64_t CU[] = {0, 21, 21, 90}; /* one empty sequence */

static void make_case(seg_case *c, const config *cf, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    const kda_spec s = {.B = cf->varlen ? 1 : 2,
                        .T = cf->varlen ? CU[3] : 45,
                        .H = cf->H,
                        .HV = cf->HV,
                        .K = cf->K,
                        .V = cf->V,
                        .decay = cf->decay,
                        .l2norm = cf->l2norm,
                        .with_h0 = true, /* the start state of the affine check */
                        .v_first = cf->v_first,
                        .gmag = 0.3,
                        .regime = cf->regime,
                        .n_seqs = cf->varlen ? 3 : 0,
                        .cu = cf->varlen ? CU : NULL,
                        .seed = seed};
    kda_fixture_make(&c->f, &s);
    c->f.p.h0 = NULL;
    c->HV = cf->HV, c->N = c->f.n_rows;
    c->gK = cf->decay == LINSEQ_DECAY_PER_CHANNEL ? cf->K : 1;
    c->n_P = (size_t)(c->N * c->HV * cf->K * cf->K);
    c->n_R = c->f.n_state;
    tu_rng r = {seed + 77};
    if (cf->logit) {
        tu_fill_normal(&r, c->f.beta, c->f.n_beta, 1.5);
        c->f.p.beta_is_logit = true;
    }
    if (cf->gate) {
        c->A_log = tu_alloc((size_t)c->HV);
        c->dt_bias = tu_alloc((size_t)(c->HV * c->gK));
        tu_fill_uniform(&r, c->A_log, (size_t)c->HV, -1.0, 1.0);
        tu_fill_uniform(&r, c->dt_bias, (size_t)(c->HV * c->gK), -0.5, 0.5);
        tu_fill_normal(&r, c->f.g, c->f.n_g, 1.0);
        c->f.p.gate_in_kernel = true;
        c->f.p.A_log = c->A_log;
        c->f.p.dt_bias = c->dt_bias;
    }
    c->d_P = tu_alloc(c->n_P);
    c->d_R = tu_alloc(c->n_R);
    tu_fill_normal(&r, c->d_P, c->n_P, 1.0);
    tu_fill_normal(&r, c->d_R, c->n_R, 1.0);
    c->up_P = c->d_P, c->up_R = c->d_R;
}

static void free_case(seg_case *c)
{
    free(c->A_log), free(c->dt_bias), free(c->d_P), free(c->d_R);
    kda_fixture_free(&c->f);
}

/* The reference's widened run: values [v | 0] from [0 | I] (K-major, V+K columns), and the
 * upstream [d_R | d_P] of its end state. The caller frees the three buffers. */
typedef struct {
    linseq_kda_problem p;
    float *v, *h0, *d_ht;
} wide_run;

static void wide_make(wide_run *w, const seg_case *c)
{
    const linseq_kda_problem *p = &c->f.p;
    const int64_t K = p->K, V = p->V, Vw = V + K, rows = p->B * p->T * c->HV;
    w->p = *p;
    w->p.V = Vw;
    w->p.state_v_first = false;
    w->v = tu_alloc((size_t)(rows * Vw));
    w->h0 = tu_alloc((size_t)(c->N * c->HV * K * Vw));
    w->d_ht = tu_alloc((size_t)(c->N * c->HV * K * Vw));
    for (int64_t r = 0; r < rows; r++) memcpy(w->v + r * Vw, p->v + r * V, sizeof(float) * V);
    for (int64_t s = 0; s < c->N * c->HV; s++)
        for (int64_t i = 0; i < K; i++) {
            w->h0[(s * K + i) * Vw + V + i] = 1.0f;
            for (int64_t j = 0; j < V; j++)
                w->d_ht[(s * K + i) * Vw + j] =
                    p->state_v_first ? c->d_R[(s * V + j) * K + i] : c->d_R[(s * K + i) * V + j];
            for (int64_t j = 0; j < K; j++)
                w->d_ht[(s * K + i) * Vw + V + j] = c->d_P[(s * K + i) * K + j];
        }
    w->p.v = w->v;
    w->p.h0 = w->h0;
}

static void wide_free(wide_run *w) { free(w->v), free(w->h0), free(w->d_ht); }

/* P and R (in the problem's state layout) of the reference, in double. */
static void reference_summary(const seg_case *c, double *P, double *R)
{
    wide_run w;
    wide_make(&w, c);
    const int64_t K = c->f.p.K, V = c->f.p.V, Vw = V + K;
    double *o = calloc((size_t)(c->f.p.B * c->f.p.T * c->HV * Vw), sizeof(double));
    double *ht = calloc((size_t)(c->N * c->HV * K * Vw), sizeof(double));
    if (!o || !ht) abort();
    CHECK_OK(ls_kda_reference_f64(&w.p, o, ht));
    for (int64_t s = 0; s < c->N * c->HV; s++)
        for (int64_t i = 0; i < K; i++) {
            for (int64_t j = 0; j < V; j++) {
                const int64_t at = c->f.p.state_v_first ? (s * V + j) * K + i : (s * K + i) * V + j;
                R[at] = ht[(s * K + i) * Vw + j];
            }
            for (int64_t j = 0; j < K; j++) P[(s * K + i) * K + j] = ht[(s * K + i) * Vw + V + j];
        }
    free(o), free(ht);
    wide_free(&w);
}

/* sum(P * d_P) + sum(R * d_R) of the reference. */
static double reference_loss(const seg_case *c)
{
    double *P = calloc(c->n_P, sizeof(double)), *R = calloc(c->n_R, sizeof(double));
    if (!P || !R) abort();
    reference_summary(c, P, R);
    double L = 0.0;
    for (size_t i = 0; i < c->n_P; i++) L += P[i] * c->d_P[i];
    for (size_t i = 0; i < c->n_R; i++) L += R[i] * c->d_R[i];
    free(P), free(R);
    return L;
}

/* P S0 + R for the fixture's S0 (state layout), in double from the float summary. */
static void apply_summary(const seg_case *c, const float *P, const float *R, double *out)
{
    const int64_t K = c->f.p.K, V = c->f.p.V;
    const bool vf = c->f.p.state_v_first;
    for (int64_t s = 0; s < c->N * c->HV; s++)
        for (int64_t i = 0; i < K; i++)
            for (int64_t j = 0; j < V; j++) {
                const int64_t at = vf ? (s * V + j) * K : (s * K + i) * V;
                double acc = R[vf ? at + i : at + j];
                for (int64_t l = 0; l < K; l++) {
                    const float s0 =
                        vf ? c->f.h0[(s * V + j) * K + l] : c->f.h0[(s * K + l) * V + j];
                    acc += (double)P[(s * K + i) * K + l] * s0;
                }
                out[vf ? at + i : at + j] = acc;
            }
}

static void check_forward(const seg_case *c, const double *Pref, const double *Rref, ls_isa isa,
                          int chunk, const char *what)
{
    float *P = tu_alloc_poisoned(c->n_P), *R = tu_alloc_poisoned(c->n_R);
    const linseq_exec ex = {.chunk_size = chunk, .threads = 1};
    CHECK_OK(ls_kda_segment_forward_isa(&c->f.p, &ex, P, R, isa));
    const double eP = tu_rel_err_d(P, Pref, c->n_P), eR = tu_rel_err_d(R, Rref, c->n_R);
    CHECK(eP <= TOL && eR <= TOL, "%s [%s, chunk %d]: P err %.3g, R err %.3g", what,
          ls_isa_name(isa), chunk, eP, eR);
    /* the map: P S0 + R against the forward from S0 */
    linseq_kda_problem from_s0 = c->f.p;
    from_s0.h0 = c->f.h0;
    float *o = tu_alloc(c->f.n_v), *ht = tu_alloc(c->n_R);
    double *mapped = calloc(c->n_R, sizeof(double));
    CHECK_OK(ls_kda_forward_isa(&from_s0, &ex, o, ht, isa));
    apply_summary(c, P, R, mapped);
    const double eS = tu_rel_err_d(ht, mapped, c->n_R);
    CHECK(eS <= TOL, "%s [%s, chunk %d]: P S0 + R vs the forward's end state: err %.3g", what,
          ls_isa_name(isa), chunk, eS);
    /* bitwise for any thread count */
    for (int threads = 2; threads <= 3; threads++) {
        float *P2 = tu_alloc(c->n_P), *R2 = tu_alloc(c->n_R);
        const linseq_exec ex2 = {.chunk_size = chunk, .threads = threads};
        CHECK_OK(ls_kda_segment_forward_isa(&c->f.p, &ex2, P2, R2, isa));
        CHECK(tu_same_bits(P, P2, c->n_P) && tu_same_bits(R, R2, c->n_R),
              "%s [%s]: %d threads differ from 1", what, ls_isa_name(isa), threads);
        free(P2), free(R2);
    }
    free(P), free(R), free(o), free(ht), free(mapped);
}

/* Elements of dq dk dv dbeta dg dA_log ddt_bias. */
static void grad_sizes(const seg_case *c, size_t n[7])
{
    const size_t s[7] = {c->f.n_qk,
                         c->f.n_qk,
                         c->f.n_v,
                         c->f.n_beta,
                         c->f.n_g,
                         (size_t)c->HV,
                         (size_t)(c->HV * c->gK)};
    memcpy(n, s, sizeof s);
}

static linseq_kda_grads grads_of(float *const out[7])
{
    return (linseq_kda_grads){.dq = out[0],
                              .dk = out[1],
                              .dv = out[2],
                              .dbeta = out[3],
                              .dg = out[4],
                              .dA_log = out[5],
                              .ddt_bias = out[6]};
}

/* The reference gradients of the widened run (dv cut to V columns), in double. */
static void reference_grads(const seg_case *c, double *ref[7])
{
    const int64_t K = c->f.p.K, V = c->f.p.V, Vw = V + K, rows = c->f.p.B * c->f.p.T * c->HV;
    wide_run w;
    wide_make(&w, c);
    size_t n[7];
    grad_sizes(c, n);
    double *dv_wide = calloc((size_t)(rows * Vw), sizeof(double));
    double *dh0 = calloc((size_t)(c->N * c->HV * K * Vw), sizeof(double));
    for (int i = 0; i < 7; i++) ref[i] = calloc(n[i] + 1, sizeof(double));
    float *d_o = tu_alloc((size_t)(rows * Vw));
    const ls_kda_ref_grads g = {ref[0], ref[1], dv_wide, ref[3], ref[4], dh0, ref[5], ref[6]};
    CHECK_OK(ls_kda_reference_backward(&w.p, d_o, w.d_ht, &g));
    for (int64_t r = 0; r < rows; r++)
        memcpy(ref[2] + r * V, dv_wide + r * Vw, sizeof(double) * (size_t)V);
    free(dv_wide), free(dh0), free(d_o);
    wide_free(&w);
}

static void check_backward(const seg_case *c, double *const ref[7], ls_isa isa, int chunk,
                           const char *what)
{
    static const char *const names[7] = {"dq", "dk", "dv", "dbeta", "dg", "dA_log", "ddt_bias"};
    size_t n[7];
    grad_sizes(c, n);
    float *out[7] = {0}, *again[7] = {0};
    for (int i = 0; i < 7; i++)
        if (n[i] && (i < 5 || c->f.p.gate_in_kernel)) {
            out[i] = tu_alloc_poisoned(n[i]);
            again[i] = tu_alloc_poisoned(n[i]);
        }
    const linseq_kda_grads g = grads_of(out), g2 = grads_of(again);
    const linseq_exec ex = {.chunk_size = chunk, .threads = 1},
                      ex3 = {.chunk_size = chunk, .threads = 3};
    CHECK_OK(ls_kda_segment_backward_isa(&c->f.p, &ex, c->up_P, c->up_R, &g, isa));
    CHECK_OK(ls_kda_segment_backward_isa(&c->f.p, &ex3, c->up_P, c->up_R, &g2, isa));
    for (int i = 0; i < 7; i++) {
        if (!out[i]) continue;
        const double e = tu_rel_err_d(out[i], ref[i], n[i]);
        bool zero = true;
        for (size_t k = 0; i == 0 && k < n[i]; k++) zero = zero && out[i][k] == 0.0f;
        CHECK(i == 0 ? zero : e <= TOL, "%s [%s, chunk %d]: %s err %.3g", what, ls_isa_name(isa),
              chunk, names[i], e);
        CHECK(tu_same_bits(out[i], again[i], n[i]), "%s [%s]: %s differs with 3 threads", what,
              ls_isa_name(isa), names[i]);
        free(out[i]), free(again[i]);
    }
}

/* Central differences of the reference's loss at a few elements of k, v, beta and g: the
 * reference gradients (the widened run) are the loss's. */
static void check_finite_differences(seg_case *c, double *const ref[7], const char *what)
{
    float *const inputs[4] = {c->f.k, c->f.v, c->f.beta, c->f.g};
    const size_t counts[4] = {c->f.n_qk, c->f.n_v, c->f.n_beta, c->f.n_g};
    const int grad_of[4] = {1, 2, 3, 4};
    static const char *const names[4] = {"k", "v", "beta", "g"};
    for (int t = 0; t < 4; t++) {
        for (int probe = 0; probe < 3 && inputs[t]; probe++) {
            const size_t at = (size_t)(probe * 7919 + 13) % counts[t];
            float *x = inputs[t] + at;
            const float x0 = *x;
            if (!isfinite(x0) || x0 < -100.0f) continue; /* -inf and -1000 have no neighbourhood */
            const float up = x0 + 1e-2f, down = x0 - 1e-2f;
            *x = up;
            const double Lu = reference_loss(c);
            *x = down;
            const double Ld = reference_loss(c);
            *x = x0;
            const double fd = (Lu - Ld) / ((double)up - (double)down);
            const double an = ref[grad_of[t]][at];
            CHECK(fabs(fd - an) <= 2e-3 * (1.0 + fabs(an)),
                  "%s: d/d%s[%zu]: finite difference %.6g, reference backward %.6g", what, names[t],
                  at, fd, an);
        }
    }
}

/* up: 0 both upstream gradients, 1 d_P alone (d_R NULL), 2 d_R alone (d_P NULL). */
static void check_config(const config *cf, uint64_t seed, int up, tu_mark *tally)
{
    seg_case c;
    make_case(&c, cf, seed);
    if (up == 1) memset(c.d_R, 0, c.n_R * sizeof(float)), c.up_R = NULL;
    if (up == 2) memset(c.d_P, 0, c.n_P * sizeof(float)), c.up_P = NULL;
    double *Pref = calloc(c.n_P, sizeof(double)), *Rref = calloc(c.n_R, sizeof(double));
    double *ref[7];
    reference_summary(&c, Pref, Rref);
    reference_grads(&c, ref);
    check_finite_differences(&c, ref, cf->name);
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) continue;
        const tu_mark mark = tu_mark_now();
        for (int chunk = 16; chunk <= 64; chunk *= 4) {
            check_forward(&c, Pref, Rref, (ls_isa)isa, chunk, cf->name);
            check_backward(&c, ref, (ls_isa)isa, chunk, cf->name);
        }
        tu_tally_add(&tally[isa], mark);
    }
    for (int i = 0; i < 7; i++) free(ref[i]);
    free(Pref), free(Rref);
    free_case(&c);
}

/* A refused call: the status, a message naming the argument, every output unchanged. */
static void expect_refused(linseq_status st, linseq_status want, const char *needle,
                           float *const outs[], const size_t bytes[], int n_out, const char *what)
{
    CHECK(st == want && strstr(linseq_last_error(), needle), "%s: %s (%s); expected %s naming '%s'",
          what, linseq_status_string(st), linseq_last_error(), linseq_status_string(want), needle);
    for (int i = 0; i < n_out; i++)
        CHECK(!outs[i] || tu_is_poisoned(outs[i], bytes[i]), "%s: output %d written", what, i);
}

static void check_bad_inputs(void)
{
    seg_case c;
    make_case(&c, &CONFIGS[1], 5);
    float *P = tu_alloc(c.n_P), *R = tu_alloc(c.n_R), *dk = tu_alloc(c.f.n_qk);
    float *dg = tu_alloc(c.f.n_g), *dh0 = tu_alloc(c.n_R);
    float *const outs[] = {P, R, dk, dg};
    const size_t bytes[] = {c.n_P * 4, c.n_R * 4, c.f.n_qk * 4, c.f.n_g * 4};
    for (int i = 0; i < 4; i++) tu_poison(outs[i], bytes[i]);
    linseq_kda_problem p = c.f.p;
    p.h0 = c.f.h0;
    expect_refused(linseq_kda_segment_forward(&p, NULL, P, R), LINSEQ_ERR_INVALID_VALUE, "h0", outs,
                   bytes, 4, "forward with h0");
    expect_refused(linseq_kda_segment_forward(&c.f.p, NULL, NULL, R), LINSEQ_ERR_NULL_POINTER,
                   "'P'", outs, bytes, 4, "forward without P");
    const linseq_exec bad_chunk = {.chunk_size = 48}, cuda = {.device = LINSEQ_DEVICE_CUDA};
    expect_refused(linseq_kda_segment_forward(&c.f.p, &bad_chunk, P, R), LINSEQ_ERR_INVALID_VALUE,
                   "chunk_size", outs, bytes, 4, "forward with chunk 48");
    expect_refused(linseq_kda_segment_forward(&c.f.p, &cuda, P, R), LINSEQ_ERR_UNSUPPORTED, "CUDA",
                   outs, bytes, 4, "forward on CUDA");
    p = c.f.p;
    p.K = 0;
    expect_refused(linseq_kda_segment_forward(&p, NULL, P, R), LINSEQ_ERR_INVALID_SIZE, "K", outs,
                   bytes, 4, "forward with K = 0");
    expect_refused(linseq_kda_segment_forward(&c.f.p, NULL, P, (float *)c.f.v), LINSEQ_ERR_ALIASING,
                   "'R'", outs, bytes, 4, "R over v");
    expect_refused(linseq_kda_segment_backward(&c.f.p, NULL, c.d_P, c.d_R, NULL),
                   LINSEQ_ERR_NULL_POINTER, "grads", outs, bytes, 4, "backward without grads");
    linseq_kda_grads g = {.dk = dk, .dg = dg, .dh0 = dh0};
    expect_refused(linseq_kda_segment_backward(&c.f.p, NULL, c.d_P, c.d_R, &g),
                   LINSEQ_ERR_INVALID_VALUE, "dh0", outs, bytes, 4, "backward with dh0");
    g.dh0 = NULL;
    g.dA_log = dh0;
    expect_refused(linseq_kda_segment_backward(&c.f.p, NULL, c.d_P, c.d_R, &g),
                   LINSEQ_ERR_INVALID_VALUE, "dA_log", outs, bytes, 4, "dA_log without the gate");
    g.dA_log = NULL;
    g.dk = (float *)c.f.k;
    expect_refused(linseq_kda_segment_backward(&c.f.p, NULL, c.d_P, c.d_R, &g), LINSEQ_ERR_ALIASING,
                   "'dk'", outs, bytes, 4, "dk over k");
    g.dk = dk;
    p = c.f.p;
    p.h0 = c.f.h0;
    expect_refused(linseq_kda_segment_backward(&p, NULL, c.d_P, c.d_R, &g),
                   LINSEQ_ERR_INVALID_VALUE, "h0", outs, bytes, 4, "backward with h0");
    /* absent upstream gradients are zeros: every gradient zero */
    CHECK_OK(linseq_kda_segment_backward(&c.f.p, NULL, NULL, NULL, &g));
    bool zero = true;
    for (size_t i = 0; i < c.f.n_qk; i++) zero = zero && dk[i] == 0.0f;
    CHECK(zero, "no upstream gradient: dk not zero");
    free(P), free(R), free(dk), free(dg), free(dh0);
    free_case(&c);
}

int main(void)
{
    tu_mark tally[LS_ISA_COUNT] = {{0}};
    for (size_t i = 0; i < sizeof CONFIGS / sizeof CONFIGS[0]; i++)
        for (int up = 0; up < 3; up++) check_config(&CONFIGS[i], 4200 + i, up, tally);
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) continue;
        char label[64];
        snprintf(label, sizeof label, "kda segment %s", ls_isa_name((ls_isa)isa));
        tu_report(label, tally[isa], "P, R, P S0 + R and the backward vs double; 1/2/3 threads");
    }
    check_bad_inputs();
    return tu_finish("test_kda_segment");
}
