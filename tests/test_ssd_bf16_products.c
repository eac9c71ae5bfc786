/* SSD's chunked forward and backward with bf16 products (exec->products =
 * LINSEQ_PRODUCTS_BF16).
 *
 * Properties of the forward, chunks 16, 64 and 128, 1, 2 and 3 threads, on every ISA the CPU
 * runs:
 *   - the final state is bit for bit the float32 products' (only y's products take bf16
 *     operands), and y is the same bits for any thread count;
 *   - y is within the bound bf16 operand rounding implies (OPERAND_BOUND below) of the
 *     float64 reference, element by element, and is not the float32 products' bits (a run
 *     that ignored the option would pass the checks before);
 *   - AVX2 and AVX-512 (vdpbf16ps where the CPU has it, widened operands otherwise) give the
 *     same bits: their float32 steps are the same fused arithmetic and the bf16 products are
 *     the same sums either way. The scalar ISA's float32 steps round a * b + c twice, so its
 *     results differ from theirs as its float32 products' do; the plain product below pins
 *     its bf16 products to the same definition;
 *   - on a small problem with A = 0 (every decay exactly 1), y is the bits of a plain
 *     reimplementation of the definition: C B^T, C S and M U between 16-token blocks as sums
 *     of products of operands rounded once to bf16, the odd element of each pair first;
 *   - a NaN or Inf in x, B or C at token t leaves the outputs of earlier tokens the clean
 *     run's bits;
 *   - the recurrent mode and decode ignore the option (the float32 bits); an unknown value is
 *     refused, naming the field, before anything is written.
 * Of the backward (the products that only the tokens' gradients read take bf16 operands, the
 * gradient at the state stays float32), the same chunks, threads and ISAs:
 *   - the float64 backward of ssd_fixture.c is checked first against central differences of
 *     the float64 forward (REF_FD_BOUND);
 *   - dx, ddt, dA, dB, dC, dz and ddt_bias are within bound16 (below) of it, the float32
 *     products' within the much tighter bound32; dh0 and dD are the float32 products' bits,
 *     and every gradient is the same bits on 1, 2 and 3 threads (and dx not float32's);
 *   - a NaN or Inf in d_y at token t leaves the gradients of the tokens after t the clean
 *     run's bits;
 *   - the recurrent mode (the backward runs chunked all the same) and the segment summary's
 *     backward ignore the option. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/half_float.h"
#include "ssd/ssd.h"
#include "ssd_fixture.h"
#include "testutil.h"

/* The error that rounding the products' operands to bf16 implies, element by element: a
 * product of two operands each off by at most 2^-9 relative is off by 2^-8 (and a bit), and
 * M U's operand M, itself a sum of such products, is rounded once more: with exact sums every
 * y before the gate is off by at most 2^-7 sum |terms| = 2^-7 |C| . |S|, where |S| is the
 * state of the recurrence on |x|, |B|, |h0| (each term of C S_t, C S_chunk-start and M U is
 * one of those of |C| . |S_t|, times its decay). The gate multiplies both sides by
 * |silu(z)|; the float32 sums and decays add FLOAT32_SLACK of max |y|. */
#define OPERAND_BOUND 0x1p-7
#define FLOAT32_SLACK 1e-5

/* clang-format off */
static const ssd_spec specs[] = {
    {.name = "Mamba2-like P64 N128", .B = 1, .T = 300, .H = 2, .P = 64, .N = 128, .h0 = true,
     .D = true, .z = true, .softplus = true},
    {.name = "groups, odd sizes, varlen", .B = 1, .T = 130, .H = 4, .P = 20, .N = 17, .G = 2,
     .h0 = true, .D = true, .D_per_channel = true, .softplus = true, .dt_max = 0.6f,
     .cu = ssd_cu_empty, .n_seqs = 4},
    {.name = "N-first, two rows", .B = 2, .T = 70, .H = 2, .P = 16, .N = 32, .h0 = true,
     .n_first = true, .z = true},
};
/* clang-format on */
#define N_SPECS (sizeof specs / sizeof specs[0])

static const int chunks[] = {16, 64, 128};
#define N_CHUNKS (sizeof chunks / sizeof chunks[0])

static linseq_exec exec_of(int chunk, int threads, linseq_products products)
{
    return (linseq_exec){.mode = chunk ? LINSEQ_MODE_CHUNKED : LINSEQ_MODE_RECURRENT,
                         .chunk_size = chunk,
                         .threads = threads,
                         .products = products};
}

/* y of the AVX2 or AVX-512 run that came first, per spec and chunk (the cross-ISA check) */
static float *fma_isa_y[N_SPECS][N_CHUNKS];
static ls_isa fma_isa_of[N_SPECS][N_CHUNKS];
/* per spec, the largest over the ISAs and chunks: y's error over max |y| with bf16 and with
 * float32 products, and its share of the operand rounding's bound (printed for
 * docs/semantics.md) */
static double worst_err[N_SPECS], worst_err32[N_SPECS], worst_share[N_SPECS];

