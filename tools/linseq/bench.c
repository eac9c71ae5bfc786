/* `linseq bench`: times one op at one shape, measures the machine's peak, or runs the
 * standard suite. Inputs are realistic random data from a fixed seed; allocation and input
 * generation stay outside the timed region, and every timed call's status is checked. The
 * FLOP and byte counts are the formulas of README "Benchmarks": fixed functions of the shape,
 * never of the implementation, so numbers stay comparable as the kernels change. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "commands.h"
#include "linseq.h"
#include "simd/isa.h"
#include "simd/peak.h"

const char ls_bench_usage[] =
    "bench:\n"
    "  linseq bench OP [shape] [--threads N] [--repeats N] [--warmup N] [--json]\n"
    "               [--no-peak] [--mib N]\n"
    "      time one op at one shape; OP is one of\n"
    "        kda          KDA forward (o and the final state)  --B --T --H --K --V --mode\n"
    "                                                          --chunk-size --decay\n"
    "        kda-fwdbwd   KDA forward then backward            same options as kda\n"
    "        kda-decode   linseq_kda_decode, 1 token for B requests  --B --H --K --V --decay\n"
    "        gate         KDA gate forward                     --B --T --H --K --decay\n"
    "        ssm1         Mamba1 scan forward (y, final state) --B --T --D --N\n"
    "        ssm1-fwdbwd  SSM1 forward then backward           --B --T --D --N\n"
    "        ssm1-decode  SSM1 T=1 forward, state in place     --B --D --N\n"
    "        conv         causal conv1d forward, bias + silu   --B --T --D --W\n"
    "      defaults: B=1 T=2048; H=16 K=V=128, chunked, chunk 64, per-channel decay (KDA);\n"
    "      D=1536 N=16 (ssm1); D=4096 W=4 (conv)\n"
    "  linseq bench peak [--threads N] [--repeats N] [--mib N] [--json]\n"
    "      fp32 FMA GFLOP/s on 1 thread and on N (default all processors), and the triad\n"
    "      bandwidth (a = b + s c over 3 arrays of --mib MiB) on both\n"
    "  linseq bench suite [--threads N] [--repeats N] [--warmup N] [--json] [--no-peak]\n"
    "      the standard shapes (docs/performance.md) in one table\n"
    "\n"
    "bench options:\n"
    "  --B --T --H --K --V --D --N --W  sizes (>= 1; kda-decode and ssm1-decode run T=1)\n"
    "  --mode recurrent|chunked, --chunk-size 16|32|64|128, --decay channel|head\n"
    "  --threads N    threads per call (default: all processors)\n"
    "  --repeats N    timed calls (default: enough for about 1 s, at least 10);\n"
    "                 for peak: trials per figure, the best kept (default 5)\n"
    "  --warmup N     untimed calls first (default: at least 2 and 0.1 s)\n"
    "  --json         one JSON object per result on stdout instead of the text\n"
    "  --no-peak      do not measure the peak, so no fractions of it are reported\n"
    "  --mib N        MiB in each array of the bandwidth measurement (default 256)\n"
    "  --cold         decode: cycle through copies of the state filling --mib MiB, so that\n"
    "                 each call reads its state from memory; by default one state is reused\n"
    "                 (cache-warm, as llama.cpp's test-backend-ops times its ops)\n"
    "  Each result: median, min and max seconds per call, tokens/s, GFLOP/s and GB/s by the\n"
    "  formulas of README \"Benchmarks\", and the fractions of the FMA peak and the triad\n"
    "  bandwidth measured in the same process at the same thread count.\n"
    "  OMP_WAIT_POLICY: between calls OpenMP's threads must spin, or every call pays for\n"
    "  waking them. libgomp reads the variable when it loads, before main(), so when it is\n"
    "  unset bench sets OMP_WAIT_POLICY=active and runs itself again (exec of\n"
    "  /proc/self/exe with the same arguments), with a note on stderr. A value already set\n"
    "  is kept.\n"
    "  exit status of bench: 0 done, 1 a library call failed, 2 bad usage or no memory\n";

/* ---------------------------------------------------------------------------------- */
/* What to run                                                                        */
/* ---------------------------------------------------------------------------------- */

typedef enum op_id {
    OP_KDA,
    OP_KDA_FWDBWD,
    OP_KDA_DECODE,
    OP_GATE,
    OP_SSM1,
    OP_SSM1_FWDBWD,
    OP_SSM1_DECODE,
    OP_CONV,
    OP_COUNT,
    CMD_PEAK = OP_COUNT,
    CMD_SUITE,
    CMD_COUNT
} op_id;

static const char *const cmd_names[CMD_COUNT] = {
    "kda", "kda-fwdbwd", "kda-decode", "gate", "ssm1", "ssm1-fwdbwd", "ssm1-decode", "conv",
    "peak", "suite"};

typedef struct spec {
    op_id op;
    int64_t B, T, H, K, V, D, N, W;
    linseq_mode mode; /* KDA forward and fwdbwd: RECURRENT or CHUNKED */
    int chunk;
    linseq_decay decay;
    int threads; /* > 0 */
} spec;

typedef struct settings {
    int threads; /* 0 = all processors */
    int repeats; /* 0 = until about 1 s */
    int warmup;  /* < 0 = at least 2 calls and 0.1 s */
    bool json, no_peak, cold;
    int mib;
} settings;

static bool is_kda(op_id op) { return op <= OP_KDA_DECODE; }
static bool is_ssm1(op_id op) { return op >= OP_SSM1 && op <= OP_SSM1_DECODE; }
static bool is_decode(op_id op) { return op == OP_KDA_DECODE || op == OP_SSM1_DECODE; }

static spec default_spec(op_id op)
{
    spec s = {.op = op, .B = 1, .T = 2048, .H = 16, .K = 128, .V = 128, .D = 1536, .N = 16,
              .W = 4, .mode = LINSEQ_MODE_CHUNKED, .chunk = 64,
              .decay = LINSEQ_DECAY_PER_CHANNEL, .threads = 1};
    if (op == OP_CONV) s.D = 4096;
    if (is_decode(op)) s.T = 1;
    return s;
}

static int all_procs(void) { return linseq_get_num_threads(); }

/* ---------------------------------------------------------------------------------- */
/* Errors and the clock                                                               */
/* ---------------------------------------------------------------------------------- */

/* One line on stderr and the usage exit code. */
__attribute__((format(printf, 1, 2))) static int usage_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("linseq bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see linseq --help)\n", stderr);
    va_end(ap);
    return LS_EXIT_ERROR;
}

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

/* ---------------------------------------------------------------------------------- */
/* Inputs: deterministic whatever the thread count                                    */
/* ---------------------------------------------------------------------------------- */

#define SEED 20240531u
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

typedef enum dist {
    DIST_ZERO,
    DIST_NORMAL,           /* a * N(0,1)                                                */
    DIST_UNIFORM,          /* U(a, b)                                                   */
    DIST_LOG_UNIFORM,      /* exp(U(log a, log b))                                      */
    DIST_LOGSIGMOID,       /* logsigmoid(N(0,1)): fla's benchmark decay, mean about -0.8 */
    DIST_SIGMOID,          /* sigmoid(N(0,1)): beta                                     */
    DIST_LOG_OF_UNIFORM,   /* log(U(a, b)): A_log                                       */
    DIST_INV_SOFTPLUS_DT   /* softplus^-1 of dt ~ logU(a, b): how dt_bias is initialised */
} dist;

static double draw(uint64_t *s, dist d, double a, double b, double z)
{
    switch (d) {
    case DIST_NORMAL: return a * z;
    case DIST_UNIFORM: return a + (b - a) * uniform01(s);
    case DIST_LOG_UNIFORM: return exp(log(a) + (log(b) - log(a)) * uniform01(s));
    case DIST_LOGSIGMOID: return fmin(z, 0.0) - log1p(exp(-fabs(z)));
    case DIST_SIGMOID: return 1.0 / (1.0 + exp(-z));
    case DIST_LOG_OF_UNIFORM: return log(a + (b - a) * uniform01(s));
    case DIST_INV_SOFTPLUS_DT: {
        double dt = exp(log(a) + (log(b) - log(a)) * uniform01(s));
        return dt + log(-expm1(-dt));
    }
    default: return 0.0;
    }
}

