/* `linseq demo`: the first thing a newcomer runs. Through the public API only, a KDA layer
 * and a Mamba-130m-sized block run a 2048-token prefill and 32 decode steps at realistic
 * sizes and initialisations; each phase is timed, and each result is checked against a
 * second way of computing the same numbers (the other KDA algorithm, or one call over all
 * tokens), so the demo also shows that prefill, decode and the two modes agree. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "linseq.h"

#define PREFILL 2048
#define DECODE 32
#define TOTAL (PREFILL + DECODE)
#define MAX_REL 1e-4

/* ---------------------------------------------------------------------------------- */
/* Plumbing: RNG, allocations, clock, errors                                          */
/* ---------------------------------------------------------------------------------- */

/* splitmix64: a fixed seed gives the same inputs on every machine. */
typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_uniform(rng *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0));
}

static double rng_normal(rng *r)
{
    double u1 = rng_uniform(r, 1e-300, 1.0), u2 = rng_uniform(r, 0.0, 1.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void fill_normal(rng *r, float *x, size_t n, double sd)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(sd * rng_normal(r));
}

/* The inverse of softplus, so that softplus(dt_bias) = dt: how fla and mamba initialise
 * dt_bias, from dt drawn log-uniformly in [1e-3, 1e-1]. */
static float dt_bias_init(rng *r)
{
    double dt = exp(rng_uniform(r, log(1e-3), log(1e-1)));
    return (float)(dt + log(-expm1(-dt)));
}

/* Every buffer of one section, freed together. */
typedef struct pool {
    void *p[32];
    int n;
} pool;

static float *pool_alloc(pool *pl, size_t n)
{
    if (pl->n == (int)(sizeof pl->p / sizeof pl->p[0])) return NULL;
    float *x = calloc(n, sizeof(float));
    if (x) pl->p[pl->n++] = x;
    return x;
}

static void pool_free(pool *pl)
{
    for (int i = 0; i < pl->n; i++) free(pl->p[i]);
    pl->n = 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool lib_ok(linseq_status st, const char *what)
{
    if (st == LINSEQ_OK) return true;
    fprintf(stderr, "linseq demo: %s failed: %s (%s)\n", what, linseq_last_error(),
            linseq_status_string(st));
    return false;
}

/* max|a - ref| / max|ref|; +inf when a holds a non-finite value. */
static double rel_err(const float *a, const float *ref, size_t n)
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

static void print_phase(const char *what, double seconds, double tokens)
{
    printf("  %-44s %8.3f s %10.0f tokens/s\n", what, seconds, tokens / seconds);
}

/* Prints one check line; false when any error exceeds MAX_REL. */
static bool print_check(const char *what, int n, const char *const *names, const double *errs)
{
    bool ok = true;
    printf("  check: %s\n         ", what);
    for (int i = 0; i < n; i++) {
        printf("%s%s %.2e", i ? ", " : "", names[i], errs[i]);
        ok &= errs[i] <= MAX_REL;
    }
    printf("   %s\n", ok ? "ok" : "EXCEEDS 1e-4");
    return ok;
}

/* ---------------------------------------------------------------------------------- */
/* KDA layer                                                                          */
/* ---------------------------------------------------------------------------------- */

enum { KDA_H = 16, KDA_K = 128, KDA_V = 128 };

static int demo_kda(const linseq_exec *base, rng *r)
{
    const size_t tok_qk = KDA_H * KDA_K, tok_v = KDA_H * KDA_V;
    const size_t state_n = (size_t)KDA_H * KDA_K * KDA_V;
    pool pl = {.n = 0};
    float *q = pool_alloc(&pl, TOTAL * tok_qk), *k = pool_alloc(&pl, TOTAL * tok_qk);
    float *v = pool_alloc(&pl, TOTAL * tok_v), *beta = pool_alloc(&pl, TOTAL * KDA_H);
    float *g = pool_alloc(&pl, TOTAL * tok_qk), *A_log = pool_alloc(&pl, KDA_H);
    float *dt_bias = pool_alloc(&pl, tok_qk);
    float *o_chunk = pool_alloc(&pl, PREFILL * tok_v), *o_rec = pool_alloc(&pl, PREFILL * tok_v);
    float *o_full = pool_alloc(&pl, TOTAL * tok_v), *o_dec = pool_alloc(&pl, DECODE * tok_v);
    float *h_chunk = pool_alloc(&pl, state_n), *h_rec = pool_alloc(&pl, state_n);
    float *h_full = pool_alloc(&pl, state_n), *state = pool_alloc(&pl, state_n);
    if (!state) {
        fprintf(stderr, "linseq demo: out of memory\n");
        pool_free(&pl);
        return LS_EXIT_ERROR;
    }
    fill_normal(r, q, TOTAL * tok_qk, 1.0);
    fill_normal(r, k, TOTAL * tok_qk, 1.0);
    fill_normal(r, v, TOTAL * tok_v, 1.0);
    fill_normal(r, beta, TOTAL * KDA_H, 1.0);
    fill_normal(r, g, TOTAL * tok_qk, 1.0);
    for (int h = 0; h < KDA_H; h++) A_log[h] = (float)log(rng_uniform(r, 1.0, 16.0));
    for (size_t i = 0; i < tok_qk; i++) dt_bias[i] = dt_bias_init(r);

    /* The options of a KDA layer in a model: the gate and beta's sigmoid run in the kernel. */
    linseq_kda_problem p = {.B = 1,
                            .T = PREFILL,
                            .H = KDA_H,
                            .K = KDA_K,
                            .V = KDA_V,
                            .q = q,
                            .k = k,
                            .v = v,
                            .beta = beta,
                            .g = g,
                            .decay = LINSEQ_DECAY_PER_CHANNEL,
                            .qk_l2norm = true,
                            .beta_is_logit = true,
                            .gate_in_kernel = true,
                            .A_log = A_log,
                            .dt_bias = dt_bias};
    linseq_exec chunked = *base, recurrent = *base;
    chunked.mode = LINSEQ_MODE_CHUNKED;
    chunked.chunk_size = 64;
    recurrent.mode = LINSEQ_MODE_RECURRENT;

    printf("KDA layer: B=1 H=%d K=%d V=%d, per-channel decay with the gate in the kernel\n"
           "  (A_log ~ log U(1,16) per head, dt_bias = softplus^-1(dt ~ logU(1e-3,1e-1)),\n"
           "  gate input ~ N(0,1)), beta from logits, q/k l2norm in the kernel, scale K^-0.5\n",
           KDA_H, KDA_K, KDA_V);
    int rc = LS_EXIT_ERROR;
    double t0 = now_s();
    if (!lib_ok(linseq_kda_forward(&p, &chunked, o_chunk, h_chunk), "chunked prefill")) goto out;
    double t1 = now_s();
    if (!lib_ok(linseq_kda_forward(&p, &recurrent, o_rec, h_rec), "recurrent prefill")) goto out;
    double t2 = now_s();

    /* Decode continues from the chunked prefill's state, one token per call, in place. */
    memcpy(state, h_chunk, state_n * sizeof(float));
    for (int s = 0; s < DECODE; s++) {
        size_t t = PREFILL + (size_t)s;
        linseq_kda_problem step = p;
        step.T = 1;
        step.q = q + t * tok_qk;
        step.k = k + t * tok_qk;
        step.v = v + t * tok_v;
        step.beta = beta + t * KDA_H;
        step.g = g + t * tok_qk;
        if (!lib_ok(linseq_kda_decode(&step, base, state, 1, NULL, o_dec + (size_t)s * tok_v),
                    "decode step"))
            goto out;
    }
    double t3 = now_s();
    p.T = TOTAL;
    if (!lib_ok(linseq_kda_forward(&p, &chunked, o_full, h_full), "full-sequence call")) goto out;
    double t4 = now_s();

    print_phase("prefill T=2048, chunked (chunk 64)", t1 - t0, PREFILL);
    print_phase("prefill T=2048, recurrent", t2 - t1, PREFILL);
    print_phase("decode 32 steps (linseq_kda_decode)", t3 - t2, DECODE);
    print_phase("one chunked call over all 2080 tokens", t4 - t3, TOTAL);
    const char *names[] = {"o", "state"};
    double e1[2] = {rel_err(o_chunk, o_rec, PREFILL * tok_v), rel_err(h_chunk, h_rec, state_n)};
    double e2[2] = {rel_err(o_dec, o_full + PREFILL * tok_v, DECODE * tok_v),
                    rel_err(state, h_full, state_n)};
    bool ok = print_check("chunked vs recurrent prefill (max rel err)", 2, names, e1);
    ok &= print_check("prefill + 32 decode steps vs one call over 2080 tokens", 2, names, e2);
    rc = ok ? LS_EXIT_OK : LS_EXIT_FAIL;
out:
    pool_free(&pl);
    return rc;
}

/* ---------------------------------------------------------------------------------- */
/* Mamba block: causal conv1d then the selective scan                                 */
/* ---------------------------------------------------------------------------------- */

enum { MB_D = 1536, MB_N = 16, MB_W = 4 };

typedef struct mamba_in {
    const float *x, *weight, *bias, *dt, *dt_bias, *A, *Bp, *Cp, *D_skip, *z;
} mamba_in;

/* Tokens t0 .. t0+T-1 through conv and SSM1, from (and back into) the given states. With
 * in_place the states are read and updated in the same buffers, as a decode loop does. */
static bool mamba_run(const mamba_in *in, const linseq_exec *ex, size_t t0, int64_t T,
                      float *conv_out, float *conv_state, float *ssm_state, bool from_state,
                      float *y)
{
    linseq_conv1d_problem cp = {.B = 1,
                                .T = T,
                                .D = MB_D,
                                .W = MB_W,
                                .x = in->x + t0 * MB_D,
                                .weight = in->weight,
                                .bias = in->bias,
                                .conv_state = from_state ? conv_state : NULL,
                                .activation = LINSEQ_ACT_SILU};
    linseq_ssm1_problem sp = {.B = 1,
                              .T = T,
                              .D = MB_D,
                              .N = MB_N,
                              .G = 1,
                              .x = conv_out,
                              .dt = in->dt + t0 * MB_D,
                              .A = in->A,
                              .B_proj = in->Bp + t0 * MB_N,
                              .C_proj = in->Cp + t0 * MB_N,
                              .D_skip = in->D_skip,
                              .gate = in->z + t0 * MB_D,
                              .h0 = from_state ? ssm_state : NULL,
                              .dt_softplus = true,
                              .dt_bias = in->dt_bias,
                              .gate_activation = LINSEQ_ACT_SILU};
    return lib_ok(linseq_conv1d_forward(&cp, ex, conv_out, conv_state), "causal conv1d") &&
           lib_ok(linseq_ssm1_forward(&sp, ex, y, ssm_state), "ssm1");
}

static int demo_mamba(const linseq_exec *ex, rng *r)
{
    const size_t cs_n = MB_D * (MB_W - 1), ss_n = MB_D * MB_N;
    pool pl = {.n = 0};
    float *x = pool_alloc(&pl, TOTAL * MB_D), *weight = pool_alloc(&pl, MB_D * MB_W);
    float *bias = pool_alloc(&pl, MB_D), *dt = pool_alloc(&pl, TOTAL * MB_D);
    float *dt_bias = pool_alloc(&pl, MB_D), *A = pool_alloc(&pl, MB_D * MB_N);
    float *Bp = pool_alloc(&pl, TOTAL * MB_N), *Cp = pool_alloc(&pl, TOTAL * MB_N);
    float *D_skip = pool_alloc(&pl, MB_D), *z = pool_alloc(&pl, TOTAL * MB_D);
    float *xc = pool_alloc(&pl, TOTAL * MB_D), *y = pool_alloc(&pl, TOTAL * MB_D);
    float *xc_full = pool_alloc(&pl, TOTAL * MB_D), *y_full = pool_alloc(&pl, TOTAL * MB_D);
    float *cs = pool_alloc(&pl, cs_n), *ss = pool_alloc(&pl, ss_n);
    float *cs_full = pool_alloc(&pl, cs_n), *ss_full = pool_alloc(&pl, ss_n);
    if (!ss_full) {
        fprintf(stderr, "linseq demo: out of memory\n");
        pool_free(&pl);
        return LS_EXIT_ERROR;
    }
    /* torch's default conv init (U(+-1/sqrt(W))) and mamba's S4D-real A. */
    fill_normal(r, x, TOTAL * MB_D, 1.0);
    for (size_t i = 0; i < MB_D * MB_W; i++) weight[i] = (float)rng_uniform(r, -0.5, 0.5);
    for (size_t i = 0; i < MB_D; i++) bias[i] = (float)rng_uniform(r, -0.5, 0.5);
    fill_normal(r, dt, TOTAL * MB_D, 0.5);
    for (size_t i = 0; i < MB_D; i++) dt_bias[i] = dt_bias_init(r);
    for (size_t d = 0; d < MB_D; d++)
        for (size_t n = 0; n < MB_N; n++) A[d * MB_N + n] = -expf(logf((float)(n + 1)));
    fill_normal(r, Bp, TOTAL * MB_N, 1.0);
    fill_normal(r, Cp, TOTAL * MB_N, 1.0);
    for (size_t i = 0; i < MB_D; i++) D_skip[i] = 1.0f;
    fill_normal(r, z, TOTAL * MB_D, 1.0);
    const mamba_in in = {x, weight, bias, dt, dt_bias, A, Bp, Cp, D_skip, z};

    printf("Mamba block (130m-sized): D=%d N=%d W=%d; causal conv1d (silu, bias) -> SSM1\n"
           "  (dt = softplus(dt + dt_bias), A = -exp(A_log) with A_log[d,n] = log(n+1),\n"
           "  D skip = 1, silu gate)\n",
           MB_D, MB_N, MB_W);
    int rc = LS_EXIT_ERROR;
    double t0 = now_s();
    if (!mamba_run(&in, ex, 0, PREFILL, xc, cs, ss, false, y)) goto out;
    double t1 = now_s();
    for (size_t s = 0; s < DECODE; s++) {
        size_t t = PREFILL + s;
        if (!mamba_run(&in, ex, t, 1, xc + t * MB_D, cs, ss, true, y + t * MB_D)) goto out;
    }
    double t2 = now_s();
    if (!mamba_run(&in, ex, 0, TOTAL, xc_full, cs_full, ss_full, false, y_full)) goto out;
    double t3 = now_s();

    print_phase("prefill T=2048 (conv1d + ssm1, states out)", t1 - t0, PREFILL);
    print_phase("decode 32 steps (T=1, states in place)", t2 - t1, DECODE);
    print_phase("one call over all 2080 tokens", t3 - t2, TOTAL);
    const char *names[] = {"y", "ssm state", "conv state"};
    double e[3] = {rel_err(y + PREFILL * MB_D, y_full + PREFILL * MB_D, DECODE * MB_D),
                   rel_err(ss, ss_full, ss_n), rel_err(cs, cs_full, cs_n)};
    rc = print_check("prefill + 32 decode steps vs one call over 2080 tokens", 3, names, e)
             ? LS_EXIT_OK
             : LS_EXIT_FAIL;
out:
    pool_free(&pl);
    return rc;
}

int cmd_demo(const linseq_exec *exec)
{
    linseq_exec base = *exec;
    base.mode = LINSEQ_MODE_DEFAULT;
    base.chunk_size = 0;
    int threads = base.threads > 0 ? base.threads : linseq_get_num_threads();
    printf("linseq %s demo: public API only, %d thread%s per call\n\n", linseq_version(), threads,
           threads == 1 ? "" : "s");
    rng r = {.s = 20240531};
    int rc_kda = demo_kda(&base, &r);
    if (rc_kda == LS_EXIT_ERROR) return rc_kda;
    printf("\n");
    int rc_mamba = demo_mamba(&base, &r);
    if (rc_mamba == LS_EXIT_ERROR) return rc_mamba;
    bool ok = rc_kda == LS_EXIT_OK && rc_mamba == LS_EXIT_OK;
    printf("\n%s\n", ok ? "all consistency checks within 1e-4 relative"
                        : "a consistency check exceeded 1e-4 relative");
    return ok ? LS_EXIT_OK : LS_EXIT_FAIL;
}