/* |C| . |S_t| per element of y, times |silu(z)| (the bound above without its factor): the
 * reference on the absolute values of the inputs, without D and z. */
static double *operand_magnitude(const ssd_fixture *f)
{
    const linseq_ssd_problem *p = &f->p;
    const size_t counts[] = {f->n_y, f->n_bc, f->n_bc, f->n_s};
    const float *from[] = {p->x, p->B_proj, p->C_proj, p->h0};
    float *abs_of[4];
    for (int k = 0; k < 4; k++) {
        abs_of[k] = tu_alloc(counts[k]);
        for (size_t i = 0; from[k] && i < counts[k]; i++) abs_of[k][i] = fabsf(from[k][i]);
    }
    linseq_ssd_problem a = *p;
    a.x = abs_of[0], a.B_proj = abs_of[1], a.C_proj = abs_of[2];
    a.h0 = p->h0 ? abs_of[3] : NULL, a.D_skip = NULL, a.z = NULL;
    double *mag = malloc(f->n_y * sizeof *mag);
    if (!mag) abort();
    ssd_reference(&a, mag, NULL);
    for (size_t i = 0; p->z && i < f->n_y; i++) mag[i] *= fabs(p->z[i] / (1.0 + exp(-p->z[i])));
    for (int k = 0; k < 4; k++) free(abs_of[k]);
    return mag;
}

/* The largest |y - y_ref| as a share of OPERAND_BOUND |C| . |S| + FLOAT32_SLACK max |y_ref|
 * (<= 1: within the bound) */
static double bound_share(const float *y, const double *y_ref, const double *mag, size_t n)
{
    double top = 0.0, share = 0.0;
    for (size_t i = 0; i < n; i++) top = fmax(top, fabs(y_ref[i]));
    for (size_t i = 0; i < n; i++) {
        const double e = isfinite(y[i]) ? fabs(y[i] - y_ref[i]) : INFINITY;
        share = fmax(share, e / (OPERAND_BOUND * mag[i] + FLOAT32_SLACK * top));
    }
    return share;
}

/* One spec and chunk on one ISA: the float32 products' run, then the bf16 products' on 1-3
 * threads. */
static void check_spec(size_t si, size_t ci, ls_isa isa)
{
    const ssd_spec *s = &specs[si];
    const int chunk = chunks[ci];
    ssd_fixture f;
    ssd_fixture_make(&f, s, 700 + si);
    double *y_ref = malloc(f.n_y * sizeof *y_ref);
    if (!y_ref) abort();
    ssd_reference(&f.p, y_ref, NULL);
    float *y32 = tu_alloc(f.n_y), *h32 = tu_alloc(f.n_s);
    linseq_exec ex = exec_of(chunk, 1, LINSEQ_PRODUCTS_F32);
    CHECK_OK(ls_ssd_forward_isa(&f.p, &ex, y32, h32, isa));
    float *y1 = tu_alloc(f.n_y), *y = tu_alloc_poisoned(f.n_y), *h = tu_alloc_poisoned(f.n_s);
    for (int threads = 1; threads <= 3; threads++) {
        ex = exec_of(chunk, threads, LINSEQ_PRODUCTS_BF16);
        CHECK_OK(ls_ssd_forward_isa(&f.p, &ex, threads == 1 ? y1 : y, h, isa));
        CHECK(tu_same_bits(h, h32, f.n_s),
              "%s %s chunk %d, %d threads: the final state is not the float32 products' bits",
              s->name, ls_isa_name(isa), chunk, threads);
        if (threads > 1)
            CHECK(tu_same_bits(y, y1, f.n_y), "%s %s chunk %d: y on %d threads differs from 1",
                  s->name, ls_isa_name(isa), chunk, threads);
    }
    const double err = tu_rel_err_d(y1, y_ref, f.n_y), err32 = tu_rel_err_d(y32, y_ref, f.n_y);
    double *mag = operand_magnitude(&f);
    const double share = bound_share(y1, y_ref, mag, f.n_y);
    worst_err[si] = fmax(worst_err[si], err), worst_err32[si] = fmax(worst_err32[si], err32);
    worst_share[si] = fmax(worst_share[si], share);
    CHECK(share <= 1.0,
          "%s %s chunk %d: y error %.3g of the operand rounding's bound (%.3g of max |y|; "
          "float32 products: %.3g)",
          s->name, ls_isa_name(isa), chunk, share, err, err32);
    free(mag);
    CHECK(!tu_same_bits(y1, y32, f.n_y), "%s %s chunk %d: y is the float32 products' bits", s->name,
          ls_isa_name(isa), chunk);
    if (isa != LS_ISA_SCALAR) {
        if (!fma_isa_y[si][ci]) {
            fma_isa_y[si][ci] = y1, fma_isa_of[si][ci] = isa;
            y1 = NULL;
        } else {
            CHECK(tu_same_bits(y1, fma_isa_y[si][ci], f.n_y),
                  "%s chunk %d: y on %s differs from %s", s->name, chunk, ls_isa_name(isa),
                  ls_isa_name(fma_isa_of[si][ci]));
        }
    }
    free(y_ref), free(y32), free(h32), free(y1), free(y), free(h);
    ssd_fixture_free(&f);
}