/* Each block of FILL_BLOCK values has its own generator, seeded by (tensor, block), so the
 * data do not depend on how the blocks are shared between threads. */
static void fill(float *x, int64_t n, uint64_t tensor, dist d, double a, double b)
{
    const int64_t n_blocks = (n + FILL_BLOCK - 1) / FILL_BLOCK;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t blk = 0; blk < n_blocks; blk++) {
        uint64_t s = SEED ^ (tensor << 40) ^ (uint64_t)blk * 0xD1B54A32D192ED03ull;
        const int64_t lo = blk * FILL_BLOCK, hi = lo + FILL_BLOCK < n ? lo + FILL_BLOCK : n;
        for (int64_t i = lo; i < hi; i += 2) {
            /* Box-Muller: one pair of normals per two values. */
            const double r = sqrt(-2.0 * log(uniform01(&s))), t = 6.283185307179586 * uniform01(&s);
            x[i] = (float)draw(&s, d, a, b, r * cos(t));
            if (i + 1 < hi) x[i + 1] = (float)draw(&s, d, a, b, r * sin(t));
        }
    }
}

/* ---------------------------------------------------------------------------------- */
/* A job: one op's problem, buffers and counts                                        */
/* ---------------------------------------------------------------------------------- */

#define MAX_BUFS 32

typedef struct job {
    spec s;
    linseq_exec ex;
    bool dry;     /* only add up the sizes */
    bool failed;  /* an allocation failed */
    double alloc_bytes;
    void *buf[MAX_BUFS];
    int n_buf;
    uint64_t n_tensors;

    linseq_kda_problem kp;
    linseq_kda_grads kg;
    linseq_kda_gate_problem gp;
    linseq_ssm1_problem sp;
    linseq_ssm1_grads sg;
    linseq_conv1d_problem cp;
    float *out, *state, *d_out;

    /* Decode cycles through n_pool copies of its states, so that each call finds its state in
     * memory, not in a cache, as in a model where the other layers run between two steps. */
    int64_t pool_mib, n_pool, next;
    void *saved;                 /* kda-fwdbwd: the training forward's saved block           */
    size_t saved_bytes;
    int64_t *rows; /* KDA: state_rows of copy c are rows[c*B .. c*B+B-1] */

    double tokens, flops, bytes; /* per call, README "Benchmarks" */
} job;

/* Zeroed memory of n_bytes that job_free releases; NULL in the dry pass. Zeroing maps the
 * pages, so that outputs do not fault during the timing. */
static void *buffer(job *j, double n_bytes)
{
    const double bytes = 64.0 * ceil(n_bytes / 64.0);
    j->alloc_bytes += bytes;
    if (j->dry || j->failed) return NULL;
    void *x = NULL;
    if (j->n_buf < MAX_BUFS && bytes < (double)SIZE_MAX) x = aligned_alloc(64, (size_t)bytes);
    if (!x) {
        j->failed = true;
        return NULL;
    }
    j->buf[j->n_buf++] = x;
    memset(x, 0, (size_t)bytes);
    return x;
}

/* A tensor of n floats drawn from d (zeros for DIST_ZERO); NULL in the dry pass. */
static float *tensor(job *j, int64_t n, dist d, double a, double b)
{
    j->n_tensors++;
    float *x = buffer(j, (double)n * sizeof(float));
    if (x && d != DIST_ZERO) fill(x, n, j->n_tensors, d, a, b);
    return x;
}

/* How many copies of a decode state of `floats` floats make up the pool (--mib MiB). */
static int64_t pool_copies(const job *j, int64_t floats)
{
    if (j->pool_mib <= 0) return 1; /* warm: one state, reused */
    const double want = ceil((double)j->pool_mib * 1048576.0 / ((double)floats * sizeof(float)));
    return want < 1.0 ? 1 : want > 65536.0 ? 65536 : (int64_t)want;
}

static void job_free(job *j)
{
    for (int i = 0; i < j->n_buf; i++) free(j->buf[i]);
    j->n_buf = 0;
}

/* Chunked KDA per token and head; the in-chunk terms use min(C, T) for a short sequence. */
static double kda_fwd_flops_token_head(const spec *s)
{
    const double K = (double)s->K, V = (double)s->V;
    if (s->op == OP_KDA_DECODE || s->mode == LINSEQ_MODE_RECURRENT) return 7.0 * K * V;
    const double C = (double)(s->chunk < s->T ? s->chunk : s->T);
    return 6.0 * K * V + 2.0 * C * K + 2.0 * C * V;
}

static void setup_kda(job *j)
{
    const spec *s = &j->s;
    const int64_t BT = s->B * s->T, H = s->H, K = s->K, V = s->V;
    const int64_t gw = s->decay == LINSEQ_DECAY_PER_CHANNEL ? K : 1;
    linseq_kda_problem *p = &j->kp;
    *p = (linseq_kda_problem){.B = s->B, .T = s->T, .H = H, .K = K, .V = V,
                              .decay = s->decay, .qk_l2norm = true};
    p->q = tensor(j, BT * H * K, DIST_NORMAL, 1.0, 0.0);
    p->k = tensor(j, BT * H * K, DIST_NORMAL, 1.0, 0.0);
    p->v = tensor(j, BT * H * V, DIST_NORMAL, 1.0, 0.0);
    p->beta = tensor(j, BT * H, DIST_SIGMOID, 0.0, 0.0);
    p->g = tensor(j, BT * H * gw, DIST_LOGSIGMOID, 0.0, 0.0);
    j->out = tensor(j, BT * H * V, DIST_ZERO, 0.0, 0.0);

    const double in = (double)BT * (double)(2 * H * K + H * V + H + H * gw);
    const double o = (double)BT * (double)(H * V), st = (double)(s->B * H * K * V);
    const double fwd = (double)BT * (double)H * kda_fwd_flops_token_head(s);
    j->tokens = (double)BT;
    if (s->op == OP_KDA) {
        j->state = tensor(j, s->B * H * K * V, DIST_ZERO, 0.0, 0.0); /* ht */
        j->flops = fwd;
        j->bytes = 4.0 * (in + o + st);
    } else if (s->op == OP_KDA_DECODE) {
        /* States as a prefill leaves them: bounded, dense. */
        j->n_pool = pool_copies(j, s->B * H * K * V);
        j->state = tensor(j, j->n_pool * s->B * H * K * V, DIST_NORMAL, 0.1, 0.0);
        j->rows = buffer(j, (double)(j->n_pool * s->B) * sizeof(int64_t));
        if (j->rows)
            for (int64_t r = 0; r < j->n_pool * s->B; r++) j->rows[r] = r;
        j->flops = fwd;
        j->bytes = 4.0 * (in + o + 2.0 * st);
    } else {
        j->d_out = tensor(j, BT * H * V, DIST_NORMAL, 1.0, 0.0);
        j->kg = (linseq_kda_grads){.dq = tensor(j, BT * H * K, DIST_ZERO, 0.0, 0.0),
                                   .dk = tensor(j, BT * H * K, DIST_ZERO, 0.0, 0.0),
                                   .dv = tensor(j, BT * H * V, DIST_ZERO, 0.0, 0.0),
                                   .dbeta = tensor(j, BT * H, DIST_ZERO, 0.0, 0.0),
                                   .dg = tensor(j, BT * H * gw, DIST_ZERO, 0.0, 0.0)};
        j->flops = 3.0 * fwd;
        j->bytes = 4.0 * (3.0 * in + 2.0 * o);
        if (linseq_kda_saved_size(p, &j->ex, &j->saved_bytes) == LINSEQ_OK)
            j->saved = buffer(j, (double)j->saved_bytes);
        else
            j->failed = true;
    }
}

