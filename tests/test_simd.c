/* The SIMD layer: each ISA's vector math against double precision (max error in ulp, the
 * bounds vec.h documents), special values, and tails of every length. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "simd/isa.h"
#include "simd/vmath.h"
#include "testutil.h"

/* Distance from f to the exact value d in units of the float spacing at d. */
static double ulp_err(float f, double d)
{
    if (isnan(d)) return isnan(f) ? 0.0 : INFINITY;
    if (isinf(d) || fabs(d) > FLT_MAX) return (isinf(f) && (f > 0) == (d > 0)) ? 0.0 : INFINITY;
    const float df = (float)d;
    double spacing = fabs((double)nextafterf(fabsf(df), INFINITY) - fabs((double)df));
    if (spacing == 0.0 || spacing < ldexp(1.0, -149)) spacing = ldexp(1.0, -149);
    return fabs((double)f - d) / spacing;
}

static double ref_exp(double x) { return exp(x); }
static double ref_sigmoid(double x)
{
    return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}
static double ref_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }
static double ref_silu(double x) { return x * ref_sigmoid(x); }
static double ref_log1p(double x) { return log1p(x); }
static double ref_rsqrt(double x) { return 1.0 / sqrt(x); }

typedef struct {
    const char *name;
    ls_vmath_fn fn[LS_ISA_COUNT];
    double (*ref)(double);
    double lo, hi;  /* sweep range */
    double max_ulp; /* the bound vec.h documents */
} vmath_case;

static void sweep(const vmath_case *c, ls_isa isa)
{
    enum { N = 1 << 20 };
    float *x = tu_alloc(N), *y = tu_alloc(N);
    double worst = 0.0;
    float worst_x = 0.0f;
    for (int pass = 0; pass < 4; pass++) {
        for (int i = 0; i < N; i++)
            x[i] = (float)(c->lo + (c->hi - c->lo) * ((double)i + 0.37 * pass) / N);
        c->fn[isa](N, x, y);
        for (int i = 0; i < N; i++) {
            const double e = ulp_err(y[i], c->ref((double)x[i]));
            if (e > worst) worst = e, worst_x = x[i];
        }
    }
    printf("  %-8s %-9s max %.2f ulp on [%g, %g] (at %g)\n", ls_isa_name(isa), c->name, worst,
           c->lo, c->hi, (double)worst_x);
    CHECK(worst <= c->max_ulp, "%s %s: %.2f ulp > %.1f at x = %.9g", ls_isa_name(isa), c->name,
          worst, c->max_ulp, (double)worst_x);
    free(x);
    free(y);
}

/* Special values, and every tail length giving the same values as full vectors. */
static void specials_and_tails(const vmath_case *c, ls_isa isa)
{
    const float sp[] = {0.0f,    -0.0f,   INFINITY, -INFINITY, NAN,     1e-30f,
                        -1e-30f, 100.0f,  -100.0f,  88.7f,     88.8f,   -87.5f,
                        -103.9f, -150.0f, 20.0f,    20.0001f,  FLT_MAX, -FLT_MAX};
    const int n = (int)(sizeof sp / sizeof sp[0]);
    float y[32];
    c->fn[isa](n, sp, y);
    for (int i = 0; i < n; i++) {
        if (c->ref == ref_log1p && (sp[i] < 0 || sp[i] > 1)) continue; /* outside its domain */
        if (c->ref == ref_rsqrt && !(sp[i] > 0)) continue;
        const double d = c->ref((double)sp[i]);
        const double e =
            fabs(d) < FLT_MIN && fabs((double)y[i] - d) <= 1e-40 ? 0.0 : ulp_err(y[i], d);
        CHECK(e <= c->max_ulp, "%s %s(%g) = %g, expected %g", ls_isa_name(isa), c->name,
              (double)sp[i], (double)y[i], d);
    }
    tu_rng r = {7};
    float x[40], full[40], part[40];
    for (int i = 0; i < 40; i++) x[i] = (float)tu_uniform(&r, c->lo, c->hi);
    c->fn[isa](40, x, full);
    for (int len = 1; len <= 40; len++) {
        memset(part, 0x7f, sizeof part);
        c->fn[isa](len, x, part);
        bool same = memcmp(part, full, (size_t)len * sizeof(float)) == 0;
        for (int i = len; i < 40; i++)
            same &= part[i] != part[i] || part[i] > 1e37f; /* untouched */
        CHECK(same, "%s %s: length %d differs from the full vector or writes past n",
              ls_isa_name(isa), c->name, len);
    }
}

