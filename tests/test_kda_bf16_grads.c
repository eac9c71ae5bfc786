/* KDA's chunked backward with bf16 products (exec->products = LINSEQ_PRODUCTS_BF16).
 *
 * Properties, on every ISA (each with its own float32 run as the baseline), chunks 16 and 64,
 * per-head and per-channel decay, with and without the delta rule, grouped value heads, odd
 * sizes, varlen, the gate in the kernel:
 *   - dq, dk, dbeta, dg (and the summed dA_log, ddt_bias) within a bf16 bound of the float64
 *     reference backward, while the float32 products stay far inside it (so the check tells
 *     the two apart), and dq differs from the float32 products' bits (the option took effect);
 *   - dh0 and dv, which only the float32 chain of the state's gradient produces, bit for bit
 *     the float32 products' gradients;
 *   - the same bits on 1, 2 and 3 threads, and with the training forward's saved block;
 *   - recurrent mode: the option changes no bit.
 * The products themselves are the same bits on every ISA, vdpbf16ps or widened operands
 * (tests/test_bf16_products.c); the gradients around them are not: the float32 parts of the
 * backward sum in ISA-dependent orders, so each ISA is judged against float64 on its own. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kda/kda_internal.h"
#include "kda/kda_kernels.h"
#include "kda_fixture.h"
#include "simd/isa.h"
#include "testutil.h"

/* Gradient error bound, relative to the gradient's max |reference|: each product with bf16
 * operands is off by at most 2^-7 of the sum of |terms| behind an element, and these sums
 * stay within a few max |gradient| here (normalised q and k, decays <= 1). dg sums such
 * terms once more over the chunk's later rows (dg_t = sum_{r >= t} dG_r), so it gets twice
 * the bound. Measured at most: see the report line. */
#define GRAD_BOUND 1e-2
/* The float32 products on the same cases stay under this (test_kda_grad.c asserts 2e-5 on
 * its own cases): a bf16 error must be well above it to be told apart. */
#define F32_BOUND 1e-4

enum { N_GRADS = 8 };
static const char *const grad_names[N_GRADS] = {"dq", "dk",  "dv",     "dbeta",
                                                "dg", "dh0", "dA_log", "ddt_bias"};
/* dv and dh0 come from the float32 chain of the state's gradient alone */
static const bool state_side[N_GRADS] = {false, false, true, false, false, true, false, false};

static double worst_err[LS_ISA_COUNT][N_GRADS], worst_err32[LS_ISA_COUNT][N_GRADS];

typedef struct {
    kda_fixture f;
    float *d_o, *d_ht, *A_log, *dt_bias;
    size_t n[N_GRADS];
    double *ref[N_GRADS];
} grad_case;

typedef struct {
    float *g[N_GRADS];
    linseq_kda_grads grads;
} grads;

static void make_case(grad_case *c, const kda_spec *s, bool gate)
{
    memset(c, 0, sizeof *c);
    kda_fixture_make(&c->f, s);
    const int64_t HV = s->HV ? s->HV : s->H;
    const int64_t gK = s->decay == LINSEQ_DECAY_PER_CHANNEL ? s->K : 1;
    tu_rng r = {s->seed + 500};
    c->d_o = tu_alloc(c->f.n_v);
    tu_fill_normal(&r, c->d_o, c->f.n_v, 1.0);
    c->d_ht = tu_alloc(c->f.n_state);
    tu_fill_normal(&r, c->d_ht, c->f.n_state, 1.0);
    if (gate) {
        c->A_log = tu_alloc((size_t)HV);
        c->dt_bias = tu_alloc((size_t)(HV * gK));
        for (int64_t i = 0; i < HV; i++) c->A_log[i] = (float)tu_uniform(&r, -1.0, 1.0);
        tu_fill_normal(&r, c->dt_bias, (size_t)(HV * gK), 0.5);
        tu_fill_normal(&r, c->f.g, c->f.n_g, 1.0); /* raw gate input */
        c->f.p.gate_in_kernel = true;
        c->f.p.A_log = c->A_log;
        c->f.p.dt_bias = c->dt_bias;
    }
    const bool decay = s->decay != LINSEQ_DECAY_NONE;
    const size_t n[N_GRADS] = {c->f.n_qk,
                               c->f.n_qk,
                               c->f.n_v,
                               s->no_delta ? 0 : c->f.n_beta,
                               decay ? c->f.n_g : 0,
                               c->f.n_state,
                               gate ? (size_t)HV : 0,
                               gate ? (size_t)(HV * gK) : 0};
    for (int i = 0; i < N_GRADS; i++) {
        c->n[i] = n[i];
        c->ref[i] = n[i] ? calloc(n[i], sizeof(double)) : NULL;
        if (n[i] && !c->ref[i]) abort();
    }
    const ls_kda_ref_grads ref = {.dq = c->ref[0],
                                  .dk = c->ref[1],
                                  .dv = c->ref[2],
                                  .dbeta = c->ref[3],
                                  .dg = c->ref[4],
                                  .dh0 = c->ref[5],
                                  .dA_log = c->ref[6],
                                  .ddt_bias = c->ref[7]};
    CHECK_OK(ls_kda_reference_backward(&c->f.p, c->d_o, c->d_ht, &ref));
}

