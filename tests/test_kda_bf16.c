/* KDA with bf16 per-token tensors on the CPU (exec->dtype = LINSEQ_DTYPE_BF16).
 *
 * The property: the bf16 call gives exactly what the float32 call gives on the same values
 * widened to float32, with o rounded once to bf16 (to nearest, ties to even) and the final
 * state bit for bit the same. Checked on every ISA, in recurrent mode and chunked with chunks
 * 16 and 64, with 1, 2 and 3 threads (one item per thread and one item shared by the
 * threads), over odd sizes, packed sequences, GVA, both state layouts, the in-kernel gate and
 * logit beta; decode in both state layouts with a padding request. The rounding is this
 * file's own (the nearer of the two neighbouring bf16 values, found by comparing distances),
 * not the library's. A chosen set of outputs (ties, subnormals, values that overflow to inf)
 * goes through every ISA's rounding on the way out; a bound against the float64 reference
 * says the numbers are sane; writes stay inside o's 2-byte elements. The calls that take
 * float32 only on the CPU still refuse bf16, naming the entry point and the dtype. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kda/kda_internal.h"
#include "kda/kda_kernels.h"
#include "kda_fixture.h"
#include "simd/isa.h"
#include "testutil.h"

/* ---------------------------------------------------------------------------------------- */
/* An independent bf16 rounding                                                                */
/* ---------------------------------------------------------------------------------------- */

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static float widen(uint16_t h) { return float_of((uint32_t)h << 16); }

/* The bf16 nearest x: of the two bf16 values around x (x's upper half, truncated, and the
 * next one away from zero) the nearer in double arithmetic, the even one on a tie; beyond the
 * largest finite bf16 (where the next one is inf) the midpoint to 2^128 decides. NaN: x's
 * upper half with the quiet bit set. */
static uint16_t round_bf16(float x)
{
    const uint32_t u = bits_of(x);
    if (isnan(x)) return (uint16_t)((u >> 16) | 0x40u);
    const uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    if (isinf(x) || (u & 0xffffu) == 0) return lo;
    const double a = fabs((double)widen(lo)), d_lo = fabs((double)x) - a;
    const double b = isinf(widen(hi)) ? ldexp(1.0, 128) : fabs((double)widen(hi));
    const double d_hi = b - fabs((double)x);
    if (d_lo < d_hi) return lo;
    if (d_hi < d_lo) return hi;
    return (lo & 1u) ? hi : lo;
}

/* A per-token tensor in both storages: the bf16 values and their float32 widening. */
typedef struct {
    uint16_t *h;
    float *f;
} twin;

static twin make_twin(const float *x, size_t n)
{
    twin t = {malloc((n + 1) * sizeof(uint16_t)), tu_alloc(n + 1)};
    if (!t.h) abort();
    for (size_t i = 0; i < n; i++) {
        t.h[i] = round_bf16(x[i]);
        t.f[i] = widen(t.h[i]);
    }
    return t;
}

static void free_twin(twin *t)
{
    free(t->h);
    free(t->f);
}

/* ---------------------------------------------------------------------------------------- */
/* One problem in both storages                                                               */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    kda_fixture f;
    twin q, k, v, beta, g;
    float *A_log, *dt_bias;
    linseq_kda_problem p32, p16; /* the widened values as float32; the bf16 values */
    size_t n_o;
} pair_case;

