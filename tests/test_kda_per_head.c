/* KDA chunked forward with one decay per head (Gated DeltaNet): the chunk's decay masks are
 * then scalars per (row, column) and the kernels take their own path for them (plain products
 * of q and k over the lower triangle, one mask row per token). Checked on every ISA and chunk
 * size, with T not a multiple of the chunk, against
 *   - the float64 reference,
 *   - the recurrent mode of the same ISA,
 *   - the per-channel chunked path fed the same decay on every channel (the general
 *     machinery, an independent route to the same numbers),
 * for decays from none to -1000 and -inf per token, including Gated DeltaNet's hard regime;
 * and bitwise identical for 1, 2 and 3 threads, one item per thread or one item shared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kda/kda_internal.h"
#include "kda/kda_kernels.h"
#include "kda_fixture.h"
#include "simd/isa.h"
#include "testutil.h"

/* The float32-vs-float64 bound test_kda.c uses for every chunked case. */
static const double TOL = 2e-5;

typedef enum { DECAY_NONE, DECAY_MILD, DECAY_HARD, DECAY_MIXED, DECAY_COUNT } decay_regime;

static const char *const REGIME_NAMES[DECAY_COUNT] = {"g = 0", "g in (-0.5, 0)", "g in (-69, -31)",
                                                      "mixed extremes"};

/* Per-token log decays of one regime; the mixed one sprinkles 0, -1e-6, the floor -110,
 * -1000 and -inf among U(-3, 0). */
static void fill_decay(float *g, size_t n, decay_regime regime, uint64_t seed)
{
    tu_rng r = {seed};
    static const float specials[] = {0.0f, -1e-6f, -110.0f, -1000.0f, -INFINITY};
    for (size_t i = 0; i < n; i++) {
        switch (regime) {
        case DECAY_NONE: g[i] = 0.0f; break;
        case DECAY_MILD: g[i] = (float)tu_uniform(&r, -0.5, 0.0); break;
        case DECAY_HARD: g[i] = (float)tu_uniform(&r, -69.0, -31.0); break;
        default: {
            const double u = tu_uniform(&r, 0.0, 1.0);
            g[i] = u < 0.15 ? specials[(size_t)(u * 100.0) % 5] : (float)tu_uniform(&r, -3.0, 0.0);
        }
        }
    }
}

typedef struct {
    kda_fixture f;
    linseq_kda_problem per_channel; /* the same problem with g repeated over the K channels */
    float *g_channels;
    size_t n_o;
} case_t;

static void make_case(case_t *c, const kda_spec *s, decay_regime regime)
{
    memset(c, 0, sizeof *c);
    kda_fixture_make(&c->f, s);
    fill_decay(c->f.g, c->f.n_g, regime, s->seed + 77);
    const int64_t HV = s->HV ? s->HV : s->H;
    c->n_o = (size_t)(s->B * s->T * HV * s->V);
    c->g_channels = tu_alloc(c->f.n_g * (size_t)s->K);
    for (size_t i = 0; i < c->f.n_g; i++)
        for (int64_t d = 0; d < s->K; d++) c->g_channels[i * (size_t)s->K + (size_t)d] = c->f.g[i];
    c->per_channel = c->f.p;
    c->per_channel.decay = LINSEQ_DECAY_PER_CHANNEL;
    c->per_channel.g = c->g_channels;
}

static void free_case(case_t *c)
{
    free(c->g_channels);
    kda_fixture_free(&c->f);
}

static void forward(const linseq_kda_problem *p, ls_isa isa, int chunk, int threads, float *o,
                    float *ht)
{
    const linseq_exec ex = {.mode = chunk ? LINSEQ_MODE_CHUNKED : LINSEQ_MODE_RECURRENT,
                            .chunk_size = chunk,
                            .threads = threads};
    CHECK_OK(ls_kda_forward_isa(p, &ex, o, ht, isa));
}

static double worst_vs_ref[LS_ISA_COUNT];
static tu_mark tally[LS_ISA_COUNT];