/* vf_hsum_lanes: lane i is the sum of vector i, exactly as a fixed-order float sum allows. */
static void hsum_lanes(ls_isa isa)
{
    int (*fn[])(const float *, float *) = {ls_vhsum_lanes_n_scalar, ls_vhsum_lanes_n_avx2,
                                           ls_vhsum_lanes_n_avx512};
    float in[256], out[16];
    for (int i = 0; i < 256; i++) in[i] = (float)((i * 37) % 101) - 50.0f + 0.25f * (float)(i % 5);
    const int w = fn[isa](in, out);
    bool ok = true;
    for (int i = 0; i < w; i++) {
        double s = 0.0;
        for (int j = 0; j < w; j++) s += in[i * w + j];
        ok &= fabs((double)out[i] - s) <= 1e-4; /* small integers and quarters: exact */
    }
    CHECK(ok, "%s: vf_hsum_lanes gives wrong lane sums", ls_isa_name(isa));
}

/* ls_transpose on every block shape: full register blocks, edges, both at once. */
static void transpose_shapes(ls_isa isa)
{
    void (*fn[])(int64_t, int64_t, const float *, int64_t, float *,
                 int64_t) = {ls_transpose_n_scalar, ls_transpose_n_avx2, ls_transpose_n_avx512};
    static const int64_t shapes[][2] = {{16, 16},  {32, 48}, {17, 5}, {5, 33},
                                        {64, 128}, {1, 1},   {40, 24}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t R = shapes[s][0], Cc = shapes[s][1], lds = Cc + 3, ldd = R + 5;
        float *src = tu_alloc((size_t)(R * lds)), *dst = tu_alloc_poisoned((size_t)(Cc * ldd));
        for (int64_t i = 0; i < R * lds; i++) src[i] = (float)i;
        fn[isa](R, Cc, src, lds, dst, ldd);
        bool ok = true;
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < Cc; j++) ok &= dst[j * ldd + i] == src[i * lds + j];
        for (int64_t j = 0; j < Cc; j++) /* the padding of each destination row is untouched */
            ok &= tu_is_poisoned(dst + j * ldd + R, (size_t)(ldd - R) * sizeof(float));
        CHECK(ok, "%s: transpose of %lld x %lld", ls_isa_name(isa), (long long)R, (long long)Cc);
        free(src);
        free(dst);
    }
}

int main(void)
{
#define FNS(base)                                                                                  \
    {                                                                                              \
        base##_scalar, base##_avx2, base##_avx512                                                  \
    }
    const vmath_case cases[] = {
        {"exp", FNS(ls_vexp_n), ref_exp, -87.0, 88.7, 1.5},
        {"exp", FNS(ls_vexp_n), ref_exp, -104.0, -87.0, 1.5}, /* subnormal results */
        {"exp", FNS(ls_vexp_n), ref_exp, -0.5, 0.5, 1.5},
        {"sigmoid", FNS(ls_vsigmoid_n), ref_sigmoid, -30.0, 30.0, 3.0},
        {"sigmoid", FNS(ls_vsigmoid_n), ref_sigmoid, -87.0, -30.0, 3.0},
        {"softplus", FNS(ls_vsoftplus_n), ref_softplus, -30.0, 30.0, 4.0},
        {"softplus", FNS(ls_vsoftplus_n), ref_softplus, -87.0, -30.0, 4.0},
        {"silu", FNS(ls_vsilu_n), ref_silu, -30.0, 30.0, 4.0},
        {"silu", FNS(ls_vsilu_n), ref_silu, -88.0, -30.0, 4.0}, /* |x| <= 80 and beyond */
        {"silu", FNS(ls_vsilu_n), ref_silu, 30.0, 120.0, 4.0},
        {"log1p", FNS(ls_vlog1p01_n), ref_log1p, 0.0, 1.0, 3.0},
        {"rsqrt", FNS(ls_vrsqrt_n), ref_rsqrt, 1e-6, 1e6, 1.5},
    };
#undef FNS
    printf("active ISA: %s\n", ls_isa_name(ls_isa_active()));
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) {
            printf("  %s: not available on this CPU or build\n", ls_isa_name((ls_isa)isa));
            continue;
        }
        hsum_lanes((ls_isa)isa);
        transpose_shapes((ls_isa)isa);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            sweep(&cases[i], (ls_isa)isa);
            specials_and_tails(&cases[i], (ls_isa)isa);
        }
    }
    return tu_finish("test_simd");
}