static void make_pair(pair_case *c, const kda_spec *s, bool gate_in_kernel, bool beta_logit)
{
    memset(c, 0, sizeof *c);
    kda_fixture_make(&c->f, s);
    const int64_t HV = s->HV ? s->HV : s->H;
    c->n_o = (size_t)(s->B * s->T * HV * s->V);
    if (beta_logit) /* logits of both signs */
        for (size_t i = 0; i < c->f.n_beta; i++) c->f.beta[i] = 6.0f * c->f.beta[i] - 3.0f;
    c->q = make_twin(c->f.q, c->f.n_qk);
    c->k = make_twin(c->f.k, c->f.n_qk);
    c->v = make_twin(c->f.v, c->f.n_v);
    c->beta = make_twin(c->f.beta, c->f.n_beta);
    if (c->f.n_g) c->g = make_twin(c->f.g, c->f.n_g);
    linseq_kda_problem p = c->f.p;
    p.beta_is_logit = beta_logit;
    if (gate_in_kernel) {
        tu_rng r = {s->seed + 5};
        c->A_log = tu_alloc((size_t)HV);
        c->dt_bias = tu_alloc(c->f.n_g / (size_t)(s->B * s->T));
        tu_fill_uniform(&r, c->A_log, (size_t)HV, -1.0, 1.0);
        tu_fill_normal(&r, c->dt_bias, c->f.n_g / (size_t)(s->B * s->T), 0.5);
        p.gate_in_kernel = true;
        p.A_log = c->A_log;
        p.dt_bias = c->dt_bias;
    }
    c->p32 = c->p16 = p;
    c->p32.q = c->q.f, c->p32.k = c->k.f, c->p32.v = c->v.f, c->p32.beta = c->beta.f;
    c->p32.g = c->f.n_g ? c->g.f : NULL;
    /* the public structs keep float pointer types for bf16 tensors */
    c->p16.q = (const float *)(const void *)c->q.h;
    c->p16.k = (const float *)(const void *)c->k.h;
    c->p16.v = (const float *)(const void *)c->v.h;
    c->p16.beta = (const float *)(const void *)c->beta.h;
    c->p16.g = c->f.n_g ? (const float *)(const void *)c->g.h : NULL;
}

static void free_pair(pair_case *c)
{
    free_twin(&c->q), free_twin(&c->k), free_twin(&c->v), free_twin(&c->beta);
    if (c->f.n_g) free_twin(&c->g);
    free(c->A_log), free(c->dt_bias);
    kda_fixture_free(&c->f);
}

static linseq_exec make_exec(int chunk, int threads, bool bf16)
{
    return (linseq_exec){.mode = chunk ? LINSEQ_MODE_CHUNKED : LINSEQ_MODE_RECURRENT,
                         .chunk_size = chunk,
                         .threads = threads,
                         .dtype = bf16 ? LINSEQ_DTYPE_BF16 : LINSEQ_DTYPE_F32};
}

/* A bf16 output of n elements with poisoned guard elements on both sides: the kernels must
 * write exactly the n 2-byte elements. */
enum { GUARD = 24 };

static uint16_t *guarded_alloc(size_t n)
{
    uint16_t *x = malloc((n + 2 * GUARD) * sizeof *x);
    if (!x) abort();
    tu_poison(x, (n + 2 * GUARD) * sizeof *x);
    return x + GUARD;
}

static bool guards_intact(const uint16_t *x, size_t n)
{
    return tu_is_poisoned(x - GUARD, GUARD * sizeof *x) && tu_is_poisoned(x + n, GUARD * sizeof *x);
}

static void guarded_free(uint16_t *x) { free(x - GUARD); }

/* o16 is the rounding of o32, element by element, bit for bit; the first mismatch or 0. */
static bool rounded_equal(const uint16_t *o16, const float *o32, size_t n, size_t *at)
{
    for (size_t i = 0; i < n; i++)
        if (o16[i] != round_bf16(o32[i])) {
            *at = i;
            return false;
        }
    return true;
}

static tu_mark tally[LS_ISA_COUNT];
static double worst_vs_ref;

/* One mode (chunk 0: recurrent) on one ISA: the float32 run of the widened values, then the
 * bf16 run with 1, 2 and 3 threads. */
