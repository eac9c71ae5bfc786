/* KDA's chunked forward with bf16 products (exec->products = LINSEQ_PRODUCTS_BF16).
 *
 * Properties, on every ISA (each with its own float32 run as the baseline), chunks 16 and 64,
 * 1, 2 and 3 threads (one item per thread, and one item shared by the threads' column
 * ranges), per-head and per-channel decay, with and without the delta rule, odd sizes:
 *   - the final state is bit for bit the float32 products' (only the output's products take
 *     bf16 operands);
 *   - the output is the same bits for any thread count, and within a bf16 bound of the
 *     float64 reference;
 *   - bf16 storage: o is the float32-storage call's o (same products) rounded once;
 *   - a NaN or Inf at token t leaves the outputs of earlier tokens the clean run's bits (the
 *     bf16 products visit only the causal triangle, never 0 x NaN);
 *   - where the option does not apply (recurrent mode) the results are the float32 products'
 *     bit for bit; the training forward's o is the inference forward's with bf16 products,
 *     its state and saved block (state-side, float32) the float32 products' bit for bit;
 *   - an unknown value is refused, naming the field, before anything is written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/half_float.h"
#include "kda/kda_internal.h"
#include "kda/kda_kernels.h"
#include "kda_fixture.h"
#include "simd/isa.h"
#include "testutil.h"

/* Output error bound, relative to max |o|: a product with bf16 operands is off by at most
 * 2^-7 sum |a b| per element (two roundings of 2^-8); the in-chunk sums of |a b| stay within a
 * few max |o| for these inputs (normalised q and k, decays <= 1). Measured at most 2.8e-3. */
#define OUT_BOUND 1e-2

static linseq_exec exec_of(int chunk, int threads, linseq_products products)
{
    return (linseq_exec){.mode = chunk ? LINSEQ_MODE_CHUNKED : LINSEQ_MODE_RECURRENT,
                         .chunk_size = chunk,
                         .threads = threads,
                         .products = products};
}

typedef struct {
    const char *name;
    kda_spec s;
} named_spec;

/* One spec on one ISA: the float32 products' run, then the bf16 products' on 1-3 threads. */
static double check_spec(const named_spec *ns, ls_isa isa, int chunk)
{
    kda_fixture f;
    kda_fixture_make(&f, &ns->s);
    const size_t n_o = f.n_v;
    double *o_ref = malloc(n_o * sizeof *o_ref), *h_ref = malloc(f.n_state * sizeof *h_ref);
    if (!o_ref || !h_ref) abort();
    CHECK_OK(ls_kda_reference_f64(&f.p, o_ref, h_ref));
    float *o32 = tu_alloc(n_o), *h32 = tu_alloc(f.n_state);
    linseq_exec ex = exec_of(chunk, 1, LINSEQ_PRODUCTS_F32);
    CHECK_OK(ls_kda_forward_isa(&f.p, &ex, o32, h32, isa));
    float *o1 = tu_alloc(n_o), *o = tu_alloc_poisoned(n_o), *h = tu_alloc_poisoned(f.n_state);
    double err = 0.0;
    for (int threads = 1; threads <= 3; threads++) {
        ex = exec_of(chunk, threads, LINSEQ_PRODUCTS_BF16);
        CHECK_OK(ls_kda_forward_isa(&f.p, &ex, threads == 1 ? o1 : o, h, isa));
        CHECK(tu_same_bits(h, h32, f.n_state),
              "%s %s chunk %d, %d threads: the final state is not the float32 products' bits",
              ns->name, ls_isa_name(isa), chunk, threads);
        if (threads > 1)
            CHECK(tu_same_bits(o, o1, n_o), "%s %s chunk %d: o on %d threads differs from 1",
                  ns->name, ls_isa_name(isa), chunk, threads);
    }
    err = tu_rel_err_d(o1, o_ref, n_o);
    const double err32 = tu_rel_err_d(o32, o_ref, n_o);
    CHECK(err <= OUT_BOUND, "%s %s chunk %d: o error %.3g > %g (float32 products: %.3g)", ns->name,
          ls_isa_name(isa), chunk, err, OUT_BOUND, err32);
    /* the products did change: a run that ignored the option would pass the checks above */
    CHECK(!tu_same_bits(o1, o32, n_o), "%s %s chunk %d: o is the float32 products' bits", ns->name,
          ls_isa_name(isa), chunk);
    free(o_ref), free(h_ref), free(o32), free(h32), free(o1), free(o), free(h);
    kda_fixture_free(&f);
    return err;
}

/* bf16 storage with bf16 products: o is the rounding of the float32-storage call's o on the
 * widened values, the state the same bits. */