static void setup_gate(job *j)
{
    const spec *s = &j->s;
    const int64_t gw = s->decay == LINSEQ_DECAY_PER_CHANNEL ? s->K : 1;
    const int64_t n = s->B * s->T * s->H * gw;
    linseq_kda_gate_problem *p = &j->gp;
    *p = (linseq_kda_gate_problem){.B = s->B, .T = s->T, .H = s->H, .K = s->K,
                                   .decay = s->decay};
    p->g_raw = tensor(j, n, DIST_NORMAL, 1.0, 0.0);
    p->A_log = tensor(j, s->H, DIST_LOG_OF_UNIFORM, 1.0, 16.0);
    p->dt_bias = tensor(j, s->H * gw, DIST_INV_SOFTPLUS_DT, 1e-3, 1e-1);
    j->out = tensor(j, n, DIST_ZERO, 0.0, 0.0);
    j->tokens = (double)(s->B * s->T);
    j->flops = 2.0 * (double)n;
    j->bytes = 4.0 * (2.0 * (double)n + (double)s->H + (double)(s->H * gw));
}

static void setup_ssm1(job *j)
{
    const spec *s = &j->s;
    const int64_t BT = s->B * s->T, D = s->D, N = s->N;
    linseq_ssm1_problem *p = &j->sp;
    *p = (linseq_ssm1_problem){.B = s->B, .T = s->T, .D = D, .N = N, .G = 1,
                               .gate_activation = LINSEQ_ACT_SILU};
    p->x = tensor(j, BT * D, DIST_NORMAL, 1.0, 0.0);
    p->dt = tensor(j, BT * D, DIST_LOG_UNIFORM, 1e-3, 1e-1); /* after softplus */
    float *A = tensor(j, D * N, DIST_ZERO, 0.0, 0.0);
    /* A = -exp(A_log) with mamba's S4D-real A_log[d,n] = log(n+1). */
    if (A)
        for (int64_t i = 0; i < D * N; i++) A[i] = -expf(logf((float)(i % N + 1)));
    p->A = A;
    p->B_proj = tensor(j, BT * N, DIST_NORMAL, 1.0, 0.0);
    p->C_proj = tensor(j, BT * N, DIST_NORMAL, 1.0, 0.0);
    p->D_skip = tensor(j, D, DIST_UNIFORM, 1.0, 1.0);
    p->gate = tensor(j, BT * D, DIST_NORMAL, 1.0, 0.0);
    j->out = tensor(j, BT * D, DIST_ZERO, 0.0, 0.0);

    const double in = (double)BT * (double)(3 * D + 2 * N) + (double)(D * N + D);
    const double y = (double)(BT * D), st = (double)(s->B * D * N);
    const double fwd = 6.0 * (double)BT * (double)D * (double)N;
    j->tokens = (double)BT;
    if (s->op == OP_SSM1) {
        j->state = tensor(j, s->B * D * N, DIST_ZERO, 0.0, 0.0); /* hT */
        j->flops = fwd;
        j->bytes = 4.0 * (in + y + st);
    } else if (s->op == OP_SSM1_DECODE) {
        j->n_pool = pool_copies(j, s->B * D * N);
        j->state = tensor(j, j->n_pool * s->B * D * N, DIST_NORMAL, 0.1, 0.0);
        j->flops = fwd;
        j->bytes = 4.0 * (in + y + 2.0 * st);
    } else {
        j->d_out = tensor(j, BT * D, DIST_NORMAL, 1.0, 0.0);
        j->sg = (linseq_ssm1_grads){.dx = tensor(j, BT * D, DIST_ZERO, 0.0, 0.0),
                                    .ddt = tensor(j, BT * D, DIST_ZERO, 0.0, 0.0),
                                    .dA = tensor(j, D * N, DIST_ZERO, 0.0, 0.0),
                                    .dB_proj = tensor(j, BT * N, DIST_ZERO, 0.0, 0.0),
                                    .dC_proj = tensor(j, BT * N, DIST_ZERO, 0.0, 0.0),
                                    .dD_skip = tensor(j, D, DIST_ZERO, 0.0, 0.0),
                                    .dgate = tensor(j, BT * D, DIST_ZERO, 0.0, 0.0)};
        j->flops = 3.0 * fwd;
        j->bytes = 4.0 * (3.0 * in + 2.0 * y);
    }
}

static void setup_conv(job *j)
{
    const spec *s = &j->s;
    const int64_t BT = s->B * s->T, D = s->D, W = s->W;
    const double wb = 1.0 / sqrt((double)W); /* torch's default conv init */
    linseq_conv1d_problem *p = &j->cp;
    *p = (linseq_conv1d_problem){.B = s->B, .T = s->T, .D = D, .W = W,
                                 .activation = LINSEQ_ACT_SILU};
    p->x = tensor(j, BT * D, DIST_NORMAL, 1.0, 0.0);
    p->weight = tensor(j, D * W, DIST_UNIFORM, -wb, wb);
    p->bias = tensor(j, D, DIST_UNIFORM, -wb, wb);
    j->out = tensor(j, BT * D, DIST_ZERO, 0.0, 0.0);
    /* The window a prefill hands to decode; there is none for W = 1. */
    j->state = W > 1 ? tensor(j, s->B * D * (W - 1), DIST_ZERO, 0.0, 0.0) : NULL;
    j->tokens = (double)BT;
    j->flops = 2.0 * (double)W * (double)(BT * D);
    j->bytes = 4.0 * (2.0 * (double)(BT * D) + (double)(D * W + D) + (double)(s->B * D * (W - 1)));
}

static void job_setup(job *j)
{
    j->n_tensors = 0;
    j->alloc_bytes = 0.0;
    j->ex = (linseq_exec){.threads = j->s.threads};
    if (j->s.op == OP_KDA || j->s.op == OP_KDA_FWDBWD) {
        j->ex.mode = j->s.mode;
        j->ex.chunk_size = j->s.chunk;
    }
    if (is_kda(j->s.op))
        setup_kda(j);
    else if (j->s.op == OP_GATE)
        setup_gate(j);
    else if (is_ssm1(j->s.op))
        setup_ssm1(j);
    else
        setup_conv(j);
}

/* Allocates and fills; LS_EXIT_OK or a one-line report. */
static int job_prepare(job *j, const spec *s, int pool_mib)
{
    memset(j, 0, sizeof *j);
    j->s = *s;
    j->pool_mib = pool_mib;
    j->dry = true;
    job_setup(j);
    const double need = j->alloc_bytes;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    /* Overcommit would let a huge shape "allocate" and then be killed while filling. */
    if (pages > 0 && page > 0 && need > 0.9 * (double)pages * (double)page) {
        fprintf(stderr, "linseq bench: %s needs %.1f GiB, more than this machine's memory\n",
                cmd_names[s->op], need / 1073741824.0);
        return LS_EXIT_ERROR;
    }
    j->dry = false;
    job_setup(j);
    if (j->failed) {
        fprintf(stderr, "linseq bench: cannot allocate %.1f GiB for %s\n", need / 1073741824.0,
                cmd_names[s->op]);
        job_free(j);
        return LS_EXIT_ERROR;
    }
    return LS_EXIT_OK;
}