static void check_mode(const pair_case *c, ls_isa isa, int chunk, const char *what)
{
    const size_t no = c->n_o, ns = c->f.n_state;
    float *o32 = tu_alloc(no), *h32 = tu_alloc(ns), *h16 = tu_alloc_poisoned(ns);
    const linseq_exec e32 = make_exec(chunk, 1, false);
    CHECK_OK(ls_kda_forward_isa(&c->p32, &e32, o32, h32, isa));
    for (int threads = 1; threads <= 3; threads++) {
        uint16_t *o16 = guarded_alloc(no);
        const linseq_exec e16 = make_exec(chunk, threads, true);
        CHECK_OK(ls_kda_forward_isa(&c->p16, &e16, (float *)(void *)o16, h16, isa));
        size_t at = 0;
        const bool same_o = rounded_equal(o16, o32, no, &at);
        CHECK(same_o,
              "%s %s chunk %d, %d threads: o[%zu] = 0x%04x, the float32 path rounded is 0x%04x",
              what, ls_isa_name(isa), chunk, threads, at, o16[at], round_bf16(o32[at]));
        CHECK(tu_same_bits(h16, h32, ns), "%s %s chunk %d, %d threads: ht differs from float32",
              what, ls_isa_name(isa), chunk, threads);
        CHECK(guards_intact(o16, no), "%s %s chunk %d, %d threads: wrote outside o", what,
              ls_isa_name(isa), chunk, threads);
        guarded_free(o16);
    }
    free(o32), free(h32), free(h16);
}

/* The bf16 outputs agree with the float64 reference on the widened inputs to bf16's
 * precision: the property alone would also hold for two equally wrong paths. */
static void check_reference(const pair_case *c)
{
    const size_t no = c->n_o;
    double *o_ref = calloc(no, sizeof(double)), *h_ref = calloc(c->f.n_state, sizeof(double));
    uint16_t *o16 = guarded_alloc(no);
    float *o = tu_alloc(no), *h = tu_alloc(c->f.n_state);
    if (!o_ref || !h_ref) abort();
    CHECK_OK(ls_kda_reference_f64(&c->p32, o_ref, h_ref));
    const linseq_exec ex = make_exec(64, 1, true);
    CHECK_OK(linseq_kda_forward(&c->p16, &ex, (float *)(void *)o16, h));
    for (size_t i = 0; i < no; i++) o[i] = widen(o16[i]);
    const double eo = tu_rel_err_d(o, o_ref, no), eh = tu_rel_err_d(h, h_ref, c->f.n_state);
    worst_vs_ref = fmax(worst_vs_ref, eo);
    CHECK(eo <= 8e-3 && eh <= 2e-5, "bf16 vs float64: o err %.3g (tol 8e-3), ht err %.3g", eo, eh);
    guarded_free(o16);
    free(o_ref), free(h_ref), free(o), free(h);
}

static void check_forward(const kda_spec *s, bool gate_in_kernel, bool beta_logit, const char *what)
{
    pair_case c;
    make_pair(&c, s, gate_in_kernel, beta_logit);
    check_reference(&c);
    static const int chunks[] = {0, 16, 64};
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) continue;
        const tu_mark mark = tu_mark_now();
        for (size_t m = 0; m < sizeof chunks / sizeof chunks[0]; m++)
            check_mode(&c, (ls_isa)isa, chunks[m], what);
        tu_tally_add(&tally[isa], mark);
    }
    free_pair(&c);
}

