/* SSD's chunked forward with bf16 products (exec->products = LINSEQ_PRODUCTS_BF16).
 *
 * Properties, chunks 16, 64 and 128, 1, 2 and 3 threads, on every ISA the CPU runs:
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
 *   - the recurrent mode, decode and the backward ignore the option (the float32 bits); an
 *     unknown value is refused, naming the field, before anything is written. */
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

/* The backward's gradients under exec, into one buffer per gradient */
static void run_backward(const ssd_fixture *f, const linseq_exec *ex, ls_isa isa, const float *d_y,
                         float *const g[5])
{
    const linseq_ssd_grads grads = {
        .dx = g[0], .ddt = g[1], .dB_proj = g[2], .dC_proj = g[3], .dh0 = g[4]};
    CHECK_OK(ls_ssd_backward_isa(&f->p, ex, d_y, NULL, &grads, isa));
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

    float *d_y = tu_alloc(f.n_y), *g_a[5], *g_b[5];
    const size_t n_g[5] = {f.n_y, f.n_dt, f.n_bc, f.n_bc, f.n_s};
    tu_rng r = {9};
    tu_fill_normal(&r, d_y, f.n_y, 1.0);
    for (int i = 0; i < 5; i++) g_a[i] = tu_alloc(n_g[i]), g_b[i] = tu_alloc(n_g[i]);
    ex = exec_of(16, 1, LINSEQ_PRODUCTS_F32);
    run_backward(&f, &ex, isa, d_y, g_a);
    ex.products = LINSEQ_PRODUCTS_BF16;
    run_backward(&f, &ex, isa, d_y, g_b);
    bool same = true;
    for (int i = 0; i < 5; i++) same = same && tu_same_bits(g_a[i], g_b[i], n_g[i]);
    CHECK(same, "%s backward: bf16 products changed the gradients", ls_isa_name(isa));

    ex.products = (linseq_products)7;
    tu_poison(y_b, f.n_y * sizeof *y_b);
    CHECK_FAILS(ls_ssd_forward_isa(&f.p, &ex, y_b, h_b, isa), LINSEQ_ERR_INVALID_ENUM,
                "exec->products");
    CHECK(tu_is_poisoned(y_b, f.n_y * sizeof *y_b), "a refused call wrote y");
    for (int i = 0; i < 5; i++) free(g_a[i]), free(g_b[i]);
    free(d_y), free(y_a), free(y_b), free(h_a), free(h_b);
    ssd_fixture_free(&f);
}

static void tests(ls_isa isa)
{
    for (size_t si = 0; si < N_SPECS; si++)
        for (size_t ci = 0; ci < N_CHUNKS; ci++) check_spec(si, ci, isa);
    check_plain(isa);
    check_causal(isa);
    check_not_applied(isa);
}

int main(void)
{
    char detail[160];
    snprintf(detail, sizeof detail, "bf16 products%s",
             ls_cpu_has_bf16_dot() ? ", AVX-512 on vdpbf16ps" : "");
    ssd_each_isa("test_ssd_bf16_products", tests, detail);
    for (size_t si = 0; si < N_SPECS; si++)
        printf("  %s: y error %.2e of max |y| (float32 products %.2e), %.2f of the operand "
               "rounding's bound\n",
               specs[si].name, worst_err[si], worst_err32[si], worst_share[si]);
    for (size_t si = 0; si < N_SPECS; si++)
        for (size_t ci = 0; ci < N_CHUNKS; ci++) free(fma_isa_y[si][ci]);
    return tu_finish("test_ssd_bf16_products");
}