static linseq_status job_run(job *j)
{
    linseq_status st;
    switch (j->s.op) {
    case OP_KDA: return linseq_kda_forward(&j->kp, &j->ex, j->out, j->state);
    case OP_KDA_FWDBWD:
        /* a training step: the forward keeps what its backward needs */
        st = linseq_kda_forward_train(&j->kp, &j->ex, j->out, NULL, j->saved, j->saved_bytes);
        return st != LINSEQ_OK ? st
                               : linseq_kda_backward_saved(&j->kp, &j->ex, j->saved, j->saved_bytes,
                                                           j->d_out, NULL, &j->kg);
    case OP_KDA_DECODE: {
        const int64_t c = j->next++ % j->n_pool;
        return linseq_kda_decode(&j->kp, &j->ex, j->state, j->n_pool * j->s.B,
                                 j->rows + c * j->s.B, j->out);
    }
    case OP_GATE: return linseq_kda_gate_forward(&j->gp, &j->ex, j->out);
    case OP_SSM1: return linseq_ssm1_forward(&j->sp, &j->ex, j->out, j->state);
    case OP_SSM1_DECODE: {
        /* hT is h0: the state is updated in place. */
        float *h = j->state + (j->next++ % j->n_pool) * j->s.B * j->s.D * j->s.N;
        j->sp.h0 = h;
        return linseq_ssm1_forward(&j->sp, &j->ex, j->out, h);
    }
    case OP_SSM1_FWDBWD:
        st = linseq_ssm1_forward(&j->sp, &j->ex, j->out, NULL);
        return st != LINSEQ_OK ? st : linseq_ssm1_backward(&j->sp, &j->ex, j->d_out, NULL, &j->sg);
    default: return linseq_conv1d_forward(&j->cp, &j->ex, j->out, j->state);
    }
}

/* ---------------------------------------------------------------------------------- */
/* Timing                                                                             */
/* ---------------------------------------------------------------------------------- */

typedef struct timing {
    double median, min, max;
    /* CPU seconds per second while timing: about the thread count when the threads had the
     * processors to themselves (spinning threads count), less when another process ran. */
    double cpus_busy;
    double main_busy; /* the same for the calling thread alone: below 1 when it had to wait */
    int repeats, warmup;
} timing;

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static bool run_checked(job *j, double *seconds)
{
    const double t0 = now_s();
    const linseq_status st = job_run(j);
    *seconds = now_s() - t0;
    if (st == LINSEQ_OK) return true;
    fprintf(stderr, "linseq bench: %s failed: %s (%s)\n", cmd_names[j->s.op], linseq_last_error(),
            linseq_status_string(st));
    return false;
}

#define TARGET_S 1.0
#define MIN_REPEATS 10
#define MAX_REPEATS 1000000

static int time_job(job *j, const settings *set, timing *tm)
{
    double t, est = 0.0, warm_s = 0.0, first_s = 0.0;
    int warm = 0;
    /* Warm-up maps the outputs' pages, fills the caches and lets the clock ramp up. */
    while (set->warmup >= 0 ? warm < set->warmup : (warm < 2 || warm_s < 0.1) && warm < 100000) {
        if (!run_checked(j, &t)) return LS_EXIT_FAIL;
        if (warm++ == 0) first_s = t;
        warm_s += t;
    }
    /* The mean after the cold first call: one call delayed by a busy machine must not cut a
     * run of thousands of short calls down to a handful. */
    if (warm > 0) est = warm > 1 ? (warm_s - first_s) / (warm - 1) : first_s;
    int n = set->repeats, done = 0;
    double first = 0.0;
    if (n <= 0) {
        if (warm == 0) { /* no warm-up to size the run: the first timed call does */
            if (!run_checked(j, &first)) return LS_EXIT_FAIL;
            est = first;
            done = 1;
        }
        const double want = est > 0.0 ? ceil(TARGET_S / est) : (double)MAX_REPEATS;
        n = want < MIN_REPEATS ? MIN_REPEATS : want > MAX_REPEATS ? MAX_REPEATS : (int)want;
    }
    double *times = malloc(sizeof(double) * (size_t)n);
    if (!times) {
        fprintf(stderr, "linseq bench: out of memory\n");
        return LS_EXIT_ERROR;
    }
    times[0] = first;
    const double wall0 = now_s(), cpu0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    const double main0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (; done < n; done++)
        if (!run_checked(j, &times[done])) goto fail;
    const double wall = now_s() - wall0, cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    const double main_cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - main0;
    tm->cpus_busy = wall > 0.0 ? cpu / wall : 0.0;
    tm->main_busy = wall > 0.0 ? main_cpu / wall : 0.0;
    qsort(times, (size_t)n, sizeof(double), cmp_double);
    tm->median = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    tm->min = times[0];
    tm->max = times[n - 1];
    /* A clock that did not advance would give infinite rates and invalid JSON. */
    if (tm->median <= 0.0) tm->median = 1e-9;
    tm->repeats = n;
    tm->warmup = warm;
    free(times);
    return LS_EXIT_OK;
fail:
    free(times);
    return LS_EXIT_FAIL;
}

/* ---------------------------------------------------------------------------------- */
/* The machine's peak, measured with the library's ISA                                */
/* ---------------------------------------------------------------------------------- */

#define PEAK_TRIALS 5
#define PEAK_TRIAL_S 0.05

typedef double (*fma_fn)(int64_t iters, float mul, float add);
typedef void (*triad_fn)(int64_t n, float *a, const float *b, const float *c, float s);

/* Best of `trials` runs of the FMA chains on `threads` threads at once, GFLOP/s in all. */
static double measure_fma(int threads, int trials)
{
    const fma_fn fn = LS_ISA_PICK(ls_isa_active(), ls_peak_fma);
    const float mul = 0.999999f, add = 1e-7f;
    int64_t iters = 1 << 12;
    for (;;) { /* about PEAK_TRIAL_S per run; also ramps the clock up */
        const double t0 = now_s();
        fn(iters, mul, add);
        if (now_s() - t0 > PEAK_TRIAL_S || iters > ((int64_t)1 << 40)) break;
        iters *= 2;
    }
    double best = 0.0;
    for (int r = 0; r < trials; r++) {
        double flops = 0.0;
        const double t0 = now_s();
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : flops)
#endif
        flops += fn(iters, mul, add);
        const double rate = flops / (now_s() - t0);
        if (rate > best) best = rate;
    }
    (void)threads; /* unused without OpenMP */
    return best * 1e-9;
}

/* Best of `trials` triads over 3 arrays of `mib` MiB, GB/s counting 12 bytes per element
 * (2 reads, 1 write; like STREAM, and like the op byte counts, no write-allocate traffic).
 * Each thread streams the same slice it first touched. */
static double measure_triad(int threads, int mib, int trials)
{
    const triad_fn fn = LS_ISA_PICK(ls_isa_active(), ls_peak_triad);
    const int64_t n = (int64_t)mib * (1 << 20) / (int64_t)sizeof(float);
    const size_t bytes = (size_t)n * sizeof(float);
    float *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes);
    float *c = aligned_alloc(64, bytes);
    double best = 0.0;
    if (!a || !b || !c) goto out;
    for (int r = -1; r < trials; r++) { /* r = -1 touches the pages first */
        const double t0 = now_s();
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
        {
#ifdef _OPENMP
            const int64_t id = omp_get_thread_num(), nt = omp_get_num_threads();
#else
            const int64_t id = 0, nt = 1;
#endif
            /* Slices of whole cache lines. */
            const int64_t per = (n / nt + 15) / 16 * 16;
            const int64_t lo = id * per < n ? id * per : n, hi = lo + per < n ? lo + per : n;
            if (r < 0) {
                for (int64_t i = lo; i < hi; i++) a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f;
            } else {
                fn(hi - lo, a + lo, b + lo, c + lo, 0.5f);
            }
        }
        const double t = now_s() - t0;
        if (r >= 0 && 3.0 * (double)bytes / t > best) best = 3.0 * (double)bytes / t;
    }
out:
    free(a);
    free(b);
    free(c);
    (void)threads; /* unused without OpenMP */
    return best * 1e-9;
}

typedef struct peak {
    int threads, mib;
    double gflops, gbs;
} peak;