static void free_case(grad_case *c)
{
    for (int i = 0; i < N_GRADS; i++) free(c->ref[i]);
    free(c->d_o), free(c->d_ht), free(c->A_log), free(c->dt_bias);
    kda_fixture_free(&c->f);
}

static void grads_alloc(grads *g, const grad_case *c)
{
    for (int i = 0; i < N_GRADS; i++) g->g[i] = c->n[i] ? tu_alloc_poisoned(c->n[i]) : NULL;
    g->grads = (linseq_kda_grads){.dq = g->g[0],
                                  .dk = g->g[1],
                                  .dv = g->g[2],
                                  .dbeta = g->g[3],
                                  .dg = g->g[4],
                                  .dh0 = g->g[5],
                                  .dA_log = g->g[6],
                                  .ddt_bias = g->g[7]};
}

static void grads_free(grads *g)
{
    for (int i = 0; i < N_GRADS; i++) free(g->g[i]);
}

static bool same_grads(const grads *a, const grads *b, const grad_case *c)
{
    for (int i = 0; i < N_GRADS; i++)
        if (!tu_same_bits(a->g[i], b->g[i], c->n[i])) return false;
    return true;
}

static linseq_exec exec_of(int chunk, int threads, linseq_products products)
{
    return (linseq_exec){.mode = chunk ? LINSEQ_MODE_CHUNKED : LINSEQ_MODE_RECURRENT,
                         .chunk_size = chunk ? chunk : 16,
                         .threads = threads,
                         .products = products};
}

/* The backward through the training forward's saved block, with the same exec. */
static void backward_saved(const grad_case *c, const linseq_exec *ex, ls_isa isa, grads *g)
{
    size_t bytes = 0;
    CHECK_OK(linseq_kda_saved_size(&c->f.p, ex, &bytes));
    void *saved = malloc(bytes);
    float *o = tu_alloc(c->f.n_v), *ht = tu_alloc(c->f.n_state);
    if (!saved) abort();
    CHECK_OK(ls_kda_forward_train_isa(&c->f.p, ex, o, ht, saved, bytes, isa));
    CHECK_OK(ls_kda_backward_saved_isa(&c->f.p, ex, saved, bytes, c->d_o, c->d_ht, &g->grads, isa));
    free(saved), free(o), free(ht);
}

static void check_case(const char *name, const grad_case *c, ls_isa isa, int chunk)
{
    char label[160];
    snprintf(label, sizeof label, "%s [%s, chunk %d]", name, ls_isa_name(isa), chunk);
    grads g32, g1, g;
    grads_alloc(&g32, c), grads_alloc(&g1, c), grads_alloc(&g, c);
    linseq_exec ex = exec_of(chunk, 1, LINSEQ_PRODUCTS_F32);
    CHECK_OK(ls_kda_backward_isa(&c->f.p, &ex, c->d_o, c->d_ht, &g32.grads, isa));
    ex.products = LINSEQ_PRODUCTS_BF16;
    CHECK_OK(ls_kda_backward_isa(&c->f.p, &ex, c->d_o, c->d_ht, &g1.grads, isa));

    for (int i = 0; i < N_GRADS; i++) {
        if (!c->n[i]) continue;
        const double e32 = tu_rel_err_d(g32.g[i], c->ref[i], c->n[i]);
        const double e = tu_rel_err_d(g1.g[i], c->ref[i], c->n[i]);
        const double bound = i == 4 || i >= 6 ? 2 * GRAD_BOUND : GRAD_BOUND;
        CHECK(e32 <= F32_BOUND, "%s: %s float32 products err %.3g (bound %g)", label, grad_names[i],
              e32, F32_BOUND);
        CHECK(e <= bound, "%s: %s bf16 products err %.3g (bound %g)", label, grad_names[i], e,
              bound);
        if (state_side[i])
            CHECK(tu_same_bits(g1.g[i], g32.g[i], c->n[i]),
                  "%s: %s is not the float32 products' bits", label, grad_names[i]);
        if (e > worst_err[isa][i]) worst_err[isa][i] = e;
        if (e32 > worst_err32[isa][i]) worst_err32[isa][i] = e32;
    }
    CHECK(!tu_same_bits(g1.g[0], g32.g[0], c->n[0]), "%s: bf16 products left dq unchanged", label);

    for (int threads = 2; threads <= 3; threads++) {
        ex.threads = threads;
        CHECK_OK(ls_kda_backward_isa(&c->f.p, &ex, c->d_o, c->d_ht, &g.grads, isa));
        CHECK(same_grads(&g, &g1, c), "%s: %d threads changed the gradients' bits", label, threads);
    }
    ex.threads = 1;
    backward_saved(c, &ex, isa, &g);
    CHECK(same_grads(&g, &g1, c), "%s: the saved block's backward differs", label);
    grads_free(&g32), grads_free(&g1), grads_free(&g);
}

