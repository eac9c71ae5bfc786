/* Test harness implementation: counters, RNG, error metrics, poison buffers. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int tu_failures;
int tu_checks;

int tu_finish(const char *suite)
{
    printf("%s: %d checks, %d failed\n", suite, tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}

tu_mark tu_mark_now(void) { return (tu_mark){tu_checks, tu_failures}; }

void tu_tally_add(tu_mark *tally, tu_mark since)
{
    tally->checks += tu_checks - since.checks;
    tally->failures += tu_failures - since.failures;
}

void tu_report(const char *label, tu_mark tally, const char *detail)
{
    if (tally.failures)
        printf("%s: %d of %d checks FAILED", label, tally.failures, tally.checks);
    else
        printf("%s: %d checks ok", label, tally.checks);
    printf("%s%s\n", detail ? ", " : "", detail ? detail : "");
}

uint64_t tu_next(tu_rng *r)
{
    /* splitmix64: tiny, good enough for test data, identical on every platform */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double tu_uniform(tu_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0));
}

double tu_normal(tu_rng *r)
{
    double u1 = tu_uniform(r, 1e-300, 1.0), u2 = tu_uniform(r, 0.0, 1.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void tu_fill_normal(tu_rng *r, float *x, size_t n, double sd)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(sd * tu_normal(r));
}

void tu_fill_uniform(tu_rng *r, float *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)tu_uniform(r, lo, hi);
}

float *tu_alloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) {
        fprintf(stderr, "test allocation of %zu floats failed\n", n);
        exit(2);
    }
    return p;
}

double tu_rel_err(const float *a, const float *ref, size_t n)
{
    double err = 0.0, mx = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double e = fabs((double)a[i] - (double)ref[i]);
        if (e > err) err = e;
        if (fabs((double)ref[i]) > mx) mx = fabs((double)ref[i]);
    }
    return mx > 0.0 ? err / mx : err;
}

double tu_rel_err_d(const float *a, const double *ref, size_t n)
{
    double err = 0.0, mx = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double e = fabs((double)a[i] - ref[i]);
        if (e > err) err = e;
        if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
    }
    return mx > 0.0 ? err / mx : err;
}

void tu_poison(void *p, size_t bytes) { memset(p, 0xA5, bytes); }

bool tu_is_poisoned(const void *p, size_t bytes)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < bytes; i++)
        if (c[i] != 0xA5) return false;
    return true;
}

bool tu_same_bits(const float *a, const float *b, size_t n)
{
    return n == 0 || memcmp(a, b, n * sizeof(float)) == 0;
}

float *tu_alloc_poisoned(size_t n)
{
    float *p = tu_alloc(n);
    tu_poison(p, n * sizeof(float));
    return p;
}

void tu_slice_tokens(const float *src, int64_t B, int64_t T, int64_t width, int64_t t0, int64_t len,
                     float *out)
{
    for (int64_t b = 0; b < B; b++)
        memcpy(out + b * len * width, src + (b * T + t0) * width,
               (size_t)(len * width) * sizeof(float));
}

void tu_place_tokens(const float *src, int64_t B, int64_t T, int64_t width, int64_t t0, int64_t len,
                     float *dst)
{
    for (int64_t b = 0; b < B; b++)
        memcpy(dst + (b * T + t0) * width, src + b * len * width,
               (size_t)(len * width) * sizeof(float));
}

void tu_tap_layout(float *dst, const float *src, int64_t n, int64_t D, int64_t L, bool tap_major,
                   bool back)
{
    if (!tap_major) {
        memcpy(dst, src, (size_t)(n * D * L) * sizeof(float));
        return;
    }
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < D; d++)
            for (int64_t i = 0; i < L; i++) {
                const int64_t dl = (r * D + d) * L + i, ld = (r * L + i) * D + d;
                if (back)
                    dst[dl] = src[ld];
                else
                    dst[ld] = src[dl];
            }
}