/* Once per process and thread count: cached in memory, never on disk. */
static const peak *get_peak(int threads, int mib)
{
    static peak cache[8];
    static int n_cache;
    if (threads > all_procs()) threads = all_procs();
    for (int i = 0; i < n_cache; i++)
        if (cache[i].threads == threads && cache[i].mib == mib) return &cache[i];
    peak p = {threads, mib, measure_fma(threads, PEAK_TRIALS),
              measure_triad(threads, mib, PEAK_TRIALS)};
    if (p.gbs <= 0.0)
        fprintf(stderr, "linseq bench: note: no memory for 3 arrays of %d MiB; bandwidth "
                        "fractions left out\n", mib);
    /* A process asks for at most two thread counts; past the end the last entry is reused. */
    if (n_cache == (int)(sizeof cache / sizeof cache[0])) n_cache--;
    cache[n_cache] = p;
    return &cache[n_cache++];
}

/* ---------------------------------------------------------------------------------- */
/* Results                                                                            */
/* ---------------------------------------------------------------------------------- */

typedef struct result {
    spec s;
    timing tm;
    double tokens, flops, bytes;
    int64_t n_pool; /* decode: copies of the states cycled through; 0 otherwise */
    const peak *pk; /* NULL with --no-peak */
} result;

static const char *mode_name(const spec *s)
{
    if (s->op != OP_KDA && s->op != OP_KDA_FWDBWD) return NULL;
    return s->mode == LINSEQ_MODE_RECURRENT ? "recurrent" : "chunked";
}

static const char *decay_name(const spec *s)
{
    if (!is_kda(s->op) && s->op != OP_GATE) return NULL;
    return s->decay == LINSEQ_DECAY_PER_HEAD ? "head" : "channel";
}

/* "B=1 T=2048 H=16 K=128 V=128": the sizes the op takes. */
static void shape_text(const spec *s, char *buf, size_t n)
{
    if (is_kda(s->op))
        snprintf(buf, n, "B=%" PRId64 " T=%" PRId64 " H=%" PRId64 " K=%" PRId64 " V=%" PRId64,
                 s->B, s->T, s->H, s->K, s->V);
    else if (s->op == OP_GATE)
        snprintf(buf, n, "B=%" PRId64 " T=%" PRId64 " H=%" PRId64 " K=%" PRId64, s->B, s->T, s->H,
                 s->K);
    else if (is_ssm1(s->op))
        snprintf(buf, n, "B=%" PRId64 " T=%" PRId64 " D=%" PRId64 " N=%" PRId64, s->B, s->T, s->D,
                 s->N);
    else
        snprintf(buf, n, "B=%" PRId64 " T=%" PRId64 " D=%" PRId64 " W=%" PRId64, s->B, s->T, s->D,
                 s->W);
}

/* "kda chunked-64 B=1 T=2048 H=16 K=128 V=128 per-channel" */
static void label_text(const spec *s, char *buf, size_t n)
{
    char shape[128], mode[32] = "", decay[32] = "";
    shape_text(s, shape, sizeof shape);
    if (mode_name(s) && s->mode == LINSEQ_MODE_CHUNKED)
        snprintf(mode, sizeof mode, " chunked-%d", s->chunk);
    else if (mode_name(s))
        snprintf(mode, sizeof mode, " recurrent");
    if (decay_name(s)) snprintf(decay, sizeof decay, " per-%s", decay_name(s));
    snprintf(buf, n, "%s%s %s%s", cmd_names[s->op], mode, shape, decay);
}

/* Fewer CPU-seconds than threads x wall time: some thread waited for a processor, and the
 * timing says more about the machine's other load than about the kernel. The calling thread
 * is checked on its own too: OpenMP's idle threads spin, so a 1-thread run can show two
 * processors busy while its one working thread waits. */
static bool contended(const result *r)
{
    const int want = r->s.threads < all_procs() ? r->s.threads : all_procs();
    return r->tm.cpus_busy < 0.85 * want || r->tm.main_busy < 0.85;
}

static double gflops(const result *r) { return r->flops / r->tm.median * 1e-9; }
static double gbs(const result *r) { return r->bytes / r->tm.median * 1e-9; }

/* Starts a JSON object holding the result's fields; the caller may add more and closes it. */
static void json_result(const result *r, const char *case_name)
{
    const spec *s = &r->s;
    printf("{\"op\": \"%s\"", cmd_names[s->op]);
    if (case_name) printf(", \"case\": \"%s\"", case_name);
    printf(", \"shape\": {\"B\": %" PRId64 ", \"T\": %" PRId64, s->B, s->T);
    if (is_kda(s->op))
        printf(", \"H\": %" PRId64 ", \"K\": %" PRId64 ", \"V\": %" PRId64 "}", s->H, s->K, s->V);
    else if (s->op == OP_GATE)
        printf(", \"H\": %" PRId64 ", \"K\": %" PRId64 "}", s->H, s->K);
    else if (is_ssm1(s->op))
        printf(", \"D\": %" PRId64 ", \"N\": %" PRId64 "}", s->D, s->N);
    else
        printf(", \"D\": %" PRId64 ", \"W\": %" PRId64 "}", s->D, s->W);
    if (mode_name(s) && s->mode == LINSEQ_MODE_CHUNKED)
        printf(", \"mode\": \"chunked\", \"chunk_size\": %d", s->chunk);
    else if (mode_name(s))
        printf(", \"mode\": \"recurrent\", \"chunk_size\": null");
    else
        printf(", \"mode\": null, \"chunk_size\": null");
    if (decay_name(s))
        printf(", \"decay\": \"%s\"", decay_name(s));
    else
        printf(", \"decay\": null");
    printf(", \"threads\": %d, \"isa\": \"%s\", \"repeats\": %d, \"warmup\": %d", s->threads,
           linseq_isa(), r->tm.repeats, r->tm.warmup);
    printf(", \"median_s\": %.9g, \"min_s\": %.9g, \"max_s\": %.9g", r->tm.median, r->tm.min,
           r->tm.max);
    printf(", \"tokens\": %.17g, \"tokens_per_s\": %.9g, \"us_per_token\": %.9g", r->tokens,
           r->tokens / r->tm.median, r->tm.median / r->tokens * 1e6);
    printf(", \"flops\": %.17g, \"gflops\": %.9g, \"bytes\": %.17g, \"gbytes_per_s\": %.9g",
           r->flops, gflops(r), r->bytes, gbs(r));
    printf(", \"cpus_busy\": %.4g, \"contended\": %s", r->tm.cpus_busy,
           contended(r) ? "true" : "false");
    if (r->n_pool > 0)
        printf(", \"state_copies\": %" PRId64, r->n_pool);
    else
        printf(", \"state_copies\": null");
    if (r->pk)
        printf(", \"peak_threads\": %d", r->pk->threads);
    else
        printf(", \"peak_threads\": null");
    if (r->pk && r->pk->gflops > 0.0)
        printf(", \"peak_gflops\": %.9g, \"peak_flops_fraction\": %.9g", r->pk->gflops,
               gflops(r) / r->pk->gflops);
    else
        printf(", \"peak_gflops\": null, \"peak_flops_fraction\": null");
    if (r->pk && r->pk->gbs > 0.0)
        printf(", \"peak_gbytes_per_s\": %.9g, \"peak_bw_fraction\": %.9g", r->pk->gbs,
               gbs(r) / r->pk->gbs);
    else
        printf(", \"peak_gbytes_per_s\": null, \"peak_bw_fraction\": null");
}

static void print_time(const char *what, double s)
{
    if (s >= 1.0)
        printf("%s %.3f s", what, s);
    else if (s >= 1e-3)
        printf("%s %.3f ms", what, s * 1e3);
    else
        printf("%s %.2f us", what, s * 1e6);
}