/* ---- the backward ----------------------------------------------------------------------- */

/* The gradients checked against float64: those of linseq_ssd_grads but dD and dh0, which no
 * bf16 product reaches (dh0 is the gradient at the state, dD reads dY and x only): those two
 * are checked for the float32 products' bits. */
enum { G_DX, G_DDT, G_DA, G_DB, G_DC, G_DZ, G_DBIAS, G_DD, G_DH0, N_GRADS };
static const char *const grad_names[N_GRADS] = {"dx", "ddt",      "dA", "dB", "dC",
                                                "dz", "ddt_bias", "dD", "dh0"};
#define N_MEASURED G_DD

/* The bounds on each gradient's error against float64: the largest absolute error over the
 * largest |reference| of that tensor (dx, ddt, dA, dB, dC, dz, ddt_bias).
 * bf16 products: a product of two operands each rounded once (2^-9 relative) is off by at
 * most 2^-8 of sum |a b|, and the per-token gradients are sums of such products whose sums of
 * |terms| stay within a few max |gradient| for these inputs (N(0,1) x, B, C, z and d_y,
 * decays <= 1): measured at most 4.5e-3 (about 1.2 * 2^-8) over the specs, ISAs and chunks,
 * bound 1e-2. dA sums d_t times the gradient at every partial sum lam over all of a head's
 * tokens, terms that largely cancel (its float32 products' error, 4.3e-4, is 50x the other
 * gradients'): measured 2.6e-2, bound 6e-2.
 * float32 products: measured at most 1.9e-5 (ddt_bias; dx 9.1e-6), dA 4.3e-4; bounds 1e-4 and
 * 2e-3, below the bf16 products' smallest measured error of each gradient (8.9e-4 for
 * ddt_bias, 4.9e-3 for dA), so that bf16 operands in a product the rule keeps float32 fail. */
static const double bound32[N_MEASURED] = {1e-4, 1e-4, 2e-3, 1e-4, 1e-4, 1e-4, 1e-4};
static const double bound16[N_MEASURED] = {1e-2, 1e-2, 6e-2, 1e-2, 1e-2, 1e-2, 1e-2};

/* per spec and gradient, the largest over ISAs and chunks, with bf16 and float32 products */
static double worst_g16[N_SPECS][N_MEASURED], worst_g32[N_SPECS][N_MEASURED];

/* One backward's gradients (and their element counts), all a spec has. */
typedef struct grad_set {
    float *g[N_GRADS];
    size_t n[N_GRADS];
} grad_set;

static void grads_alloc(grad_set *gs, const ssd_fixture *f, const ssd_spec *s)
{
    const size_t n[N_GRADS] = {f->n_y,
                               f->n_dt,
                               (size_t)s->H,
                               f->n_bc,
                               f->n_bc,
                               s->z ? f->n_y : 0,
                               s->softplus ? (size_t)s->H : 0,
                               s->D ? f->n_d : 0,
                               f->n_s};
    for (int k = 0; k < N_GRADS; k++) {
        gs->n[k] = n[k];
        gs->g[k] = n[k] ? tu_alloc_poisoned(n[k]) : NULL;
    }
}

static void grads_free(grad_set *gs)
{
    for (int k = 0; k < N_GRADS; k++) free(gs->g[k]);
}

static void backward_into(const ssd_fixture *f, const linseq_exec *ex, ls_isa isa, const float *d_y,
                          const float *d_hT, grad_set *gs)
{
    const linseq_ssd_grads g = {.dx = gs->g[G_DX],
                                .ddt = gs->g[G_DDT],
                                .dA = gs->g[G_DA],
                                .dB_proj = gs->g[G_DB],
                                .dC_proj = gs->g[G_DC],
                                .dz = gs->g[G_DZ],
                                .ddt_bias = gs->g[G_DBIAS],
                                .dD_skip = gs->g[G_DD],
                                .dh0 = gs->g[G_DH0]};
    CHECK_OK(ls_ssd_backward_isa(&f->p, ex, d_y, d_hT, &g, isa));
}

static bool grads_same_bits(const grad_set *a, const grad_set *b)
{
    bool same = true;
    for (int k = 0; k < N_GRADS; k++) same = same && tu_same_bits(a->g[k], b->g[k], a->n[k]);
    return same;
}

/* The float64 gradients of a fixture's problem, one buffer per gradient of grad_set. */
static void reference_grads(const ssd_fixture *f, const grad_set *gs, const float *d_y,
                            const float *d_hT, double *ref[N_GRADS])
{
    for (int k = 0; k < N_GRADS; k++) {
        ref[k] = gs->n[k] ? malloc(gs->n[k] * sizeof *ref[k]) : NULL;
        if (gs->n[k] && !ref[k]) abort();
    }
    const ssd_ref_grads g = {.dx = ref[G_DX],
                             .ddt = ref[G_DDT],
                             .dA = ref[G_DA],
                             .dB = ref[G_DB],
                             .dC = ref[G_DC],
                             .dz = ref[G_DZ],
                             .ddt_bias = ref[G_DBIAS],
                             .dD = ref[G_DD],
                             .dh0 = ref[G_DH0]};
    ssd_reference_backward(&f->p, d_y, d_hT, &g);
}