static void check_bf16_storage(ls_isa isa)
{
    kda_spec s = {.B = 1,
                  .T = 150,
                  .H = 2,
                  .K = 64,
                  .V = 48,
                  .decay = LINSEQ_DECAY_PER_HEAD,
                  .l2norm = true,
                  .with_h0 = true,
                  .gmag = 0.05,
                  .regime = GATE_RAND,
                  .seed = 31};
    kda_fixture f;
    kda_fixture_make(&f, &s);
    float *tensors[] = {f.q, f.k, f.v, f.beta, f.g};
    const size_t counts[] = {f.n_qk, f.n_qk, f.n_v, f.n_beta, f.n_g};
    uint16_t *half[5];
    for (int t = 0; t < 5; t++) {
        half[t] = malloc((counts[t] + 1) * sizeof(uint16_t));
        if (!half[t]) abort();
        for (size_t i = 0; i < counts[t]; i++) {
            half[t][i] = ls_f32_to_bf16(tensors[t][i]);
            tensors[t][i] = ls_bf16_to_f32(half[t][i]); /* the float32 call sees the same values */
        }
    }
    linseq_kda_problem p16 = f.p;
    p16.q = (const float *)(const void *)half[0], p16.k = (const float *)(const void *)half[1];
    p16.v = (const float *)(const void *)half[2], p16.beta = (const float *)(const void *)half[3];
    p16.g = (const float *)(const void *)half[4];
    float *o32 = tu_alloc(f.n_v), *h32 = tu_alloc(f.n_state), *h16 = tu_alloc(f.n_state);
    uint16_t *o16 = malloc(f.n_v * sizeof *o16);
    if (!o16) abort();
    for (int threads = 1; threads <= 2; threads++) {
        linseq_exec ex = exec_of(64, threads, LINSEQ_PRODUCTS_BF16);
        CHECK_OK(ls_kda_forward_isa(&f.p, &ex, o32, h32, isa));
        ex.dtype = LINSEQ_DTYPE_BF16;
        CHECK_OK(ls_kda_forward_isa(&p16, &ex, (float *)(void *)o16, h16, isa));
        bool same = tu_same_bits(h16, h32, f.n_state);
        for (size_t i = 0; i < f.n_v; i++) same = same && o16[i] == ls_f32_to_bf16(o32[i]);
        CHECK(same, "%s bf16 storage, %d threads: not the float32 storage's results rounded",
              ls_isa_name(isa), threads);
    }
    for (int t = 0; t < 5; t++) free(half[t]);
    free(o32), free(h32), free(h16), free(o16);
    kda_fixture_free(&f);
}

/* A non-finite v or k at token t, inside a 16-row block of its chunk: the outputs of the
 * tokens before t keep the clean run's bits. */
static void check_causal(ls_isa isa)
{
    kda_spec s = {.B = 1,
                  .T = 100,
                  .H = 1,
                  .K = 32,
                  .V = 32,
                  .decay = LINSEQ_DECAY_PER_HEAD,
                  .l2norm = true,
                  .with_h0 = true,
                  .gmag = 0.1,
                  .regime = GATE_RAND,
                  .seed = 51};
    kda_fixture f;
    kda_fixture_make(&f, &s);
    float *o_clean = tu_alloc(f.n_v), *o = tu_alloc(f.n_v), *h = tu_alloc(f.n_state);
    static const int64_t tokens[] = {21, 70};
    static const float bad[] = {NAN, INFINITY};
    for (int chunk = 16; chunk <= 64; chunk *= 4) {
        linseq_exec ex = exec_of(chunk, 1, LINSEQ_PRODUCTS_BF16);
        CHECK_OK(ls_kda_forward_isa(&f.p, &ex, o_clean, h, isa));
        for (int i = 0; i < 2; i++)
            for (int b = 0; b < 2; b++) {
                float *x = i ? f.k : f.v;
                const int64_t at = tokens[i] * s.K; /* K == V: the token's first element */
                const float kept = x[at];
                x[at] = bad[b];
                CHECK_OK(ls_kda_forward_isa(&f.p, &ex, o, h, isa));
                x[at] = kept;
                CHECK(tu_same_bits(o, o_clean, (size_t)(tokens[i] * s.V)),
                      "%s chunk %d: %s %g at token %lld reached an earlier output",
                      ls_isa_name(isa), chunk, i ? "k" : "v", (double)bad[b], (long long)tokens[i]);
            }
    }
    free(o_clean), free(o), free(h);
    kda_fixture_free(&f);
}