/* ---------------------------------------------------------------------------------------- */
/* Decode                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static void check_decode(bool v_first)
{
    const kda_spec s = {.B = 5,
                        .T = 1,
                        .H = 2,
                        .HV = 4,
                        .K = 24,
                        .V = 19,
                        .l2norm = true,
                        .decay = LINSEQ_DECAY_PER_CHANNEL,
                        .regime = GATE_RAND,
                        .gmag = 0.3,
                        .v_first = v_first,
                        .seed = 1601};
    pair_case c;
    make_pair(&c, &s, false, false);
    const int64_t n_rows = 6, row_floats = 4 * 24 * 19;
    static const int64_t rows[5] = {3, -1, 0, 5, 1};
    const size_t n_pool = (size_t)(n_rows * row_floats), no = c.n_o;
    float *pool0 = tu_alloc(n_pool);
    tu_rng r = {99};
    tu_fill_normal(&r, pool0, n_pool, 0.5);
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) continue;
        const tu_mark mark = tu_mark_now();
        float *pool32 = tu_alloc(n_pool), *o32 = tu_alloc(no);
        memcpy(pool32, pool0, n_pool * sizeof(float));
        const linseq_exec e32 = make_exec(0, 1, false);
        CHECK_OK(ls_kda_decode_isa(&c.p32, &e32, pool32, n_rows, rows, o32, (ls_isa)isa));
        for (int threads = 1; threads <= 3; threads++) {
            float *pool16 = tu_alloc(n_pool);
            memcpy(pool16, pool0, n_pool * sizeof(float));
            uint16_t *o16 = guarded_alloc(no);
            const linseq_exec e16 = make_exec(0, threads, true);
            CHECK_OK(ls_kda_decode_isa(&c.p16, &e16, pool16, n_rows, rows, (float *)(void *)o16,
                                       (ls_isa)isa));
            size_t at = 0;
            CHECK(rounded_equal(o16, o32, no, &at),
                  "decode %s %s, %d threads: o[%zu] = 0x%04x, the float32 path rounded is 0x%04x",
                  v_first ? "V-first" : "K-major", ls_isa_name((ls_isa)isa), threads, at, o16[at],
                  round_bf16(o32[at]));
            CHECK(tu_same_bits(pool16, pool32, n_pool), "decode %s %s, %d threads: pool differs",
                  v_first ? "V-first" : "K-major", ls_isa_name((ls_isa)isa), threads);
            /* the padding request's row of o is +0 */
            bool padding_zero = true;
            for (int64_t j = 0; j < 4 * 19; j++) padding_zero &= o16[4 * 19 + j] == 0;
            CHECK(padding_zero && guards_intact(o16, no),
                  "decode %s %s: padding row not zero or a write outside o",
                  v_first ? "V-first" : "K-major", ls_isa_name((ls_isa)isa));
            free(pool16);
            guarded_free(o16);
        }
        free(pool32), free(o32);
        tu_tally_add(&tally[isa], mark);
    }
    free(pool0);
    free_pair(&c);
}

/* ---------------------------------------------------------------------------------------- */
/* The rounding on the way out                                                                */
/* ---------------------------------------------------------------------------------------- */

/* With K = 1, q = 1, k = 0, g = 0 and scale 1, the first token's o is h0 exactly (S is not
 * written and o = S^T q): outputs chosen to be ties, subnormals, values that round to inf.
 * V = 37 puts some of them in every ISA's masked tail. The kernels read a subnormal float as
 * zero (core/fp_mode.h, on x86): those outputs are zeros, or, where the mode is not in effect
 * (under Valgrind, which does not emulate it), their rounding. */