/* L = sum(y * d_y) + sum(hT * d_hT) of the double reference. */
static double ref_loss(const ssd_fixture *f, const float *d_y, const float *d_hT)
{
    double *y = malloc(f->n_y * sizeof *y), *hT = malloc(f->n_s * sizeof *hT), loss = 0.0;
    if (!y || !hT) abort();
    ssd_reference(&f->p, y, hT);
    for (size_t i = 0; i < f->n_y; i++) loss += y[i] * d_y[i];
    for (size_t i = 0; i < f->n_s; i++) loss += hT[i] * d_hT[i];
    free(y), free(hT);
    return loss;
}

/* The float64 backward against central differences of the float64 forward's loss, at up to
 * 40 elements of every gradient of small problems (every option the specs above use): within
 * REF_FD_BOUND of the gradient's largest |value|. The steps are 1e-4 of max(1, |input|), taken
 * as the float inputs hold them, so the differences' own error (the third derivative times
 * 1e-8, double's rounding over 1e-4) is far below it; a float32-grade or wrong reference
 * misses it by orders of magnitude. */
#define REF_FD_BOUND 1e-6
static void check_reference_backward(void)
{
    /* clang-format off */
    static const ssd_spec small[] = {
        {.name = "fd groups, z", .B = 2, .T = 11, .H = 4, .P = 3, .N = 5, .G = 2, .h0 = true,
         .D = true, .z = true},
        {.name = "fd N-first, clamp", .B = 1, .T = 23, .H = 2, .P = 4, .N = 3, .h0 = true,
         .softplus = true, .dt_max = 0.6f, .D = true, .D_per_channel = true, .n_first = true},
        {.name = "fd varlen", .B = 1, .T = 130, .H = 2, .P = 5, .N = 4, .h0 = true,
         .softplus = true, .z = true, .D = true, .cu = ssd_cu_empty, .n_seqs = 4},
    };
    /* clang-format on */
    const tu_mark mark = tu_mark_now();
    double worst = 0.0;
    for (size_t si = 0; si < sizeof small / sizeof small[0]; si++) {
        const ssd_spec *s = &small[si];
        ssd_fixture f;
        ssd_fixture_make(&f, s, 600 + si);
        float *d_y = tu_alloc(f.n_y), *d_hT = tu_alloc(f.n_s);
        tu_rng r = {650 + si};
        tu_fill_normal(&r, d_y, f.n_y, 1.0);
        tu_fill_normal(&r, d_hT, f.n_s, 1.0);
        grad_set gs;
        grads_alloc(&gs, &f, s);
        double *ref[N_GRADS];
        reference_grads(&f, &gs, d_y, d_hT, ref);
        float *const inputs[N_GRADS] = {f.x, f.dt, f.A, f.Bp, f.Cp, f.z, f.dt_bias, f.D, f.h0};
        for (int k = 0; k < N_GRADS; k++) {
            const size_t n = gs.n[k];
            double top = 0.0, err = 0.0;
            for (size_t i = 0; i < n; i++) top = fmax(top, fabs(ref[k][i]));
            for (size_t m = 0; m < 40 && m < n; m++) {
                const size_t i = n <= 40 ? m : m * (n - 1) / 39;
                float *in = inputs[k] + i;
                const float keep = *in;
                const double h = 1e-4 * fmax(1.0, fabs(keep));
                *in = (float)(keep + h);
                const double up = ref_loss(&f, d_y, d_hT), h_up = (double)*in - keep;
                *in = (float)(keep - h);
                const double down = ref_loss(&f, d_y, d_hT), h_down = keep - (double)*in;
                *in = keep;
                err = fmax(err, fabs((up - down) / (h_up + h_down) - ref[k][i]));
            }
            err /= fmax(top, 1e-30);
            worst = fmax(worst, err);
            CHECK(n == 0 || err <= REF_FD_BOUND,
                  "%s: the float64 backward's %s is %.3g of its max off central differences",
                  s->name, grad_names[k], err);
        }
        for (int k = 0; k < N_GRADS; k++) free(ref[k]);
        grads_free(&gs);
        free(d_y), free(d_hT);
        ssd_fixture_free(&f);
    }
    tu_mark tally = {0, 0};
    tu_tally_add(&tally, mark);
    char detail[96];
    snprintf(detail, sizeof detail, "the float64 backward vs central differences, worst %.1e",
             worst);
    tu_report("test_ssd_bf16_products reference", tally, detail);
}

/* One spec and chunk on one ISA: the float32 products' backward, then the bf16 products' on
 * 1-3 threads. */