static void text_result(const result *r)
{
    char label[256];
    label_text(&r->s, label, sizeof label);
    printf("%s, %d thread%s, isa %s\n", label, r->s.threads, r->s.threads == 1 ? "" : "s",
           linseq_isa());
    print_time("  time    median", r->tm.median);
    print_time(", min", r->tm.min);
    print_time(", max", r->tm.max);
    printf(" (%d calls after %d warm-up)\n", r->tm.repeats, r->tm.warmup);
    if (r->n_pool > 0)
        printf("  states  %" PRId64 " cop%s of the B states, one per call in turn\n", r->n_pool,
               r->n_pool == 1 ? "y" : "ies");
    printf("  cpu     %.2f processors busy while timing%s\n", r->tm.cpus_busy,
           contended(r) ? ": fewer than the threads, another process was running" : "");
    printf("  rate    %.6g tokens/s, %.4g us per token\n", r->tokens / r->tm.median,
           r->tm.median / r->tokens * 1e6);
    printf("  compute %.4g GFLOP/s (%.4g GFLOP per call)", gflops(r), r->flops * 1e-9);
    if (r->pk)
        printf(", %.1f%% of the %.1f GFLOP/s FMA peak on %d thread%s",
               100.0 * gflops(r) / r->pk->gflops, r->pk->gflops, r->pk->threads,
               r->pk->threads == 1 ? "" : "s");
    printf("\n  memory  %.4g GB/s (%.4g MB per call)", gbs(r), r->bytes * 1e-6);
    if (r->pk && r->pk->gbs > 0.0)
        printf(", %.1f%% of the %.1f GB/s triad bandwidth", 100.0 * gbs(r) / r->pk->gbs,
               r->pk->gbs);
    printf("\n");
}

/* Runs one spec: LS_EXIT_OK with *r filled, or the exit code. */
static int bench_one(const spec *s, const settings *set, result *r)
{
    job j;
    int rc = job_prepare(&j, s, set->cold ? set->mib : 0);
    if (rc != LS_EXIT_OK) return rc;
    const peak *pk = set->no_peak ? NULL : get_peak(s->threads, set->mib);
    *r = (result){.s = *s, .tokens = j.tokens, .flops = j.flops, .bytes = j.bytes,
                  .n_pool = j.n_pool, .pk = pk};
    rc = time_job(&j, set, &r->tm);
    job_free(&j);
    return rc;
}

/* ---------------------------------------------------------------------------------- */
/* peak and suite                                                                     */
/* ---------------------------------------------------------------------------------- */

static int cmd_peak(const settings *set)
{
    const int n = set->threads > 0 ? set->threads : all_procs();
    const int trials = set->repeats > 0 ? set->repeats : PEAK_TRIALS;
    const double f1 = measure_fma(1, trials), fn = measure_fma(n, trials);
    const double b1 = measure_triad(1, set->mib, trials), bn = measure_triad(n, set->mib, trials);
    if (b1 <= 0.0 || bn <= 0.0) {
        fprintf(stderr, "linseq bench: cannot allocate 3 arrays of %d MiB\n", set->mib);
        return LS_EXIT_ERROR;
    }
    if (set->json) {
        printf("{\"op\": \"peak\", \"isa\": \"%s\", \"threads\": %d, \"fma_gflops_1_thread\": %.9g"
               ", \"fma_gflops\": %.9g, \"bw_gbytes_per_s_1_thread\": %.9g"
               ", \"bw_gbytes_per_s\": %.9g, \"array_mib\": %d, \"trials\": %d}\n",
               linseq_isa(), n, f1, fn, b1, bn, set->mib, trials);
        return LS_EXIT_OK;
    }
    printf("linseq %s bench peak: isa %s, best of %d trials\n", linseq_version(), linseq_isa(),
           trials);
    printf("  fp32 FMA  %4d thread%s %9.1f GFLOP/s\n", 1, " ", f1);
    printf("  fp32 FMA  %4d thread%s %9.1f GFLOP/s\n", n, n == 1 ? " " : "s", fn);
    printf("  triad     %4d thread%s %9.1f GB/s\n", 1, " ", b1);
    printf("  triad     %4d thread%s %9.1f GB/s\n", n, n == 1 ? " " : "s", bn);
    printf("  (triad: a = b + s c over 3 arrays of %d MiB, 12 bytes per element)\n", set->mib);
    return LS_EXIT_OK;
}

typedef enum note { NONE, US_PER_TOKEN, FWD_RATIO, SCALING } note;

typedef struct suite_case {
    const char *name;
    op_id op;
    int64_t B, T, H;
    int64_t size; /* K = V for KDA, D for SSM1 and conv */
    linseq_mode mode;
    int threads;  /* 0 = the suite's count (all processors) */
    note what;
    int ref;      /* the case a FWD_RATIO or SCALING note compares with */
} suite_case;

#define CH LINSEQ_MODE_CHUNKED
#define RE LINSEQ_MODE_RECURRENT
#define FWD OP_KDA
#define FB OP_KDA_FWDBWD
#define DEC OP_KDA_DECODE
/* The standard shapes. KDA: per-channel decay, chunk 64; SSM1: N = 16; conv: W = 4.
 * The 1-thread runs come last and refer to their all-thread twins for the scaling. */
static const suite_case suite_cases[] = {
    /*  0 */ {"KDA fwd chunked B=1 H=16 T=4096 K=V=128", FWD, 1, 4096, 16, 128, CH, 0, NONE, 0},
    /*  1 */ {"KDA fwd chunked B=4 H=16 T=2048 K=V=128", FWD, 4, 2048, 16, 128, CH, 0, NONE, 0},
    /*  2 */ {"KDA fwd chunked B=1 H=32 T=1024 K=V=128", FWD, 1, 1024, 32, 128, CH, 0, NONE, 0},
    /*  3 */ {"KDA fwd chunked B=8 H=8 T=1024 K=V=64", FWD, 8, 1024, 8, 64, CH, 0, NONE, 0},
    /*  4 */ {"KDA fwd recurrent B=1 H=32 T=512 K=V=128", FWD, 1, 512, 32, 128, RE, 0, NONE, 0},
    /*  5 */ {"KDA fwd chunked B=1 H=32 T=512 K=V=128", FWD, 1, 512, 32, 128, CH, 0, NONE, 0},
    /*  6 */ {"KDA fwd chunked B=1 H=1 T=4096 K=V=128", FWD, 1, 4096, 1, 128, CH, 1,
              US_PER_TOKEN, 0},
    /*  7 */ {"KDA decode B=1 H=32 K=V=128", DEC, 1, 1, 32, 128, CH, 0, NONE, 0},
    /*  8 */ {"KDA decode B=8 H=32 K=V=128", DEC, 8, 1, 32, 128, CH, 0, NONE, 0},
    /*  9 */ {"KDA decode B=32 H=32 K=V=128", DEC, 32, 1, 32, 128, CH, 0, NONE, 0},
    /* 10 */ {"KDA fwd chunked B=1 H=16 T=2048 K=V=128", FWD, 1, 2048, 16, 128, CH, 0, NONE, 0},
    /* 11 */ {"KDA fwd+bwd chunked B=1 H=16 T=2048 K=V=128", FB, 1, 2048, 16, 128, CH, 0,
              FWD_RATIO, 10},
    /* 12 */ {"SSM1 fwd D=1536 T=2048", OP_SSM1, 1, 2048, 0, 1536, CH, 0, NONE, 0},
    /* 13 */ {"SSM1 fwd+bwd D=1536 T=2048", OP_SSM1_FWDBWD, 1, 2048, 0, 1536, CH, 0, FWD_RATIO, 12},
    /* 14 */ {"SSM1 decode B=1 D=1536", OP_SSM1_DECODE, 1, 1, 0, 1536, CH, 0, NONE, 0},
    /* 15 */ {"SSM1 fwd D=4096 T=2048", OP_SSM1, 1, 2048, 0, 4096, CH, 0, NONE, 0},
    /* 16 */ {"SSM1 fwd+bwd D=4096 T=2048", OP_SSM1_FWDBWD, 1, 2048, 0, 4096, CH, 0, FWD_RATIO, 15},
    /* 17 */ {"SSM1 decode B=1 D=4096", OP_SSM1_DECODE, 1, 1, 0, 4096, CH, 0, NONE, 0},
    /* 18 */ {"SSM1 fwd D=4096 T=512", OP_SSM1, 1, 512, 0, 4096, CH, 0, NONE, 0},
    /* 19 */ {"SSM1 fwd D=1536 T=512", OP_SSM1, 1, 512, 0, 1536, CH, 0, NONE, 0},
    /* 20 */ {"conv D=4096 T=2048", OP_CONV, 1, 2048, 0, 4096, CH, 0, NONE, 0},
    /* 21 */ {"conv D=4096 T=512", OP_CONV, 1, 512, 0, 4096, CH, 0, NONE, 0},
    /* 22 */ {"KDA fwd chunked B=1 H=16 T=4096 K=V=128", FWD, 1, 4096, 16, 128, CH, 1, SCALING, 0},
    /* 23 */ {"KDA fwd+bwd chunked B=1 H=16 T=2048 K=V=128", FB, 1, 2048, 16, 128, CH, 1,
              SCALING, 11},
    /* 24 */ {"SSM1 fwd D=4096 T=2048", OP_SSM1, 1, 2048, 0, 4096, CH, 1, SCALING, 15},
    /* 25 */ {"SSM1 fwd+bwd D=4096 T=2048", OP_SSM1_FWDBWD, 1, 2048, 0, 4096, CH, 1, SCALING, 16},
    /* 26 */ {"conv D=4096 T=2048", OP_CONV, 1, 2048, 0, 4096, CH, 1, SCALING, 20},
};
#undef CH
#undef RE
#undef FWD
#undef FB
#undef DEC
#define N_SUITE ((int)(sizeof suite_cases / sizeof suite_cases[0]))

