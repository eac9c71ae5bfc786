/* Realistic values for a tensor of the op table (ls_op_fill): the distributions of
 * ls_dist, drawn from a counter-based generator so that the values depend on the seed and
 * the position only, never on how threads share the blocks. */
#include <math.h>

#include "core/parallel.h"
#include "optable/optable.h"

#define FILL_BLOCK 4096

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s)
{
    return ((double)(splitmix(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* One value of d from the normal z (and more uniforms from s where d needs them). */
static double draw(uint64_t *s, ls_dist d, double a, double b, double z)
{
    switch (d) {
    case LS_DIST_NORMAL: return a * z;
    case LS_DIST_UNIFORM: return a + (b - a) * uniform01(s);
    case LS_DIST_LOG_UNIFORM: return exp(log(a) + (log(b) - log(a)) * uniform01(s));
    case LS_DIST_LOGSIGMOID: return fmin(z, 0.0) - log1p(exp(-fabs(z)));
    case LS_DIST_SIGMOID: return 1.0 / (1.0 + exp(-z));
    case LS_DIST_LOG_OF_UNIFORM: return log(a + (b - a) * uniform01(s));
    case LS_DIST_INV_SOFTPLUS_DT: {
        double dt = exp(log(a) + (log(b) - log(a)) * uniform01(s));
        return dt + log(-expm1(-dt));
    }
    default: return 0.0;
    }
}

typedef struct {
    const ls_tensor_desc *t;
    float *x;
    int64_t n;
    uint64_t seed;
} fill_job;

/* Block blk of FILL_BLOCK values, from its own generator. */
static void fill_block(void *ctx, int64_t blk, int thread)
{
    (void)thread;
    const fill_job *j = ctx;
    const ls_tensor_desc *t = j->t;
    float *x = j->x;
    uint64_t s = j->seed ^ (uint64_t)blk * 0xD1B54A32D192ED03ull;
    const int64_t lo = blk * FILL_BLOCK, hi = lo + FILL_BLOCK < j->n ? lo + FILL_BLOCK : j->n;
    for (int64_t i = lo; i < hi; i += 2) {
        if (t->dist == LS_DIST_ZERO) {
            x[i] = 0.0f;
            if (i + 1 < hi) x[i + 1] = 0.0f;
            continue;
        }
        /* Box-Muller: one pair of normals per two values. */
        const double r = sqrt(-2.0 * log(uniform01(&s))), a = 6.283185307179586 * uniform01(&s);
        x[i] = (float)draw(&s, t->dist, t->a, t->b, r * cos(a));
        if (i + 1 < hi) x[i + 1] = (float)draw(&s, t->dist, t->a, t->b, r * sin(a));
    }
}

void ls_op_fill(const ls_tensor_desc *t, float *x, int64_t n, const int64_t *dims, int ndim,
                uint64_t seed)
{
    if (t->dist == LS_DIST_S4D_REAL) { /* A[d,n] = -exp(log(n+1)), Mamba's S4D-real init */
        const int64_t last = ndim > 0 && dims[ndim - 1] > 0 ? dims[ndim - 1] : 1;
        for (int64_t i = 0; i < n; i++) x[i] = -expf(logf((float)(i % last + 1)));
        return;
    }
    /* the library's own threads (core/parallel.h); one block runs on the caller alone */
    fill_job j = {t, x, n, seed};
    const int64_t n_blocks = (n + FILL_BLOCK - 1) / FILL_BLOCK;
    ls_parallel_for(n_blocks, linseq_get_num_threads(), fill_block, &j);
}