/* Where the option does not apply, it changes no bit; an unknown value is refused. */
static void check_not_applied(ls_isa isa)
{
    kda_spec s = {.B = 2,
                  .T = 70,
                  .H = 2,
                  .K = 32,
                  .V = 32,
                  .decay = LINSEQ_DECAY_PER_CHANNEL,
                  .l2norm = true,
                  .with_h0 = true,
                  .gmag = 0.1,
                  .regime = GATE_RAND,
                  .seed = 41};
    kda_fixture f;
    kda_fixture_make(&f, &s);
    float *o_a = tu_alloc(f.n_v), *o_b = tu_alloc(f.n_v);
    float *h_a = tu_alloc(f.n_state), *h_b = tu_alloc(f.n_state);
    linseq_exec ex = exec_of(0, 1, LINSEQ_PRODUCTS_F32);
    CHECK_OK(ls_kda_forward_isa(&f.p, &ex, o_a, h_a, isa));
    ex.products = LINSEQ_PRODUCTS_BF16;
    CHECK_OK(ls_kda_forward_isa(&f.p, &ex, o_b, h_b, isa));
    CHECK(tu_same_bits(o_a, o_b, f.n_v) && tu_same_bits(h_a, h_b, f.n_state),
          "%s recurrent mode: bf16 products changed the results", ls_isa_name(isa));

    size_t saved_bytes = 0;
    ex = exec_of(16, 1, LINSEQ_PRODUCTS_F32);
    CHECK_OK(linseq_kda_saved_size(&f.p, &ex, &saved_bytes));
    void *saved_a = malloc(saved_bytes), *saved_b = malloc(saved_bytes);
    if (!saved_a || !saved_b) abort();
    CHECK_OK(ls_kda_forward_train_isa(&f.p, &ex, o_a, h_a, saved_a, saved_bytes, isa));
    ex.products = LINSEQ_PRODUCTS_BF16;
    CHECK_OK(ls_kda_forward_train_isa(&f.p, &ex, o_b, h_b, saved_b, saved_bytes, isa));
    CHECK(tu_same_bits(h_a, h_b, f.n_state) && memcmp(saved_a, saved_b, saved_bytes) == 0,
          "%s training forward: bf16 products changed the state or the saved block",
          ls_isa_name(isa));
    float *o_inf = tu_alloc(f.n_v);
    CHECK_OK(ls_kda_forward_isa(&f.p, &ex, o_inf, h_a, isa));
    CHECK(tu_same_bits(o_b, o_inf, f.n_v) && !tu_same_bits(o_a, o_b, f.n_v),
          "%s training forward: o is not the bf16 products' o of the inference forward",
          ls_isa_name(isa));
    free(o_inf);

    ex.products = (linseq_products)7;
    tu_poison(o_b, f.n_v * sizeof *o_b);
    CHECK_FAILS(ls_kda_forward_isa(&f.p, &ex, o_b, h_b, isa), LINSEQ_ERR_INVALID_ENUM,
                "exec->products");
    CHECK(tu_is_poisoned(o_b, f.n_v * sizeof *o_b), "a refused call wrote o");
    free(saved_a), free(saved_b), free(o_a), free(o_b), free(h_a), free(h_b);
    kda_fixture_free(&f);
}

int main(void)
{
    static const int64_t cu[] = {0, 50, 51, 180};
    const named_spec specs[] = {
        {"GDN 128x128 slow decay",
         {.B = 1,
          .T = 300,
          .H = 2,
          .K = 128,
          .V = 128,
          .decay = LINSEQ_DECAY_PER_HEAD,
          .l2norm = true,
          .with_h0 = true,
          .gmag = 0.02,
          .regime = GATE_RAND,
          .seed = 1}},
        {"KDA 128x128 per-channel",
         {.B = 1,
          .T = 200,
          .H = 1,
          .HV = 2,
          .K = 128,
          .V = 128,
          .decay = LINSEQ_DECAY_PER_CHANNEL,
          .l2norm = true,
          .with_h0 = true,
          .gmag = 0.05,
          .regime = GATE_RAND,
          .seed = 2}},
        {"odd sizes, varlen",
         {.B = 1,
          .T = 180,
          .H = 2,
          .K = 33,
          .V = 37,
          .decay = LINSEQ_DECAY_PER_CHANNEL,
          .l2norm = true,
          .gmag = 0.1,
          .regime = GATE_EXTREME,
          .n_seqs = 3,
          .cu = cu,
          .seed = 3}},
        {"gated linear attention, V-first",
         {.B = 2,
          .T = 99,
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
          .seed = 4}},
    };
    static const int chunks[] = {16, 64};
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) {
            printf("  %s: not available on this CPU or build\n", ls_isa_name((ls_isa)isa));
            continue;
        }
        const tu_mark mark = tu_mark_now();
        double worst = 0.0;
        for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
            for (int c = 0; c < 2; c++) {
                const double e = check_spec(&specs[i], (ls_isa)isa, chunks[c]);
                if (e > worst) worst = e;
            }
        check_bf16_storage((ls_isa)isa);
        check_causal((ls_isa)isa);
        check_not_applied((ls_isa)isa);
        tu_mark tally = {0};
        tu_tally_add(&tally, mark);
        char detail[96];
        snprintf(detail, sizeof detail, "worst o error %.2e (bound %g)%s", worst, OUT_BOUND,
                 isa == LS_ISA_AVX512 && ls_cpu_has_bf16_dot() ? ", on vdpbf16ps" : "");
        tu_report(ls_isa_name((ls_isa)isa), tally, detail);
    }
    return tu_finish("test_kda_bf16_products");
}