static void suite_row(const char *name, const result *r)
{
    printf("%-46s %3d %11.3f %11.0f %8.2f", name, r->s.threads, r->tm.median * 1e3,
           r->tokens / r->tm.median, gflops(r));
    if (r->pk)
        printf(" %6.1f", 100.0 * gflops(r) / r->pk->gflops);
    else
        printf(" %6s", "-");
    printf(" %8.2f", gbs(r));
    if (r->pk && r->pk->gbs > 0.0)
        printf(" %6.1f", 100.0 * gbs(r) / r->pk->gbs);
    else
        printf(" %6s", "-");
    printf("%s\n", contended(r) ? " *" : "");
}

static int cmd_suite(const settings *set)
{
    const int n = set->threads > 0 ? set->threads : all_procs();
    result res[N_SUITE];
    if (!set->no_peak) {
        const peak *p1 = get_peak(1, set->mib), *pn = get_peak(n, set->mib);
        if (set->json)
            printf("{\"op\": \"peak\", \"isa\": \"%s\", \"threads\": %d, \"fma_gflops_1_thread\": "
                   "%.9g, \"fma_gflops\": %.9g, \"bw_gbytes_per_s_1_thread\": %.9g"
                   ", \"bw_gbytes_per_s\": %.9g, \"array_mib\": %d, \"trials\": %d}\n",
                   linseq_isa(), pn->threads, p1->gflops, pn->gflops, p1->gbs, pn->gbs, set->mib,
                   PEAK_TRIALS);
        else
            printf("linseq %s bench suite: isa %s; measured peak: FMA %.1f GFLOP/s on 1 thread, "
                   "%.1f on %d;\n  triad %.1f GB/s on 1 thread, %.1f on %d\n\n",
                   linseq_version(), linseq_isa(), p1->gflops, pn->gflops, pn->threads, p1->gbs,
                   pn->gbs, pn->threads);
    } else if (!set->json) {
        printf("linseq %s bench suite: isa %s\n\n", linseq_version(), linseq_isa());
    }
    if (!set->json)
        printf("%-46s %3s %11s %11s %8s %6s %8s %6s\n", "case", "thr", "median ms", "tokens/s",
               "GFLOP/s", "%peak", "GB/s", "%bw");
    fflush(stdout);
    for (int i = 0; i < N_SUITE; i++) {
        const suite_case *c = &suite_cases[i];
        spec s = default_spec(c->op);
        s.B = c->B;
        s.T = c->T;
        if (is_kda(c->op)) {
            s.H = c->H;
            s.K = s.V = c->size;
        } else {
            s.D = c->size;
        }
        s.mode = c->mode;
        s.threads = c->threads > 0 ? c->threads : n;
        const int rc = bench_one(&s, set, &res[i]);
        if (rc != LS_EXIT_OK) return rc;
        const result *r = &res[i], *ref = &res[c->ref];
        if (set->json) {
            json_result(r, c->name);
            if (c->what == FWD_RATIO)
                printf(", \"ratio_to_forward\": %.9g", r->tm.median / ref->tm.median);
            if (c->what == SCALING)
                printf(", \"scaling_threads\": %d, \"scaling_speedup\": %.9g", ref->s.threads,
                       r->tm.median / ref->tm.median);
            printf("}\n");
        } else {
            suite_row(c->name, r);
        }
        fflush(stdout);
    }
    if (set->json) return LS_EXIT_OK;
    bool any_contended = false;
    for (int i = 0; i < N_SUITE; i++) any_contended |= contended(&res[i]);
    if (any_contended)
        printf("* fewer processors busy than threads while timing: another process was running\n");
    printf("\n");
    for (int i = 0; i < N_SUITE; i++) {
        const suite_case *c = &suite_cases[i];
        const result *r = &res[i], *ref = &res[c->ref];
        if (c->what == US_PER_TOKEN)
            printf("%s, 1 thread: %.2f us per token\n", c->name, r->tm.median / r->tokens * 1e6);
        else if (c->what == FWD_RATIO)
            printf("%s: %.2f x the forward\n", c->name, r->tm.median / ref->tm.median);
        else if (c->what == SCALING)
            printf("%s: %.2f x faster on %d threads than on 1\n", c->name,
                   r->tm.median / ref->tm.median, ref->s.threads);
    }
    return LS_EXIT_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Options                                                                            */
/* ---------------------------------------------------------------------------------- */

#define BIT(c) (1u << (c))
#define ALL_OPS (BIT(OP_COUNT) - 1u)
#define KDA_FWD (BIT(OP_KDA) | BIT(OP_KDA_FWDBWD))
#define KDA_ALL (KDA_FWD | BIT(OP_KDA_DECODE))
#define SSM1_ALL (BIT(OP_SSM1) | BIT(OP_SSM1_FWDBWD) | BIT(OP_SSM1_DECODE))
#define WITH_T (KDA_FWD | BIT(OP_GATE) | BIT(OP_SSM1) | BIT(OP_SSM1_FWDBWD) | BIT(OP_CONV))

typedef enum opt_id {
    O_B, O_T, O_H, O_K, O_V, O_D, O_N, O_W, O_MODE, O_CHUNK, O_DECAY, O_THREADS, O_REPEATS,
    O_WARMUP, O_MIB, O_JSON, O_NO_PEAK, O_COLD
} opt_id;

static const struct option_def {
    const char *name;
    opt_id id;
    unsigned applies; /* BIT(command) for each command that takes it */
    bool flag;
} options[] = {
    {"--B", O_B, ALL_OPS, false},
    {"--T", O_T, WITH_T, false},
    {"--H", O_H, KDA_ALL | BIT(OP_GATE), false},
    {"--K", O_K, KDA_ALL | BIT(OP_GATE), false},
    {"--V", O_V, KDA_ALL, false},
    {"--D", O_D, SSM1_ALL | BIT(OP_CONV), false},
    {"--N", O_N, SSM1_ALL, false},
    {"--W", O_W, BIT(OP_CONV), false},
    {"--mode", O_MODE, KDA_FWD, false},
    {"--chunk-size", O_CHUNK, KDA_FWD, false},
    {"--decay", O_DECAY, KDA_ALL | BIT(OP_GATE), false},
    {"--threads", O_THREADS, ALL_OPS | BIT(CMD_PEAK) | BIT(CMD_SUITE), false},
    {"--repeats", O_REPEATS, ALL_OPS | BIT(CMD_PEAK) | BIT(CMD_SUITE), false},
    {"--warmup", O_WARMUP, ALL_OPS | BIT(CMD_SUITE), false},
    {"--mib", O_MIB, ALL_OPS | BIT(CMD_PEAK) | BIT(CMD_SUITE), false},
    {"--json", O_JSON, ALL_OPS | BIT(CMD_PEAK) | BIT(CMD_SUITE), true},
    {"--no-peak", O_NO_PEAK, ALL_OPS | BIT(CMD_SUITE), true},
    {"--cold", O_COLD, BIT(OP_KDA_DECODE) | BIT(OP_SSM1_DECODE), true},
};

static bool parse_i64(const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    const long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) return false;
    *out = (int64_t)x;
    return true;
}

