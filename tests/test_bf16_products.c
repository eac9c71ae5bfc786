/* The bf16-operand products (simd/gemm_bf16.h): on every ISA, and on vdpbf16ps where the CPU
 * has AVX512-BF16, bit for bit the arithmetic gemm_bf16.h defines (modelled here on its own:
 * operands rounded once to bf16, then per pair c += a_odd b_odd, c += a_even b_even, each
 * rounded once), within a float64 bound of the exact product, over shapes with every tail;
 * and what the instruction does at the edges of that definition (the order of its two
 * steps, subnormal results). */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "core/half_float.h"
#include "simd/bf16_products.h"
#include "simd/isa.h"
#include "testutil.h"

/* The bf16 value gemm_bf16.h gives x: nearest even, a subnormal result flushed to zero. */
static float bf16_ftz(float x)
{
    const uint16_t h = ls_f32_to_bf16(x);
    return ls_bf16_to_f32((h & 0x7f80u) ? h : (uint16_t)(h & 0x8000u));
}

/* The definition, one element at a time: c += a[p] b[p] over the pairs (p even, p + 1), the
 * odd element first, each step one rounding (fmaf; the product of two bf16 is exact). */
static void model(int64_t M, int64_t N, int64_t K, const float *A, const float *B, float *C,
                  bool accumulate)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float c = accumulate ? C[i * N + j] : 0.0f;
            for (int64_t p = 0; p < K; p += 2) {
                if (p + 1 < K)
                    c = fmaf(bf16_ftz(A[i * K + p + 1]), bf16_ftz(B[(p + 1) * N + j]), c);
                c = fmaf(bf16_ftz(A[i * K + p]), bf16_ftz(B[p * N + j]), c);
            }
            C[i * N + j] = c;
        }
}

typedef struct {
    ls_isa isa;
    bool dot;
    const char *name;
} variant;

static void run(const variant *v, int64_t M, int64_t N, int64_t K, const float *A, const float *B,
                float *C, bool accumulate)
{
    uint32_t *aw = malloc((size_t)(M * ((K + 1) / 2) + 1) * sizeof *aw);
    uint32_t *bw = malloc((size_t)(((K + 1) / 2) * N + 1) * sizeof *bw);
    if (!aw || !bw) abort();
    LS_ISA_PICK(v->isa, ls_bf16_products)(v->dot, M, N, K, A, B, C, accumulate, aw, bw);
    free(aw);
    free(bw);
}

/* Random shapes with every kind of tail: each variant equals the model bit for bit, and the
 * model is within the error bound of the float64 product of the unrounded operands. */
static void shapes(const variant *vs, int nv)
{
    static const int64_t Ms[] = {1, 3, 8, 13, 64};
    static const int64_t Ns[] = {1, 7, 16, 33, 128};
    static const int64_t Ks[] = {1, 2, 5, 32, 127, 128};
    tu_rng rng = {7};
    double worst_ratio = 0.0;
    for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
            for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
                const int64_t M = Ms[mi], N = Ns[ni], K = Ks[ki];
                float *A = tu_alloc((size_t)(M * K)), *B = tu_alloc((size_t)(K * N));
                float *C0 = tu_alloc((size_t)(M * N)), *want = tu_alloc((size_t)(M * N));
                float *got = tu_alloc((size_t)(M * N));
                tu_fill_normal(&rng, A, (size_t)(M * K), 1.0);
                tu_fill_normal(&rng, B, (size_t)(K * N), 0.3);
                tu_fill_normal(&rng, C0, (size_t)(M * N), 2.0);
                for (int acc = 0; acc < 2; acc++) {
                    memcpy(want, C0, (size_t)(M * N) * sizeof *want);
                    model(M, N, K, A, B, want, acc);
                    for (int k = 0; k < nv; k++) {
                        memcpy(got, C0, (size_t)(M * N) * sizeof *got);
                        run(&vs[k], M, N, K, A, B, got, acc);
                        CHECK(tu_same_bits(got, want, (size_t)(M * N)),
                              "%s M=%lld N=%lld K=%lld accumulate=%d: not the model's bits",
                              vs[k].name, (long long)M, (long long)N, (long long)K, acc);
                    }
                    /* |c - exact| <= sum_p |a_p b_p| (2^-7 + 2^-16: two roundings to bf16,
                     * u = 2^-8) + (|c0| + sum_p |a_p b_p|) K 2^-24 (float32 sums), in
                     * float64 */
                    for (int64_t i = 0; i < M; i++)
                        for (int64_t j = 0; j < N; j++) {
                            double exact = acc ? C0[i * N + j] : 0.0, mag = 0.0;
                            for (int64_t p = 0; p < K; p++) {
                                const double t = (double)A[i * K + p] * B[p * N + j];
                                exact += t;
                                mag += fabs(t);
                            }
                            const double c0 = acc ? fabs((double)C0[i * N + j]) : 0.0;
                            const double bound =
                                mag * (0x1p-7 + 0x1p-16) + (c0 + mag) * (double)(K + 1) * 0x1p-24;
                            const double err = fabs((double)want[i * N + j] - exact);
                            if (bound > 0 && err / bound > worst_ratio) worst_ratio = err / bound;
                            CHECK(err <= bound, "M=%lld N=%lld K=%lld (%lld,%lld): error %g > %g",
                                  (long long)M, (long long)N, (long long)K, (long long)i,
                                  (long long)j, err, bound);
                        }
                }
                free(A), free(B), free(C0), free(want), free(got);
            }
    printf("  shapes: every variant the model's bits; worst error %.2f of the bound\n",
           worst_ratio);
}