static void check_rounding(void)
{
    static const float chosen[] = {
        1.0f + 0x1p-8f,            /* tie, rounds down to even */
        1.0f + 3 * 0x1p-8f,        /* tie, rounds up to even */
        -(1.0f + 0x1p-8f),         /* negative tie */
        1.0f + 0x1p-8f + 0x1p-20f, /* just above the tie */
        1.0f + 0x1p-8f - 0x1p-23f, /* just below it */
        1e-40f,                    /* subnormal */
        -0x1p-149f,                /* the smallest subnormal */
        0x1.8p-133f,               /* a subnormal tie, rounds up to even */
        0x1p-134f,                 /* a subnormal tie, rounds down to +0 */
        FLT_MAX,                   /* rounds to inf */
        -0x1.ff2p127f,             /* past the midpoint to 2^128: rounds to -inf */
        0x1.fep127f,               /* the largest finite bf16, exact */
        FLT_MIN,                   /* the smallest normal, exact */
        3.14159265f,
        -2.718281828f,
        65504.0f,
        1e-30f,
    };
    const int64_t V = 37, n_chosen = (int64_t)(sizeof chosen / sizeof chosen[0]);
    float *h0 = tu_alloc((size_t)V);
    tu_rng r = {4242};
    tu_fill_normal(&r, h0, (size_t)V, 3.0);
    for (int64_t j = 0; j < V; j++)
        if (j % 2 == 1 || j >= V - 8) h0[j] = chosen[(j * 7) % n_chosen];
    static const uint16_t one = 0x3f80, zero = 0;
    uint16_t v16[37];
    for (int64_t j = 0; j < V; j++) v16[j] = round_bf16((float)j * 0.25f);
    const float beta = 0.5f;
    const uint16_t beta16 = round_bf16(beta);
    const linseq_kda_problem p = {.B = 1,
                                  .T = 1,
                                  .H = 1,
                                  .K = 1,
                                  .V = V,
                                  .scale = 1.0f,
                                  .q = (const float *)(const void *)&one,
                                  .k = (const float *)(const void *)&zero,
                                  .v = (const float *)(const void *)v16,
                                  .beta = (const float *)(const void *)&beta16,
                                  .h0 = h0};
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) continue;
        const tu_mark mark = tu_mark_now();
        for (int chunk = 0; chunk <= 64; chunk += 64) {
            uint16_t *o16 = guarded_alloc((size_t)V);
            const linseq_exec ex = make_exec(chunk, 1, true);
            CHECK_OK(ls_kda_forward_isa(&p, &ex, (float *)(void *)o16, NULL, (ls_isa)isa));
            for (int64_t j = 0; j < V; j++)
                CHECK(o16[j] == round_bf16(h0[j]) ||
                          (fpclassify(h0[j]) == FP_SUBNORMAL && (o16[j] & 0x7fff) == 0),
                      "rounding %s chunk %d: o[%lld] = 0x%04x for %a, want 0x%04x",
                      ls_isa_name((ls_isa)isa), chunk, (long long)j, o16[j], (double)h0[j],
                      round_bf16(h0[j]));
            CHECK(guards_intact(o16, (size_t)V), "rounding %s: wrote outside o",
                  ls_isa_name((ls_isa)isa));
            guarded_free(o16);
        }
        tu_tally_add(&tally[isa], mark);
    }
    free(h0);
}

/* ---------------------------------------------------------------------------------------- */
/* Calls that stay float32-only on the CPU                                                    */
/* ---------------------------------------------------------------------------------------- */

static void check_refused(const char *fn, linseq_status st, const float *out, size_t n)
{
    const char *msg = linseq_last_error();
    CHECK(st == LINSEQ_ERR_UNSUPPORTED && strstr(msg, fn) && strstr(msg, "LINSEQ_DTYPE_BF16"),
          "%s with bf16 on the CPU: %s (%s); expected LINSEQ_ERR_UNSUPPORTED naming the call "
          "and the dtype",
          fn, linseq_status_string(st), msg);
    CHECK(!out || tu_is_poisoned(out, n * sizeof *out), "%s with bf16 wrote its output", fn);
}

