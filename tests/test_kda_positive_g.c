/* A positive log decay: KDA's g is log-space, g <= 0 (linseq.h, docs/semantics.md). A raw gate
 * passed where the log decay belongs (values in (0, 1), or a single positive value) grows the
 * state by e^g > 1 per token, and the chunked form's factors overflow: the outputs came back
 * all NaN with LINSEQ_OK. The kernels' own pass over g (kda_decay_row) now notices a g > 0 and
 * every call that runs them refuses it with LINSEQ_ERR_INVALID_VALUE naming 'g' (decode checks
 * its one token's g before anything is written, so a refused step leaves the pool as it was): the forward
 * in both modes, the training forward (whose block then has no header, so the backward
 * refuses it too), decode, the backward and the segment summary, per head and per channel,
 * on every ISA. Valid extremes stay valid: g = 0, -0, -inf, and a NaN (which propagates as
 * the non-finite test describes, not refused). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kda/kda_kernels.h"
#include "kda_fixture.h"
#include "simd/isa.h"
#include "testutil.h"

enum { T = 40, H = 2, K = 20, V = 12 };

static void expect_refused(linseq_status st, const char *what)
{
    const char *msg = linseq_last_error();
    CHECK(st == LINSEQ_ERR_INVALID_VALUE && strstr(msg, "'g'") && strstr(msg, "g <= 0"),
          "%s: %s (%s); expected LINSEQ_ERR_INVALID_VALUE naming g and g <= 0", what,
          linseq_status_string(st), msg);
}

static void check_isa(ls_isa isa, linseq_decay decay)
{
    const kda_spec s = {.B = 1,
                        .T = T,
                        .H = H,
                        .K = K,
                        .V = V,
                        .decay = decay,
                        .l2norm = true,
                        .with_h0 = true,
                        .gmag = 0.3,
                        .regime = GATE_RAND,
                        .seed = 4242};
    kda_fixture f;
    kda_fixture_make(&f, &s);
    float *o = tu_alloc(f.n_v), *ht = tu_alloc(f.n_state), *d_o = tu_alloc(f.n_v);
    for (size_t i = 0; i < f.n_v; i++) d_o[i] = 1.0f;
    float *dq = tu_alloc(f.n_qk);
    const linseq_kda_grads grads = {.dq = dq};
    char what[128];
    const char *dname = decay == LINSEQ_DECAY_PER_HEAD ? "per-head" : "per-channel";

    for (int mode = LINSEQ_MODE_RECURRENT; mode <= LINSEQ_MODE_CHUNKED; mode++) {
        const linseq_exec ex = {.mode = (linseq_mode)mode, .chunk_size = 16, .threads = 2};
        const char *mname = mode == LINSEQ_MODE_RECURRENT ? "recurrent" : "chunked";
        /* valid extremes: 0, -0, -inf and NaN are not positive */
        f.g[3] = 0.0f;
        f.g[f.n_g / 2] = -0.0f;
        f.g[f.n_g - 2] = -INFINITY;
        snprintf(what, sizeof what, "%s %s %s: g with 0, -0, -inf", ls_isa_name(isa), dname, mname);
        CHECK(ls_kda_forward_isa(&f.p, &ex, o, ht, isa) == LINSEQ_OK, "%s: refused (%s)", what,
              linseq_last_error());
        const float kept = f.g[f.n_g - 1];
        f.g[f.n_g - 1] = NAN;
        CHECK(ls_kda_forward_isa(&f.p, &ex, o, ht, isa) == LINSEQ_OK, "%s, NaN: refused (%s)", what,
              linseq_last_error());
        f.g[f.n_g - 1] = kept;

        /* one positive value, in the middle of a chunk of the second half */
        const float before = f.g[f.n_g * 3 / 4];
        f.g[f.n_g * 3 / 4] = 0.5f;
        snprintf(what, sizeof what, "%s %s %s: one g = 0.5", ls_isa_name(isa), dname, mname);
        expect_refused(ls_kda_forward_isa(&f.p, &ex, o, ht, isa), what);
        expect_refused(ls_kda_backward_isa(&f.p, &ex, d_o, NULL, &grads, isa), what);
        size_t bytes = 0;
        CHECK_OK(linseq_kda_saved_size(&f.p, &ex, &bytes));
        unsigned char *saved = calloc(1, bytes);
        expect_refused(ls_kda_forward_train_isa(&f.p, &ex, o, ht, saved, bytes, isa), what);
        CHECK(ls_kda_backward_saved_isa(&f.p, &ex, saved, bytes, d_o, NULL, &grads, isa) ==
                  LINSEQ_ERR_INVALID_VALUE,
              "%s: the refused training forward's block was accepted", what);
        free(saved);
        /* the smallest positive float too: the contract is g <= 0, no threshold */
        f.g[f.n_g * 3 / 4] = 1e-30f;
        expect_refused(ls_kda_forward_isa(&f.p, &ex, o, ht, isa), what);
        f.g[f.n_g * 3 / 4] = before;

        /* a raw gate where the log decay belongs: every g in (0, 1) */
        float *raw = tu_alloc(f.n_g);
        memcpy(raw, f.g, f.n_g * sizeof *raw);
        for (size_t i = 0; i < f.n_g; i++) f.g[i] = 0.05f + 0.9f * (float)(i % 17) / 17.0f;
        snprintf(what, sizeof what, "%s %s %s: a raw gate in (0, 1)", ls_isa_name(isa), dname,
                 mname);
        expect_refused(ls_kda_forward_isa(&f.p, &ex, o, ht, isa), what);
        memcpy(f.g, raw, f.n_g * sizeof *raw);
        free(raw);
    }

    /* decode: one token per request, its state in a pool */
    linseq_kda_problem d = f.p;
    d.B = 2;
    d.T = 1;
    d.h0 = NULL;
    const int64_t HV = H, per_row = HV * K * V;
    float *pool = tu_alloc((size_t)(2 * per_row)), *od = tu_alloc((size_t)(2 * HV * V));
    const float before = f.g[0];
    f.g[0] = 2.0f;
    snprintf(what, sizeof what, "%s %s decode: g = 2", ls_isa_name(isa), dname);
    /* a serving engine's pool keeps its states on a refused step: nothing is written */
    tu_rng r = {5};
    tu_fill_normal(&r, pool, (size_t)(2 * per_row), 1.0);
    float *pool_before = tu_alloc((size_t)(2 * per_row)),
          *od_before = tu_alloc((size_t)(2 * HV * V));
    memcpy(pool_before, pool, (size_t)(2 * per_row) * sizeof(float));
    tu_poison(od, (size_t)(2 * HV * V) * sizeof(float));
    memcpy(od_before, od, (size_t)(2 * HV * V) * sizeof(float));
    expect_refused(ls_kda_decode_isa(&d, NULL, pool, 2, NULL, od, isa), what);
    CHECK(tu_same_bits(pool, pool_before, (size_t)(2 * per_row)) &&
              tu_same_bits(od, od_before, (size_t)(2 * HV * V)),
          "%s: the refused decode step wrote its pool or its output", what);
    free(pool_before), free(od_before);
    f.g[0] = before;
    CHECK(ls_kda_decode_isa(&d, NULL, pool, 2, NULL, od, isa) == LINSEQ_OK,
          "%s decode with g <= 0 refused (%s)", dname, linseq_last_error());

    /* the segment summary runs the same kernels */
    float *P = tu_alloc((size_t)(HV * K * K)), *R = tu_alloc((size_t)(HV * K * V));
    linseq_kda_problem sp = f.p;
    sp.h0 = NULL;
    const float fifth = f.g[5];
    f.g[5] = 0.25f;
    snprintf(what, sizeof what, "%s %s segment: g = 0.25", ls_isa_name(isa), dname);
    expect_refused(ls_kda_segment_forward_isa(&sp, NULL, P, R, isa), what);
    f.g[5] = fifth;

    free(pool), free(od), free(P), free(R);
    free(o), free(ht), free(d_o), free(dq);
    kda_fixture_free(&f);
}

int main(void)
{
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) continue;
        const tu_mark mark = tu_mark_now();
        check_isa((ls_isa)isa, LINSEQ_DECAY_PER_HEAD);
        check_isa((ls_isa)isa, LINSEQ_DECAY_PER_CHANNEL);
        tu_mark tally = {0};
        tu_tally_add(&tally, mark);
        char label[64];
        snprintf(label, sizeof label, "kda positive g %s", ls_isa_name((ls_isa)isa));
        tu_report(label, tally, "refused in every call; 0, -0, -inf and NaN accepted");
    }
    return tu_finish("test_kda_positive_g");
}