static void check_backward(size_t si, size_t ci, ls_isa isa)
{
    const ssd_spec *s = &specs[si];
    const int chunk = chunks[ci];
    ssd_fixture f;
    ssd_fixture_make(&f, s, 800 + si);
    float *d_y = tu_alloc(f.n_y), *d_hT = tu_alloc(f.n_s);
    tu_rng r = {900 + si};
    tu_fill_normal(&r, d_y, f.n_y, 1.0);
    tu_fill_normal(&r, d_hT, f.n_s, 1.0);
    grad_set g32, g1, g;
    grads_alloc(&g32, &f, s), grads_alloc(&g1, &f, s), grads_alloc(&g, &f, s);
    linseq_exec ex = exec_of(chunk, 1, LINSEQ_PRODUCTS_F32);
    backward_into(&f, &ex, isa, d_y, d_hT, &g32);
    for (int threads = 1; threads <= 3; threads++) {
        ex = exec_of(chunk, threads, LINSEQ_PRODUCTS_BF16);
        backward_into(&f, &ex, isa, d_y, d_hT, threads == 1 ? &g1 : &g);
        if (threads > 1)
            CHECK(grads_same_bits(&g, &g1), "%s %s chunk %d: gradients on %d threads differ from 1",
                  s->name, ls_isa_name(isa), chunk, threads);
    }
    for (int k = N_MEASURED; k < N_GRADS; k++)
        CHECK(tu_same_bits(g1.g[k], g32.g[k], g1.n[k]),
              "%s %s chunk %d: %s is not the float32 products' bits", s->name, ls_isa_name(isa),
              chunk, grad_names[k]);
    CHECK(!tu_same_bits(g1.g[G_DX], g32.g[G_DX], g1.n[G_DX]),
          "%s %s chunk %d: dx is the float32 products' bits", s->name, ls_isa_name(isa), chunk);
    double *ref[N_GRADS];
    reference_grads(&f, &g1, d_y, d_hT, ref);
    for (int k = 0; k < N_MEASURED; k++) {
        if (!g1.n[k]) continue;
        const double e16 = tu_rel_err_d(g1.g[k], ref[k], g1.n[k]);
        const double e32 = tu_rel_err_d(g32.g[k], ref[k], g1.n[k]);
        worst_g16[si][k] = fmax(worst_g16[si][k], e16);
        worst_g32[si][k] = fmax(worst_g32[si][k], e32);
        CHECK(e16 <= bound16[k], "%s %s chunk %d: %s error %.3g with bf16 products, above %.3g",
              s->name, ls_isa_name(isa), chunk, grad_names[k], e16, bound16[k]);
        CHECK(e32 <= bound32[k], "%s %s chunk %d: %s error %.3g with float32 products, above %.3g",
              s->name, ls_isa_name(isa), chunk, grad_names[k], e32, bound32[k]);
    }
    for (int k = 0; k < N_GRADS; k++) free(ref[k]);
    grads_free(&g32), grads_free(&g1), grads_free(&g);
    free(d_y), free(d_hT);
    ssd_fixture_free(&f);
}

/* ---- the plain reimplementation ------------------------------------------------------- */

/* x rounded once to bf16 (nearest even), a subnormal result flushed to a zero of its sign */
static float bf16_operand(float x)
{
    const uint16_t h = ls_f32_to_bf16(x);
    return ls_bf16_to_f32((h & 0x7f80u) ? h : (uint16_t)(h & 0x8000u));
}

/* sum_k a[k * as] b[k * bs] over k < K with bf16 operands as the products define it: per pair
 * (2q, 2q + 1) the odd element's product first, each step rounded once (a product of two
 * bf16 is exact in float32, so fmaf rounds only the sum). */
static float bf16_dot(float acc, int64_t K, const float *a, int64_t as, const float *b, int64_t bs)
{
    for (int64_t q = 0; 2 * q < K; q++) {
        if (2 * q + 1 < K)
            acc = fmaf(bf16_operand(a[(2 * q + 1) * as]), bf16_operand(b[(2 * q + 1) * bs]), acc);
        acc = fmaf(bf16_operand(a[2 * q * as]), bf16_operand(b[2 * q * bs]), acc);
    }
    return acc;
}

/* a b + c as the ISA's float32 steps round it: once with FMA, twice on the scalar ISA */
static float isa_fmadd(ls_isa isa, float a, float b, float c)
{
    if (isa != LS_ISA_SCALAR) return fmaf(a, b, c);
    volatile float ab = a * b;
    return ab + c;
}

/* y of one chunk of n tokens from t0 (one row, one head, no D, no z, A = 0: every decay is 1)
 * with chunk-start state S [P,N] (mamba's layout), M [n,n] and U [n,P] scratch. */