static void check_refusals(void)
{
    const kda_spec s = {.B = 1,
                        .T = 9,
                        .H = 1,
                        .K = 8,
                        .V = 8,
                        .decay = LINSEQ_DECAY_PER_HEAD,
                        .regime = GATE_RAND,
                        .gmag = 0.2,
                        .seed = 77};
    pair_case c;
    make_pair(&c, &s, false, false);
    const linseq_exec ex = make_exec(64, 1, true);
    float *buf = tu_alloc_poisoned(c.n_o * 8), *d_o = tu_alloc(c.n_o);
    const linseq_kda_grads grads = {.dq = buf};
    check_refused("linseq_kda_backward", linseq_kda_backward(&c.p16, &ex, d_o, NULL, &grads), buf,
                  c.n_o);
    size_t bytes = 0;
    check_refused("linseq_kda_saved_size", linseq_kda_saved_size(&c.p16, &ex, &bytes), NULL, 0);
    char saved[256];
    check_refused("linseq_kda_forward_train",
                  linseq_kda_forward_train(&c.p16, &ex, buf, NULL, saved, sizeof saved), buf,
                  c.n_o);
    const linseq_kda_gate_problem gp = {
        .B = 1, .T = 9, .H = 1, .decay = LINSEQ_DECAY_PER_HEAD, .g_raw = c.f.g};
    check_refused("linseq_kda_gate_forward", linseq_kda_gate_forward(&gp, &ex, buf), buf, 9);
    /* a bf16 tensor off its 2-byte alignment: the message names bfloat16, not float32 */
    linseq_kda_problem odd = c.p16;
    odd.k = (const float *)(const void *)((const char *)c.p16.k + 1);
    const linseq_status st = linseq_kda_forward(&odd, &ex, buf, NULL);
    const char *msg = linseq_last_error();
    CHECK(st == LINSEQ_ERR_INVALID_VALUE && strstr(msg, "'k'") &&
              strstr(msg, "2 bytes (the alignment of a bfloat16)") && !strstr(msg, "float32"),
          "a misaligned bf16 k: %s (%s); expected LINSEQ_ERR_INVALID_VALUE naming bfloat16",
          linseq_status_string(st), msg);
    CHECK(tu_is_poisoned(buf, c.n_o * sizeof *buf), "a misaligned bf16 call wrote its output");
    free(buf), free(d_o);
    free_pair(&c);
}

int main(void)
{
    static const int64_t cu[] = {0, 5, 38, 70};
    /* Odd sizes: K and V no multiple of any vector width, T no multiple of a chunk. The last
     * two are one item each, which the threads share (V > 32: column ranges). */
    static const kda_spec specs[] = {
        {.B = 2,
         .T = 45,
         .H = 2,
         .HV = 4,
         .K = 24,
         .V = 19,
         .l2norm = true,
         .with_h0 = true,
         .decay = LINSEQ_DECAY_PER_CHANNEL,
         .regime = GATE_RAND,
         .gmag = 0.3},
        {.B = 1,
         .T = 70,
         .H = 1,
         .K = 33,
         .V = 40,
         .l2norm = false,
         .with_h0 = true,
         .decay = LINSEQ_DECAY_PER_HEAD,
         .regime = GATE_EXTREME,
         .gmag = 0.5,
         .n_seqs = 3,
         .cu = cu},
        {.B = 1,
         .T = 83,
         .H = 1,
         .K = 64,
         .V = 72,
         .l2norm = true,
         .with_h0 = true,
         .decay = LINSEQ_DECAY_NONE,
         .v_first = true},
        {.B = 1,
         .T = 67,
         .H = 1,
         .K = 40,
         .V = 65,
         .l2norm = true,
         .decay = LINSEQ_DECAY_PER_CHANNEL,
         .regime = GATE_EXTREME,
         .gmag = 0.2},
    };
    static const char *const names[] = {"GVA per-channel", "varlen per-head",
                                        "no decay V-first, shared item",
                                        "per-channel extremes, shared item"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kda_spec s = specs[i];
        s.seed = 1600 + i;
        check_forward(&s, false, false, names[i]);
    }
    /* the in-kernel gate (g is then the raw gate input, bf16 too) and logit beta */
    kda_spec s = specs[0];
    s.seed = 1700;
    s.regime = GATE_RAND;
    check_forward(&s, true, true, "in-kernel gate, logit beta");
    s = specs[1];
    s.seed = 1701;
    s.regime = GATE_RAND;
    check_forward(&s, true, false, "in-kernel gate per head, varlen");

    check_decode(false);
    check_decode(true);
    check_rounding();
    check_refusals();

    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) continue;
        char label[64];
        snprintf(label, sizeof label, "kda bf16 %s", ls_isa_name((ls_isa)isa));
        tu_report(label, tally[isa], "bitwise the float32 path rounded once");
    }
    printf("kda bf16: worst rel err of o vs float64 %.3g\n", worst_vs_ref);
    return tu_finish("test_kda_bf16");
}