/* One case on one ISA: every chunk size against the three references. */
static void check_case(const case_t *c, const double *o_ref, const double *h_ref, ls_isa isa,
                       const char *what)
{
    static const int chunks[] = {16, 32, 64, 128};
    const size_t no = c->n_o, ns = c->f.n_state;
    float *o = tu_alloc_poisoned(no), *h = tu_alloc_poisoned(ns);
    float *o_rec = tu_alloc(no), *h_rec = tu_alloc(ns), *o_pc = tu_alloc(no), *h_pc = tu_alloc(ns);
    forward(&c->f.p, isa, 0, 1, o_rec, h_rec);
    for (size_t m = 0; m < sizeof chunks / sizeof chunks[0]; m++) {
        const int chunk = chunks[m];
        forward(&c->f.p, isa, chunk, 1, o, h);
        forward(&c->per_channel, isa, chunk, 1, o_pc, h_pc);
        const double eo = tu_rel_err_d(o, o_ref, no), eh = tu_rel_err_d(h, h_ref, ns);
        worst_vs_ref[isa] = fmax(worst_vs_ref[isa], fmax(eo, eh));
        CHECK(eo <= TOL && eh <= TOL,
              "%s %s chunk %d: o err %.3g, ht err %.3g vs float64 (tol %.0e)", what,
              ls_isa_name(isa), chunk, eo, eh, TOL);
        const double ro = tu_rel_err(o, o_rec, no), rh = tu_rel_err(h, h_rec, ns);
        CHECK(ro <= TOL && rh <= TOL, "%s %s chunk %d: o err %.3g, ht err %.3g vs recurrent", what,
              ls_isa_name(isa), chunk, ro, rh);
        const double po = tu_rel_err(o, o_pc, no), ph = tu_rel_err(h, h_pc, ns);
        CHECK(po <= TOL && ph <= TOL,
              "%s %s chunk %d: o err %.3g, ht err %.3g vs the per-channel path", what,
              ls_isa_name(isa), chunk, po, ph);
    }
    free(o), free(h), free(o_rec), free(h_rec), free(o_pc), free(h_pc);
}

/* 2 and 3 threads give the bits of 1 thread, chunk 64. */
static void check_threads(const case_t *c, ls_isa isa, const char *what)
{
    const size_t no = c->n_o, ns = c->f.n_state;
    float *o1 = tu_alloc(no), *h1 = tu_alloc(ns), *o2 = tu_alloc_poisoned(no),
          *h2 = tu_alloc_poisoned(ns);
    forward(&c->f.p, isa, 64, 1, o1, h1);
    for (int t = 2; t <= 3; t++) {
        forward(&c->f.p, isa, 64, t, o2, h2);
        CHECK(tu_same_bits(o1, o2, no) && tu_same_bits(h1, h2, ns),
              "%s %s: %d threads differ from one", what, ls_isa_name(isa), t);
    }
    free(o1), free(h1), free(o2), free(h2);
}

int main(void)
{
    /* T: not a multiple of any chunk size, over several chunks of each; the last spec is one
     * sequence and head, which the threads share. */
    static const kda_spec specs[] = {
        {.B = 2, .T = 150, .H = 2, .HV = 4, .K = 64, .V = 48, .l2norm = true, .with_h0 = true},
        {.B = 1, .T = 77, .H = 1, .K = 17, .V = 9, .l2norm = false, .with_h0 = true},
        {.B = 1, .T = 261, .H = 1, .K = 128, .V = 128, .l2norm = true, .with_h0 = false},
    };
    uint64_t seed = 14000;
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
        for (int regime = 0; regime < DECAY_COUNT; regime++) {
            kda_spec s = specs[si];
            s.decay = LINSEQ_DECAY_PER_HEAD;
            s.regime = GATE_ZERO;
            s.seed = seed++;
            case_t c;
            make_case(&c, &s, (decay_regime)regime);
            double *o_ref = calloc(c.n_o, sizeof(double)),
                   *h_ref = calloc(c.f.n_state, sizeof(double));
            if (!o_ref || !h_ref) abort();
            CHECK_OK(ls_kda_reference_f64(&c.f.p, o_ref, h_ref));
            char what[128];
            snprintf(what, sizeof what, "K=%lld V=%lld T=%lld %s", (long long)s.K, (long long)s.V,
                     (long long)s.T, REGIME_NAMES[regime]);
            for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
                if (!ls_isa_available((ls_isa)isa)) continue;
                const tu_mark mark = tu_mark_now();
                check_case(&c, o_ref, h_ref, (ls_isa)isa, what);
                check_threads(&c, (ls_isa)isa, what);
                tu_tally_add(&tally[isa], mark);
            }
            free(o_ref), free(h_ref);
            free_case(&c);
        }
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) continue;
        char label[64], detail[96];
        snprintf(label, sizeof label, "kda per-head chunked %s", ls_isa_name((ls_isa)isa));
        snprintf(detail, sizeof detail, "worst rel err vs double %.3g", worst_vs_ref[isa]);
        tu_report(label, tally[isa], detail);
    }
    return tu_finish("test_kda_per_head");
}