static void plain_chunk(ls_isa isa, const linseq_ssd_problem *p, int64_t t0, int64_t n,
                        const float *S, float *M, float *U, float *y)
{
    const int64_t P = p->P, N = p->N, SB = SSD_BF16_BLOCK;
    for (int64_t j = 0; j < n; j++)
        for (int64_t c = 0; c < P; c++) U[j * P + c] = p->dt[t0 + j] * p->x[(t0 + j) * P + c];
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j <= i; j++)
            M[i * n + j] =
                bf16_dot(0.0f, N, p->C_proj + (t0 + i) * N, 1, p->B_proj + (t0 + j) * N, 1);
    for (int64_t i = 0; i < n; i++) {
        const int64_t r0 = i / SB * SB; /* the first token of i's block */
        for (int64_t c = 0; c < P; c++) {
            float acc = bf16_dot(0.0f, N, p->C_proj + (t0 + i) * N, 1, S + c * N, 1);
            acc = bf16_dot(acc, r0, M + i * n, 1, U + c, P);
            for (int64_t j = r0; j <= i; j++) acc = isa_fmadd(isa, M[i * n + j], U[j * P + c], acc);
            y[(t0 + i) * P + c] = acc;
        }
    }
}

/* Two chunks of 32 and one of 13 tokens (two 16-token blocks, then one), P and N odd: y is
 * the plain definition's bits, the state at each chunk's start the float32 forward's over the
 * tokens before it (the same bits: the state never takes bf16 operands). */
static void check_plain(ls_isa isa)
{
    const ssd_spec s = {.name = "plain", .B = 1, .T = 77, .H = 1, .P = 7, .N = 9, .h0 = true};
    const int chunk = 32;
    ssd_fixture f;
    ssd_fixture_make(&f, &s, 77);
    f.A[0] = 0.0f;
    float *y = tu_alloc(f.n_y), *y32 = tu_alloc(f.n_y), *want = tu_alloc(f.n_y);
    float *h = tu_alloc(f.n_s), *S = tu_alloc(f.n_s), *y_before = tu_alloc(f.n_y);
    float *M = tu_alloc((size_t)(chunk * chunk)), *U = tu_alloc((size_t)(chunk * s.P));
    linseq_exec ex = exec_of(chunk, 1, LINSEQ_PRODUCTS_BF16);
    CHECK_OK(ls_ssd_forward_isa(&f.p, &ex, y, h, isa));
    ex.products = LINSEQ_PRODUCTS_F32;
    CHECK_OK(ls_ssd_forward_isa(&f.p, &ex, y32, h, isa));
    for (int64_t t0 = 0; t0 < s.T; t0 += chunk) {
        linseq_ssd_problem before = f.p;
        before.T = t0;
        if (t0 == 0)
            memcpy(S, f.h0, f.n_s * sizeof *S);
        else
            CHECK_OK(ls_ssd_forward_isa(&before, &ex, y_before, S, isa));
        plain_chunk(isa, &f.p, t0, s.T - t0 < chunk ? s.T - t0 : chunk, S, M, U, want);
    }
    CHECK(tu_same_bits(y, want, f.n_y), "%s: y is not the plain bf16 products' bits",
          ls_isa_name(isa));
    CHECK(!tu_same_bits(y, y32, f.n_y), "%s: the plain case's y is the float32 products' bits",
          ls_isa_name(isa));
    free(y), free(y32), free(want), free(h), free(S), free(M), free(U), free(y_before);
    ssd_fixture_free(&f);
}

/* ---- isolation, where the option does not apply, refusal ------------------------------ */

/* A NaN or Inf in x, B or C at token t (inside a 16-token block, past the first chunk at
 * chunk 16): the outputs of the tokens before t keep the clean run's bits (no bf16 product
 * visits a later token). */
static void check_causal(ls_isa isa)
{
    const ssd_spec s = {.B = 1, .T = 100, .H = 2, .P = 16, .N = 32, .h0 = true, .z = true};
    ssd_fixture f;
    ssd_fixture_make(&f, &s, 51);
    float *y_clean = tu_alloc(f.n_y), *y = tu_alloc(f.n_y), *h = tu_alloc(f.n_s);
    static const int64_t tokens[] = {21, 70};
    static const float bad[] = {NAN, INFINITY};
    static const char *const names[] = {"x", "B", "C"};
    for (int chunk = 16; chunk <= 64; chunk *= 4) {
        linseq_exec ex = exec_of(chunk, 1, LINSEQ_PRODUCTS_BF16);
        CHECK_OK(ls_ssd_forward_isa(&f.p, &ex, y_clean, h, isa));
        for (int k = 0; k < 3; k++)
            for (size_t t = 0; t < 2; t++)
                for (int b = 0; b < 2; b++) {
                    float *in = k == 0 ? f.x : k == 1 ? f.Bp : f.Cp;
                    const int64_t at = tokens[t] * (k == 0 ? s.H * s.P : s.N) + 3;
                    const float kept = in[at];
                    in[at] = bad[b];
                    CHECK_OK(ls_ssd_forward_isa(&f.p, &ex, y, h, isa));
                    in[at] = kept;
                    CHECK(tu_same_bits(y, y_clean, (size_t)(tokens[t] * s.H * s.P)),
                          "%s chunk %d: %s %g at token %lld reached an earlier output",
                          ls_isa_name(isa), chunk, names[k], (double)bad[b], (long long)tokens[t]);
                }
    }
    free(y_clean), free(y), free(h);
    ssd_fixture_free(&f);
}