/* Recurrent mode has no such products: the option changes no bit. */
static void check_recurrent(const grad_case *c, ls_isa isa)
{
    grads a, b;
    grads_alloc(&a, c), grads_alloc(&b, c);
    linseq_exec ex = exec_of(0, 1, LINSEQ_PRODUCTS_F32);
    CHECK_OK(ls_kda_backward_isa(&c->f.p, &ex, c->d_o, c->d_ht, &a.grads, isa));
    ex.products = LINSEQ_PRODUCTS_BF16;
    CHECK_OK(ls_kda_backward_isa(&c->f.p, &ex, c->d_o, c->d_ht, &b.grads, isa));
    CHECK(same_grads(&a, &b, c), "%s recurrent mode: bf16 products changed the gradients",
          ls_isa_name(isa));
    grads_free(&a), grads_free(&b);
}

typedef struct {
    const char *name;
    kda_spec s;
    bool gate;
} named_case;

int main(void)
{
    static const int64_t cu[] = {0, 50, 51, 150};
    const named_case cases[] = {
        {"GDN 128x128 per-head",
         {.B = 1,
          .T = 150,
          .H = 2,
          .K = 128,
          .V = 128,
          .decay = LINSEQ_DECAY_PER_HEAD,
          .l2norm = true,
          .with_h0 = true,
          .gmag = 0.02,
          .regime = GATE_RAND,
          .seed = 11},
         false},
        {"KDA 128x128 per-channel, grouped",
         {.B = 1,
          .T = 140,
          .H = 1,
          .HV = 2,
          .K = 128,
          .V = 128,
          .decay = LINSEQ_DECAY_PER_CHANNEL,
          .l2norm = true,
          .with_h0 = true,
          .gmag = 0.05,
          .regime = GATE_RAND,
          .seed = 12},
         false},
        {"KDA per-channel, gate in the kernel",
         {.B = 2,
          .T = 70,
          .H = 2,
          .K = 64,
          .V = 64,
          .decay = LINSEQ_DECAY_PER_CHANNEL,
          .l2norm = true,
          .with_h0 = true,
          .seed = 13},
         true},
        {"odd sizes, varlen",
         {.B = 1,
          .T = 150,
          .H = 2,
          .K = 33,
          .V = 37,
          .decay = LINSEQ_DECAY_PER_CHANNEL,
          .l2norm = true,
          .gmag = 0.1,
          .regime = GATE_RAND,
          .n_seqs = 3,
          .cu = cu,
          .seed = 14},
         false},
        {"gated linear attention, V-first",
         {.B = 2,
          .T = 75,
          .H = 2,
          .K = 48,
          .V = 64,
          .decay = LINSEQ_DECAY_PER_HEAD,
          .l2norm = true,
          .with_h0 = true,
          .v_first = true,
          .no_delta = true,
          .gmag = 0.05,
          .regime = GATE_RAND,
          .seed = 15},
         false},
    };
    enum { N_CASES = sizeof cases / sizeof *cases };
    grad_case gc[N_CASES];
    for (size_t i = 0; i < N_CASES; i++) make_case(&gc[i], &cases[i].s, cases[i].gate);
    static const int chunks[] = {16, 64};
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) {
            printf("  %s: not available on this CPU or build\n", ls_isa_name((ls_isa)isa));
            continue;
        }
        const tu_mark mark = tu_mark_now();
        for (size_t i = 0; i < N_CASES; i++)
            for (int ci = 0; ci < 2; ci++)
                check_case(cases[i].name, &gc[i], (ls_isa)isa, chunks[ci]);
        check_recurrent(&gc[1], (ls_isa)isa);
        tu_mark tally = {0};
        tu_tally_add(&tally, mark);
        char detail[512];
        int at = snprintf(detail, sizeof detail, "worst error, float32 / bf16 products:");
        for (int i = 0; i < N_GRADS; i++)
            at += snprintf(detail + at, sizeof detail - (size_t)at, " %s %.1e / %.1e",
                           grad_names[i], worst_err32[isa][i], worst_err[isa][i]);
        snprintf(detail + at, sizeof detail - (size_t)at, "%s",
                 isa == LS_ISA_AVX512 && ls_cpu_has_bf16_dot() ? ", on vdpbf16ps" : "");
        tu_report(ls_isa_name((ls_isa)isa), tally, detail);
    }
    for (size_t i = 0; i < N_CASES; i++) free_case(&gc[i]);
    return tu_finish("test_kda_bf16_grads");
}