/* One element of one product on variant v: c0 + a_odd b_odd + a_even b_even as it runs. */
static float one_pair(const variant *v, float c0, float a_even, float b_even, float a_odd,
                      float b_odd)
{
    float A[2] = {a_even, a_odd}, B[2] = {b_even, b_odd}, C = c0;
    run(v, 1, 1, 2, A, B, &C, true);
    return C;
}

/* The order of the two steps and the rounding of each, on every variant; the subnormal
 * operand flushed by the packing; and the instruction's subnormal results, which the widened
 * form keeps (the one place they may differ, documented in gemm_bf16.h). */
static void edges(const variant *vs, int nv)
{
    for (int k = 0; k < nv; k++) {
        const variant *v = &vs[k];
        /* odd first: (1 - 1) + 2^-30 = 2^-30; even first would give (1 + 2^-30) - 1 = 0 */
        float r = one_pair(v, 1.0f, 0x1p-30f, 1.0f, -1.0f, 1.0f);
        CHECK(r == 0x1p-30f, "%s: odd step first: %a, expected 0x1p-30", v->name, (double)r);
        /* two roundings: 1 + 2^-24 ties to 1, twice; one fused sum would give 1 + 2^-23 */
        r = one_pair(v, 1.0f, 0x1p-24f, 1.0f, 0x1p-24f, 1.0f);
        CHECK(r == 1.0f, "%s: each step rounded: %a, expected 0x1p+0", v->name, (double)r);
        /* ties to even at an odd last bit: (1 + 2^-23) + 2^-24 rounds up to 1 + 2^-22 */
        r = one_pair(v, 0x1.000002p+0f, 0x1p-24f, 1.0f, 0.0f, 0.0f);
        CHECK(r == 0x1.000004p+0f, "%s: nearest even: %a", v->name, (double)r);
        /* a subnormal operand counts as zero (packing flushes it) */
        r = one_pair(v, 0.0f, 0x1p-127f, 1.0f, 0.0f, 0.0f);
        CHECK(r == 0.0f, "%s: subnormal operand: %a, expected 0", v->name, (double)r);
        /* rounding to bf16: 1 + 2^-8 (a tie) to 1, 1 + 3 2^-9 (above it) to 1 + 2^-7 */
        r = one_pair(v, 0.0f, 0x1.01p+0f, 1.0f, 0x1.018p+0f, 1.0f);
        CHECK(r == 0x1p+0f + 0x1.02p+0f, "%s: operands rounded: %a", v->name, (double)r);
        /* a subnormal result: the instruction flushes it, FMA keeps it */
        r = one_pair(v, 0.0f, 0x1p-70f, 0x1p-70f, 0.0f, 0.0f);
        CHECK(v->dot ? r == 0.0f : r == 0x1p-140f, "%s: subnormal result %a", v->name, (double)r);
    }
    printf("  edges: order, rounding, subnormals as documented on %d variants\n", nv);
}

int main(void)
{
    variant vs[LS_ISA_COUNT + 1];
    int nv = 0;
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) {
            printf("  %s: not available on this CPU or build\n", ls_isa_name((ls_isa)isa));
            continue;
        }
        vs[nv++] = (variant){(ls_isa)isa, false, ls_isa_name((ls_isa)isa)};
    }
    if (ls_cpu_has_bf16_dot() && ls_isa_available(LS_ISA_AVX512) &&
        LS_ISA_PICK(LS_ISA_AVX512, ls_bf16_products_have_dot)())
        vs[nv++] = (variant){LS_ISA_AVX512, true, "avx512-bf16 (vdpbf16ps)"};
    else
        printf("  vdpbf16ps: not on this CPU or build; the widened forms only\n");
    for (int k = 0; k < nv; k++) printf("  variant: %s\n", vs[k].name);
    shapes(vs, nv);
    edges(vs, nv);
    return tu_finish("test_bf16_products");
}