/* The backward: a NaN or Inf in d_y at token t (inside a 16-token block, past the first chunk
 * at chunk 16) leaves every per-token gradient of the tokens after t the clean run's bits
 * (gradients flow back in time; no bf16 product between blocks visits a token across the
 * causal mask, and each block's own triangle stays float32). */
static void check_causal_backward(ls_isa isa)
{
    const ssd_spec s = {.B = 1,
                        .T = 100,
                        .H = 2,
                        .P = 16,
                        .N = 32,
                        .G = 1,
                        .h0 = true,
                        .D = true,
                        .z = true,
                        .softplus = true};
    ssd_fixture f;
    ssd_fixture_make(&f, &s, 52);
    float *d_y = tu_alloc(f.n_y);
    tu_rng r = {53};
    tu_fill_normal(&r, d_y, f.n_y, 1.0);
    grad_set clean, g;
    grads_alloc(&clean, &f, &s), grads_alloc(&g, &f, &s);
    static const int64_t tokens[] = {21, 70};
    static const float bad[] = {NAN, INFINITY};
    /* the per-token gradients and their elements per token */
    static const int per_token[] = {G_DX, G_DDT, G_DB, G_DC, G_DZ};
    const int64_t width[] = {s.H * s.P, s.H, s.N, s.N, s.H * s.P};
    for (int chunk = 16; chunk <= 64; chunk *= 4) {
        const linseq_exec ex = exec_of(chunk, 1, LINSEQ_PRODUCTS_BF16);
        backward_into(&f, &ex, isa, d_y, NULL, &clean);
        for (size_t t = 0; t < 2; t++)
            for (int b = 0; b < 2; b++) {
                const int64_t at = tokens[t] * s.H * s.P + 3;
                const float kept = d_y[at];
                d_y[at] = bad[b];
                backward_into(&f, &ex, isa, d_y, NULL, &g);
                d_y[at] = kept;
                for (int k = 0; k < 5; k++) {
                    const int gi = per_token[k];
                    const size_t from = (size_t)((tokens[t] + 1) * width[k]);
                    CHECK(tu_same_bits(g.g[gi] + from, clean.g[gi] + from, g.n[gi] - from),
                          "%s chunk %d: d_y %g at token %lld reached %s of a later token",
                          ls_isa_name(isa), chunk, (double)bad[b], (long long)tokens[t],
                          grad_names[gi]);
                }
                CHECK(!isfinite(g.g[G_DX][tokens[t] * s.H * s.P + 3]),
                      "%s chunk %d: d_y %g at token %lld did not reach its own dx",
                      ls_isa_name(isa), chunk, (double)bad[b], (long long)tokens[t]);
            }
    }
    grads_free(&clean), grads_free(&g);
    free(d_y);
    ssd_fixture_free(&f);
}