/* Sizes beyond this are rejected before any arithmetic on them can overflow. */
#define MAX_SIZE ((int64_t)1 << 31)

static int set_value(const struct option_def *o, const char *v, spec *s, settings *set)
{
    int64_t x = 0;
    int64_t *size = NULL;
    switch (o->id) {
    case O_B: size = &s->B; break;
    case O_T: size = &s->T; break;
    case O_H: size = &s->H; break;
    case O_K: size = &s->K; break;
    case O_V: size = &s->V; break;
    case O_D: size = &s->D; break;
    case O_N: size = &s->N; break;
    case O_W: size = &s->W; break;
    case O_MODE:
        if (strcmp(v, "recurrent") == 0)
            s->mode = LINSEQ_MODE_RECURRENT;
        else if (strcmp(v, "chunked") == 0)
            s->mode = LINSEQ_MODE_CHUNKED;
        else
            return usage_fail("--mode: '%s' is not recurrent or chunked", v);
        return LS_EXIT_OK;
    case O_CHUNK:
        if (!parse_i64(v, 16, 128, &x) || (x != 16 && x != 32 && x != 64 && x != 128))
            return usage_fail("--chunk-size: '%s' is not 16, 32, 64 or 128", v);
        s->chunk = (int)x;
        return LS_EXIT_OK;
    case O_DECAY:
        if (strcmp(v, "channel") == 0 || strcmp(v, "per-channel") == 0)
            s->decay = LINSEQ_DECAY_PER_CHANNEL;
        else if (strcmp(v, "head") == 0 || strcmp(v, "per-head") == 0)
            s->decay = LINSEQ_DECAY_PER_HEAD;
        else
            return usage_fail("--decay: '%s' is not channel or head", v);
        return LS_EXIT_OK;
    case O_THREADS:
        if (!parse_i64(v, 1, 4096, &x))
            return usage_fail("--threads: '%s' is not a thread count from 1 to 4096", v);
        set->threads = (int)x;
        return LS_EXIT_OK;
    case O_REPEATS:
        if (!parse_i64(v, 1, MAX_REPEATS, &x))
            return usage_fail("--repeats: '%s' is not a count from 1 to 1000000", v);
        set->repeats = (int)x;
        return LS_EXIT_OK;
    case O_WARMUP:
        if (!parse_i64(v, 0, MAX_REPEATS, &x))
            return usage_fail("--warmup: '%s' is not a count from 0 to 1000000", v);
        set->warmup = (int)x;
        return LS_EXIT_OK;
    case O_MIB:
        if (!parse_i64(v, 1, 65536, &x))
            return usage_fail("--mib: '%s' is not a size from 1 to 65536 MiB", v);
        set->mib = (int)x;
        return LS_EXIT_OK;
    default: return LS_EXIT_OK;
    }
    if (!parse_i64(v, 1, MAX_SIZE, &x))
        return usage_fail("%s: '%s' is not a size from 1 to 2^31", o->name, v);
    *size = x;
    return LS_EXIT_OK;
}

/* Every tensor's element count must fit comfortably in int64 and size_t arithmetic. */
static bool shape_fits(const spec *s)
{
    const double BT = (double)s->B * (double)s->T, lim = 0x1p60;
    if (is_kda(s->op) || s->op == OP_GATE)
        return BT * (double)s->H * (double)(s->K > s->V ? s->K : s->V) < lim &&
               (double)s->B * (double)s->H * (double)s->K * (double)s->V < lim;
    if (is_ssm1(s->op))
        return BT * (double)s->D * (double)s->N < lim &&
               (double)s->B * (double)s->D * (double)s->N < lim;
    return BT * (double)s->D < lim && (double)s->B * (double)s->D * (double)s->W < lim;
}

/* libgomp reads OMP_WAIT_POLICY when it loads, so the policy can only change for a new
 * process image: set it and exec ourselves. */
static void ensure_wait_policy(char **argv)
{
    if (getenv("OMP_WAIT_POLICY")) return;
    if (setenv("OMP_WAIT_POLICY", "active", 1) != 0) return;
    fprintf(stderr, "linseq bench: note: OMP_WAIT_POLICY was unset; running again with "
                    "OMP_WAIT_POLICY=active\n");
    fflush(stderr);
    fflush(stdout);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "linseq bench: note: could not run again (%s); timing with the default "
                    "OpenMP wait policy\n",
            strerror(errno));
}

int cmd_bench(int argc, char **argv)
{
    if (argc < 3)
        return usage_fail("needs an op: kda, kda-fwdbwd, kda-decode, gate, ssm1, ssm1-fwdbwd, "
                          "ssm1-decode, conv, peak or suite");
    if (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) {
        fputs(ls_bench_usage, stdout);
        return LS_EXIT_OK;
    }
    op_id cmd = CMD_COUNT;
    for (int c = 0; c < CMD_COUNT; c++)
        if (strcmp(argv[2], cmd_names[c]) == 0) cmd = (op_id)c;
    if (cmd == CMD_COUNT) return usage_fail("unknown op '%s'", argv[2]);

    spec s = default_spec(cmd < OP_COUNT ? cmd : OP_KDA);
    settings set = {.threads = 0, .repeats = 0, .warmup = -1, .mib = 256};
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(ls_bench_usage, stdout);
            return LS_EXIT_OK;
        }
        const char *eq = strchr(a, '=');
        const size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const struct option_def *o = NULL;
        for (size_t k = 0; k < sizeof options / sizeof options[0]; k++)
            if (strlen(options[k].name) == len && strncmp(a, options[k].name, len) == 0)
                o = &options[k];
        if (!o) {
            if (a[0] != '-') return usage_fail("%s takes no operand '%s'", cmd_names[cmd], a);
            return usage_fail("unknown option '%s'", a);
        }
        if (!(o->applies & BIT(cmd)))
            return usage_fail("option '%s' does not apply to %s", o->name, cmd_names[cmd]);
        if (o->flag) {
            if (eq) return usage_fail("option '%s' takes no value", o->name);
            if (o->id == O_JSON) set.json = true;
            if (o->id == O_NO_PEAK) set.no_peak = true;
            if (o->id == O_COLD) set.cold = true;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return usage_fail("option '%s' needs a value", o->name);
        const int rc = set_value(o, v, &s, &set);
        if (rc != LS_EXIT_OK) return rc;
    }
    if (cmd < OP_COUNT && !shape_fits(&s))
        return usage_fail("%s: the shape is too large", cmd_names[cmd]);

    ensure_wait_policy(argv);
    if (cmd == CMD_PEAK) return cmd_peak(&set);
    if (cmd == CMD_SUITE) return cmd_suite(&set);

    s.threads = set.threads > 0 ? set.threads : all_procs();
    result r;
    const int rc = bench_one(&s, &set, &r);
    if (rc != LS_EXIT_OK) return rc;
    if (set.json) {
        json_result(&r, NULL);
        printf("}\n");
    } else {
        text_result(&r);
    }
    return LS_EXIT_OK;
}