/* Where the option does not apply, it changes no bit; an unknown value is refused. */
static void check_not_applied(ls_isa isa)
{
    const ssd_spec s = {.B = 2, .T = 40, .H = 2, .P = 16, .N = 32, .h0 = true, .D = true};
    ssd_fixture f;
    ssd_fixture_make(&f, &s, 41);
    float *y_a = tu_alloc(f.n_y), *y_b = tu_alloc(f.n_y);
    float *h_a = tu_alloc(f.n_s), *h_b = tu_alloc(f.n_s);
    linseq_exec ex = exec_of(0, 1, LINSEQ_PRODUCTS_F32);
    CHECK_OK(ls_ssd_forward_isa(&f.p, &ex, y_a, h_a, isa));
    ex.products = LINSEQ_PRODUCTS_BF16;
    CHECK_OK(ls_ssd_forward_isa(&f.p, &ex, y_b, h_b, isa));
    CHECK(tu_same_bits(y_a, y_b, f.n_y) && tu_same_bits(h_a, h_b, f.n_s),
          "%s recurrent mode: bf16 products changed the results", ls_isa_name(isa));

    /* decode: one token over the pool h_a (and its copy h_b) */
    linseq_ssd_problem step = f.p;
    step.T = 1, step.h0 = NULL;
    memcpy(h_a, f.h0, f.n_s * sizeof *h_a), memcpy(h_b, f.h0, f.n_s * sizeof *h_b);
    ex.products = LINSEQ_PRODUCTS_F32;
    CHECK_OK(ls_ssd_decode_isa(&step, &ex, h_a, s.B, NULL, y_a, isa));
    ex.products = LINSEQ_PRODUCTS_BF16;
    CHECK_OK(ls_ssd_decode_isa(&step, &ex, h_b, s.B, NULL, y_b, isa));
    CHECK(tu_same_bits(y_a, y_b, (size_t)(s.B * s.H * s.P)) && tu_same_bits(h_a, h_b, f.n_s),
          "%s decode: bf16 products changed the results", ls_isa_name(isa));

    /* the backward in the recurrent mode (which runs it chunked, chunk 64 and 16) */
    float *d_y = tu_alloc(f.n_y);
    tu_rng r = {9};
    tu_fill_normal(&r, d_y, f.n_y, 1.0);
    grad_set g_a, g_b;
    grads_alloc(&g_a, &f, &s), grads_alloc(&g_b, &f, &s);
    for (int chunk = 0; chunk <= 16; chunk += 16) {
        ex = exec_of(0, 1, LINSEQ_PRODUCTS_F32);
        ex.chunk_size = chunk;
        backward_into(&f, &ex, isa, d_y, NULL, &g_a);
        ex.products = LINSEQ_PRODUCTS_BF16;
        backward_into(&f, &ex, isa, d_y, NULL, &g_b);
        CHECK(grads_same_bits(&g_a, &g_b),
              "%s recurrent mode, chunk %d: bf16 products changed the backward's gradients",
              ls_isa_name(isa), chunk);
    }

    /* the segment summary's backward (its forward has no product that only y reads) */
    linseq_ssd_problem seg = f.p;
    seg.h0 = NULL;
    float *d_P = tu_alloc((size_t)(s.B * s.H)), *d_R = tu_alloc(f.n_s);
    tu_fill_normal(&r, d_P, (size_t)(s.B * s.H), 1.0);
    tu_fill_normal(&r, d_R, f.n_s, 1.0);
    for (int k = 0; k < 2; k++) {
        grad_set *gs = k ? &g_b : &g_a;
        const linseq_ssd_grads g = {
            .dx = gs->g[G_DX], .ddt = gs->g[G_DDT], .dA = gs->g[G_DA], .dB_proj = gs->g[G_DB]};
        ex = exec_of(16, 1, k ? LINSEQ_PRODUCTS_BF16 : LINSEQ_PRODUCTS_F32);
        CHECK_OK(ls_ssd_segment_backward_isa(&seg, &ex, d_P, d_R, &g, isa));
    }
    bool same = true;
    for (int k = G_DX; k <= G_DB; k++) same = same && tu_same_bits(g_a.g[k], g_b.g[k], g_a.n[k]);
    CHECK(same, "%s segment summary: bf16 products changed the backward's gradients",
          ls_isa_name(isa));
    free(d_P), free(d_R);

    ex.products = (linseq_products)7;
    tu_poison(y_b, f.n_y * sizeof *y_b);
    CHECK_FAILS(ls_ssd_forward_isa(&f.p, &ex, y_b, h_b, isa), LINSEQ_ERR_INVALID_ENUM,
                "exec->products");
    CHECK(tu_is_poisoned(y_b, f.n_y * sizeof *y_b), "a refused call wrote y");
    const linseq_ssd_grads g = {.dx = g_b.g[G_DX]};
    tu_poison(g_b.g[G_DX], f.n_y * sizeof *g_b.g[G_DX]);
    CHECK_FAILS(ls_ssd_backward_isa(&f.p, &ex, d_y, NULL, &g, isa), LINSEQ_ERR_INVALID_ENUM,
                "exec->products");
    CHECK(tu_is_poisoned(g_b.g[G_DX], f.n_y * sizeof *g_b.g[G_DX]), "a refused backward wrote dx");
    grads_free(&g_a), grads_free(&g_b);
    free(d_y), free(y_a), free(y_b), free(h_a), free(h_b);
    ssd_fixture_free(&f);
}

static void tests(ls_isa isa)
{
    for (size_t si = 0; si < N_SPECS; si++)
        for (size_t ci = 0; ci < N_CHUNKS; ci++) check_spec(si, ci, isa);
    for (size_t si = 0; si < N_SPECS; si++)
        for (size_t ci = 0; ci < N_CHUNKS; ci++) check_backward(si, ci, isa);
    check_plain(isa);
    check_causal(isa);
    check_causal_backward(isa);
    check_not_applied(isa);
}

int main(void)
{
    char detail[160];
    snprintf(detail, sizeof detail, "bf16 products%s",
             ls_cpu_has_bf16_dot() ? ", AVX-512 on vdpbf16ps" : "");
    check_reference_backward();
    ssd_each_isa("test_ssd_bf16_products", tests, detail);
    for (size_t si = 0; si < N_SPECS; si++)
        printf("  %s: y error %.2e of max |y| (float32 products %.2e), %.2f of the operand "
               "rounding's bound\n",
               specs[si].name, worst_err[si], worst_err32[si], worst_share[si]);
    for (size_t si = 0; si < N_SPECS; si++)
        for (int k = 0; k < N_MEASURED; k++)
            if (worst_g32[si][k] > 0.0)
                printf("  %s: %s error %.2e of max |ref| (float32 products %.2e)\n", specs[si].name,
                       grad_names[k], worst_g16[si][k], worst_g32[si][k]);
    for (size_t si = 0; si < N_SPECS; si++)
        for (size_t ci = 0; ci < N_CHUNKS; ci++) free(fma_isa_y[si][ci]);
    return tu_finish("test_ssd_bf16_products");
}
