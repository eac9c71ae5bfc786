/* `linseq bench`: times one op at one shape, measures the machine's peak, or runs the
 * standard suite. The ops, their sizes and defaults, tensors, input distributions and FLOP
 * counts come from the op table (src/optable): each op is benchable as its forward, and as
 * a training step and a decode step where the table offers them, with no line here naming
 * it. Inputs are realistic random data from a fixed seed; allocation and input generation
 * stay outside the timed region, and every timed call's status is checked. The FLOP and
 * byte counts are the formulas of README "Benchmarks": fixed functions of the shape, never
 * of the implementation, so numbers stay comparable as the kernels change. */
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

#include "commands.h"
#include "contend.h"
#include "core/parallel.h"
#include "core/state_rows.h"
#include "linseq.h"
#include "optable/optable.h"
#include "simd/isa.h"
#include "simd/peak.h"

/* The bench part of `linseq --help`: the fixed text around the op commands, which
 * ls_bench_usage lists from the op table. */
static const char usage_head[] =
    "bench:\n"
    "  linseq bench OP [shape] [--threads N] [--repeats N] [--warmup N] [--json]\n"
    "               [--no-peak] [--mib N] [--dtype f32|bf16] [--products f32|bf16]\n"
    "               [--contend N] [--cold] [--pool f32|bf16|f16] [--tap-major]\n"
    "      time one op at one shape; OP is an op of the table as its forward, and its\n"
    "      training step (-fwdbwd: forward, then backward) and decode step (-decode: one\n"
    "      token for each of B requests, their states in place) where it has them:\n";

static const char usage_tail[] =
    "  linseq bench peak [--threads N] [--repeats N] [--mib N] [--json] [--contend N]\n"
    "      fp32 FMA GFLOP/s on 1 thread and on N (default all processors), and the triad\n"
    "      bandwidth (a = b + s c over 3 arrays of --mib MiB) on both\n"
    "  linseq bench suite [--threads N] [--repeats N] [--warmup N] [--json] [--no-peak]\n"
    "                     [--mib N] [--contend N]\n"
    "      the standard shapes (docs/performance.md) in one table\n"
    "\n"
    "bench options:\n"
    "  --B --T --H ...  the op's sizes (>= 1; a decode step runs T=1)\n"
    "  --mode recurrent|chunked, --chunk-size 16|32|64|128, --decay channel|head\n"
    "  --dtype f32|bf16  the per-token tensors' type (default f32); bf16 where the op takes\n"
    "                 it on the CPU (the others refuse it); bytes count 2 per bf16 element\n"
    "  --products f32|bf16  exec->products: bf16 lets the chunked KDA and SSD forwards run\n"
    "                 their output's products, and their backwards those of the per-token\n"
    "                 gradients, on bf16 operands (default f32)\n"
    "  --threads N    threads per call (default: all processors)\n"
    "  --repeats N    timed calls (default: enough for about 1 s, at least 10);\n"
    "                 for peak: trials per figure, the best kept (default 5)\n"
    "  --warmup N     untimed calls first (default: at least 2 and 0.1 s)\n"
    "  --json         one JSON object per result on stdout instead of the text\n"
    "  --no-peak      do not measure the peak, so no fractions of it are reported\n"
    "  --mib N        MiB in each array of the bandwidth measurement (default 256)\n"
    "  --contend N    run N processes that keep a processor busy beside the timing (and\n"
    "                 the peak), as a loaded machine's other work does; 0 to 64\n"
    "  --cold         decode: cycle through copies of the state filling --mib MiB, so that\n"
    "                 each call reads its state from memory; by default one state is reused\n"
    "                 (cache-warm, as llama.cpp's test-backend-ops times its ops)\n"
    "  --pool f32|bf16|f16  decode: the states in a serving engine's pool of that element\n"
    "                 type, each updated in place by linseq_op_decode_pool, as a serving\n"
    "                 engine's decode step does; by default the op's own decode on float32\n"
    "                 rows in place\n"
    "  --tap-major    conv: vLLM's layouts, the state [N_seq, W-1, D] and the weight [W, D]\n"
    "                 (state_tap_major, weight_tap_major); the decode step then runs the\n"
    "                 kernel a serving engine's step reaches\n"
    "  Each result: median, min and max seconds per call, tokens/s, GFLOP/s and GB/s by the\n"
    "  formulas of README \"Benchmarks\", and the fractions of the FMA peak and the triad\n"
    "  bandwidth measured in the same process at the same thread count.\n"
    "  Threads: the library's own pool runs the calls and the peak measurements alike; its\n"
    "  idle threads spin for about 50 us between calls, then sleep.\n"
    "  exit status of bench: 0 done, 1 a library call failed, 2 bad usage or no memory\n";

/* ---------------------------------------------------------------------------------- */
/* What to run: the op table's ops, each as a forward and the runs it offers          */
/* ---------------------------------------------------------------------------------- */

typedef enum run_kind {
    RUN_FORWARD, /* the op's forward, every output written */
    RUN_FWDBWD,  /* a training step: forward (first output only), then backward */
    RUN_DECODE   /* one token for B requests, their states in a pool, updated in place */
} run_kind;

typedef struct command {
    const ls_op *op;
    run_kind kind;
    char name[64]; /* "kda", "kda-fwdbwd", "kda-decode", "gate", ... */
} command;

#define MAX_COMMANDS 64

/* Every op command, in the table's order: the forward, then "-fwdbwd", then "-decode". */
static const command *commands(int *count)
{
    static command cmds[MAX_COMMANDS];
    static int n_cmds = -1;
    if (n_cmds >= 0) {
        *count = n_cmds;
        return cmds;
    }
    int n_ops;
    const ls_op *const *ops = ls_ops(&n_ops);
    n_cmds = 0;
    for (int i = 0; i < n_ops && n_cmds + 3 <= MAX_COMMANDS; i++) {
        const char *base = ops[i]->bench_name ? ops[i]->bench_name : ops[i]->name;
        const bool offers[3] = {true, ops[i]->bench_fwdbwd, ops[i]->decode != NULL};
        static const char *const suffix[3] = {"", "-fwdbwd", "-decode"};
        for (int k = 0; k < 3; k++) {
            if (!offers[k]) continue;
            command *c = &cmds[n_cmds++];
            c->op = ops[i];
            c->kind = (run_kind)k;
            snprintf(c->name, sizeof c->name, "%s%s", base, suffix[k]);
        }
    }
    *count = n_cmds;
    return cmds;
}

/* Whether `name` is c's command spelled with the op's table name instead of its short
 * bench name ("causal_conv1d-fwdbwd" for "conv-fwdbwd"): the table's names work everywhere. */
static bool table_spelling(const command *c, const char *name)
{
    const char *base = c->op->bench_name ? c->op->bench_name : c->op->name;
    const size_t n_base = strlen(base), n_op = strlen(c->op->name);
    return strncmp(name, c->op->name, n_op) == 0 && strcmp(name + n_op, c->name + n_base) == 0;
}

static const command *find_command(const char *name)
{
    int n;
    const command *c = commands(&n);
    for (int i = 0; i < n; i++)
        if (strcmp(c[i].name, name) == 0 || table_spelling(&c[i], name)) return &c[i];
    return NULL;
}

/* A size the benchmark varies: one the table gives a default; decode runs T = 1. */
static bool bench_size(const command *c, int i)
{
    const ls_size_desc *sz = &c->op->sizes[i];
    return sz->bench_default > 0 && !(c->kind == RUN_DECODE && strcmp(sz->name, "T") == 0);
}

/* The op's enum option "decay" (KDA, the gate), which --decay sets; NULL if it has none. */
static const ls_option_desc *op_option(const ls_op *op, ls_ctype type, const char *key)
{
    for (int i = 0; i < op->n_options; i++)
        if (op->options[i].type == type && strcmp(op->options[i].key, key) == 0)
            return &op->options[i];
    return NULL;
}

static const ls_option_desc *decay_option(const ls_op *op)
{
    return op_option(op, LS_CTYPE_ENUM, "decay");
}

/* --tap-major sets both (the op has them or refuses the option). */
static const ls_option_desc *state_tap_major_option(const ls_op *op)
{
    return op_option(op, LS_CTYPE_BOOL, "state_tap_major");
}

typedef struct spec {
    const command *cmd;
    int64_t size[LS_OP_MAX_FIELDS]; /* of cmd->op->sizes[i]; 0: the struct's default */
    linseq_mode mode;               /* ops with modes, but decode: RECURRENT or CHUNKED */
    int chunk;
    int decay;                /* LINSEQ_DECAY_*, or -1: as the op's bench options */
    int threads;              /* > 0 */
    linseq_dtype dtype;       /* of the per-token tensors (--dtype) */
    linseq_products products; /* --products */
    int pool;                 /* decode: a linseq_pool_dtype (--pool), or -1: the op's decode */
    bool tap_major;           /* --tap-major */
} spec;

typedef struct settings {
    int threads; /* 0 = all processors */
    int repeats; /* 0 = until about 1 s */
    int warmup;  /* < 0 = at least 2 calls and 0.1 s */
    bool json, no_peak, cold;
    int mib;
    int contend; /* busy processes beside the timing (--contend) */
} settings;

static spec default_spec(const command *c)
{
    spec s = {
        .cmd = c, .mode = LINSEQ_MODE_CHUNKED, .chunk = 64, .decay = -1, .threads = 1, .pool = -1};
    for (int i = 0; i < c->op->n_sizes; i++) {
        s.size[i] = c->op->sizes[i].bench_default;
        if (c->kind == RUN_DECODE && strcmp(c->op->sizes[i].name, "T") == 0) s.size[i] = 1;
    }
    return s;
}

/* The size of that name (0 when the op has none). */
static int64_t spec_size(const spec *s, const char *name)
{
    for (int i = 0; i < s->cmd->op->n_sizes; i++)
        if (strcmp(s->cmd->op->sizes[i].name, name) == 0) return s->size[i];
    return 0;
}

/* The problem of s without its tensors: p is op->problem_size zeroed bytes. */
static void spec_problem(const spec *s, void *p)
{
    const ls_op *op = s->cmd->op;
    for (int i = 0; i < op->n_sizes; i++)
        if (s->size[i] > 0) ls_size_set(&op->sizes[i], p, s->size[i]);
    if (op->bench_options) op->bench_options(p);
    const ls_option_desc *decay = decay_option(op);
    if (decay && s->decay >= 0) memcpy((char *)p + decay->offset, &s->decay, sizeof s->decay);
    const ls_option_desc *state = state_tap_major_option(op);
    const ls_option_desc *weight = op_option(op, LS_CTYPE_BOOL, "weight_tap_major");
    const bool yes = true;
    if (s->tap_major && state) memcpy((char *)p + state->offset, &yes, sizeof yes);
    if (s->tap_major && weight) memcpy((char *)p + weight->offset, &yes, sizeof yes);
}

static int spec_decay(const spec *s, const void *p)
{
    const ls_option_desc *decay = decay_option(s->cmd->op);
    int v = -1;
    if (decay) memcpy(&v, (const char *)p + decay->offset, sizeof v);
    return v;
}

static bool has_modes(const spec *s) { return s->cmd->op->has_modes && s->cmd->kind != RUN_DECODE; }

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
/* A job: one op's problem, buffers and counts                                        */
/* ---------------------------------------------------------------------------------- */

/* Inputs are the table's distributions (ls_op_fill) from a seed per tensor: the n-th
 * tensor allocated gets SEED ^ n << 40, so the values do not depend on the thread count. */
#define SEED 20240531u
#define MAX_BUFS 32

typedef struct job {
    spec s;
    linseq_exec ex;
    bool dry;    /* only add up the sizes */
    bool failed; /* an allocation failed */
    double alloc_bytes;
    void *buf[MAX_BUFS];
    int n_buf;
    uint64_t n_tensors;

    void *problem; /* the op's problem struct, op->problem_size bytes */
    float *out[LS_OP_MAX_OUT];
    const float *upstream[LS_OP_MAX_OUT];
    _Alignas(void *) unsigned char grads[LS_OP_GRADS_BYTES]; /* the op's grads struct */
    void *saved; /* a training step's saved block (ops with forward_train) */
    size_t saved_bytes;

    /* Decode cycles through n_pool copies of its states, so that each call finds its state in
     * memory, not in a cache, as in a model where the other layers run between two steps. */
    int64_t pool_mib, n_pool, next, requests;
    float *pool;
    int64_t *rows; /* state rows of copy c are rows[c*B .. c*B+B-1] */

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

/* Bytes per element of t in the job: exec->dtype sets the type of the table's per-token
 * tensors (linseq.h); the others, decode's pool of states too, are float32. */
static double element_bytes(const job *j, const ls_tensor_desc *t)
{
    return j->s.dtype == LINSEQ_DTYPE_BF16 && t->token ? 2.0 : 4.0;
}

/* x rounded to the nearest bf16 (ties to even; NaN stays NaN). */
static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* A tensor of n values of t's distribution (zeros for LS_DIST_ZERO), dims its shape (for
 * the distributions that depend on the position); NULL in the dry pass. A bf16 tensor holds
 * the float32 draws rounded to nearest even. */
/* The seed of the job's next tensor's values. */
static uint64_t next_seed(job *j)
{
    j->n_tensors++;
    return SEED ^ (j->n_tensors << 40);
}

static float *tensor(job *j, const ls_tensor_desc *t, int64_t n, const int64_t *dims, int nd)
{
    const uint64_t seed = next_seed(j);
    const bool bf16 = element_bytes(j, t) == 2.0;
    void *x = buffer(j, (double)n * element_bytes(j, t));
    if (!x || t->dist == LS_DIST_ZERO) return x;
    if (!bf16) {
        ls_op_fill(t, x, n, dims, nd, seed);
        return x;
    }
    float *draws = malloc((size_t)n * sizeof *draws);
    if (!draws) {
        j->failed = true;
        return x;
    }
    ls_op_fill(t, draws, n, dims, nd, seed);
    uint16_t *h = x;
    for (int64_t i = 0; i < n; i++) h[i] = to_bf16(draws[i]);
    free(draws);
    return x;
}

/* Elements of t in the job's problem, its dims in dims (0: it does not exist). */
static int64_t elements(const job *j, const ls_tensor_desc *t, int64_t *dims, int *nd)
{
    int64_t n = 0;
    *nd = t->shape(j->problem, dims);
    return *nd > 0 && ls_tensor_count(t, j->problem, &n) ? n : 0;
}

static bool is_decode_state(const job *j, const ls_tensor_desc *t)
{
    const ls_op *op = j->s.cmd->op;
    if (j->s.cmd->kind != RUN_DECODE) return false;
    const char *state = t->role == LS_ROLE_INPUT    ? op->decode_state
                        : t->role == LS_ROLE_OUTPUT ? op->decode_state_out
                                                    : NULL;
    return state && strcmp(t->name, state) == 0;
}

/* The inputs the benchmark passes: the required ones and those marked bench (decode's
 * state lives in the pool). */
static bool input_used(const job *j, const ls_tensor_desc *t)
{
    int64_t dims[LS_OP_MAX_DIMS];
    int nd;
    return (t->required || t->bench) && !is_decode_state(j, t) && elements(j, t, dims, &nd) > 0;
}

/* The outputs a run writes: all of them; a training step only the first (no final state);
 * decode all but the state, which it updates in the pool. */
static bool output_used(const job *j, const ls_tensor_desc *t)
{
    int64_t dims[LS_OP_MAX_DIMS];
    int nd;
    if (j->s.cmd->kind == RUN_FWDBWD && t->offset != 0) return false;
    return !is_decode_state(j, t) && elements(j, t, dims, &nd) > 0;
}

/* Allocates (or counts) every tensor of role the run uses, in the table's order; returns
 * their bytes. Gradients are those of the inputs used; upstream gradients those of the
 * outputs used. */
static double setup_role(job *j, ls_op_role role)
{
    const ls_op *op = j->s.cmd->op;
    double total = 0.0;
    for (int i = 0; i < ls_op_count(op, role); i++) {
        const ls_tensor_desc *t = ls_op_tensor(op, role, i);
        const ls_tensor_desc *of =
            role == LS_ROLE_GRAD       ? ls_op_tensor_named(op, LS_ROLE_INPUT, t->grad_of)
            : role == LS_ROLE_UPSTREAM ? ls_op_tensor_named(op, LS_ROLE_OUTPUT, t->grad_of)
                                       : t;
        const bool used = role == LS_ROLE_INPUT || role == LS_ROLE_GRAD ? of && input_used(j, of)
                                                                        : of && output_used(j, of);
        int64_t dims[LS_OP_MAX_DIMS];
        int nd;
        const int64_t n = used ? elements(j, t, dims, &nd) : 0;
        if (n == 0) continue;
        float *x = tensor(j, t, n, dims, nd);
        total += (double)n * element_bytes(j, t);
        if (role == LS_ROLE_INPUT) ls_tensor_set(t, j->problem, x);
        if (role == LS_ROLE_GRAD) ls_tensor_set(t, j->grads, x);
        if (role == LS_ROLE_OUTPUT && t->offset < LS_OP_MAX_OUT) j->out[t->offset] = x;
        if (role == LS_ROLE_UPSTREAM && t->offset < LS_OP_MAX_OUT) j->upstream[t->offset] = x;
    }
    return total;
}

/* How many copies of a decode state of `floats` floats make up the pool (--mib MiB). */
static int64_t pool_copies(const job *j, int64_t floats)
{
    if (j->pool_mib <= 0) return 1; /* warm: one state, reused */
    const double want = ceil((double)j->pool_mib * 1048576.0 / ((double)floats * sizeof(float)));
    return want < 1.0 ? 1 : want > 65536.0 ? 65536 : (int64_t)want;
}

/* Decode's pool of states as a prefill leaves them (bounded, dense) and the rows of each
 * copy; returns the elements of one copy (the B requests' states). */
static double setup_pool(job *j)
{
    const ls_op *op = j->s.cmd->op;
    const ls_tensor_desc *state = ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state);
    int64_t dims[LS_OP_MAX_DIMS];
    int nd;
    const int64_t n = state ? elements(j, state, dims, &nd) : 0;
    if (n == 0) { /* a table entry with decode must name its state */
        j->failed = true;
        return 0.0;
    }
    const ls_tensor_desc prefilled = {.name = state->name, .dist = LS_DIST_NORMAL, .a = 0.1};
    j->requests = spec_size(&j->s, "B");
    j->n_pool = pool_copies(j, n);
    const int64_t all = j->n_pool * n;
    if (j->s.pool > 0) { /* a half pool: the same draws rounded once, not kept in float32 */
        const uint64_t seed = next_seed(j);
        j->pool = buffer(j, (double)all * 2.0);
        float *draws = j->pool ? malloc((size_t)all * sizeof *draws) : NULL;
        j->failed = j->failed || (j->pool && !draws);
        if (draws) {
            ls_op_fill(&prefilled, draws, all, dims, nd, seed);
            ls_state_narrow((linseq_pool_dtype)j->s.pool, draws, j->pool, all);
        }
        free(draws);
    } else {
        j->pool = tensor(j, &prefilled, all, dims, nd);
    }
    j->rows = buffer(j, (double)(j->n_pool * j->requests) * sizeof(int64_t));
    if (j->rows)
        for (int64_t r = 0; r < j->n_pool * j->requests; r++) j->rows[r] = r;
    return (double)n;
}

static void job_free(job *j)
{
    for (int i = 0; i < j->n_buf; i++) free(j->buf[i]);
    j->n_buf = 0;
    free(j->problem);
    j->problem = NULL;
}

/* The problem, the tensors in the order that seeds them (inputs, outputs, upstream
 * gradients, gradients, decode's pool) and the counts of README "Benchmarks": every input
 * read once and every output written once; decode reads and writes its state; a training
 * step is 3 x the forward's FLOPs and reads the inputs 3 times and writes or reads its
 * output twice (o, then d_o), its gradients counted as the inputs' third pass. */
static void job_setup(job *j)
{
    const ls_op *op = j->s.cmd->op;
    const run_kind kind = j->s.cmd->kind;
    j->n_tensors = 0;
    j->alloc_bytes = 0.0;
    memset(j->problem, 0, op->problem_size);
    memset(j->out, 0, sizeof j->out);
    memset(j->upstream, 0, sizeof j->upstream);
    memset(j->grads, 0, sizeof j->grads);
    spec_problem(&j->s, j->problem);
    j->ex = (linseq_exec){.threads = j->s.threads, .dtype = j->s.dtype, .products = j->s.products};
    if (has_modes(&j->s)) {
        j->ex.mode = j->s.mode;
        j->ex.chunk_size = j->s.chunk;
    }
    const double in = setup_role(j, LS_ROLE_INPUT), out = setup_role(j, LS_ROLE_OUTPUT);
    j->tokens = (double)spec_size(&j->s, "B") * (double)(spec_size(&j->s, "T"));
    j->flops = op->flops(j->problem, &j->ex);
    j->bytes = in + out;
    if (kind == RUN_FWDBWD) {
        setup_role(j, LS_ROLE_UPSTREAM);
        setup_role(j, LS_ROLE_GRAD);
        j->flops *= 3.0;
        j->bytes = 3.0 * in + 2.0 * out;
        if (op->saved_size && op->saved_size(j->problem, &j->ex, &j->saved_bytes) != LINSEQ_OK)
            j->failed = true;
        else if (op->saved_size)
            j->saved = buffer(j, (double)j->saved_bytes);
    } else if (kind == RUN_DECODE) {
        /* One step of the recurrence per request. */
        const linseq_exec step = {.threads = j->s.threads, .mode = LINSEQ_MODE_RECURRENT};
        j->flops = op->flops(j->problem, &step);
        const double state_bytes = j->s.pool > 0 ? 2.0 : 4.0;
        j->bytes += state_bytes * 2.0 * setup_pool(j);
    }
}

/* Allocates and fills; LS_EXIT_OK or a one-line report. */
static int job_prepare(job *j, const spec *s, int pool_mib)
{
    memset(j, 0, sizeof *j);
    j->s = *s;
    j->pool_mib = pool_mib;
    j->problem = calloc(1, s->cmd->op->problem_size);
    if (!j->problem) {
        fprintf(stderr, "linseq bench: out of memory\n");
        return LS_EXIT_ERROR;
    }
    j->dry = true;
    job_setup(j);
    const double need = j->alloc_bytes;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    /* Overcommit would let a huge shape "allocate" and then be killed while filling. */
    if (pages > 0 && page > 0 && need > 0.9 * (double)pages * (double)page) {
        fprintf(stderr, "linseq bench: %s needs %.1f GiB, more than this machine's memory\n",
                s->cmd->name, need / 1073741824.0);
        job_free(j);
        return LS_EXIT_ERROR;
    }
    j->dry = false;
    job_setup(j);
    if (j->failed) {
        fprintf(stderr, "linseq bench: cannot allocate %.1f GiB for %s\n", need / 1073741824.0,
                s->cmd->name);
        job_free(j);
        return LS_EXIT_ERROR;
    }
    return LS_EXIT_OK;
}

static linseq_status job_run(job *j)
{
    const ls_op *op = j->s.cmd->op;
    const void *p = j->problem;
    linseq_status st;
    switch (j->s.cmd->kind) {
    case RUN_FORWARD: return op->forward(p, &j->ex, j->out);
    case RUN_FWDBWD:
        if (op->forward_train) { /* the forward keeps what its backward needs */
            st = op->forward_train(p, &j->ex, j->out, j->saved, j->saved_bytes);
            return st != LINSEQ_OK ? st
                                   : op->backward_saved(p, &j->ex, j->saved, j->saved_bytes,
                                                        j->upstream, j->grads);
        }
        st = op->forward(p, &j->ex, j->out);
        return st != LINSEQ_OK ? st : op->backward(p, &j->ex, j->upstream, j->grads);
    default: {
        const int64_t c = j->next++ % j->n_pool, B = j->requests;
        if (j->s.pool >= 0) {
            const linseq_state_pool pool = {.data = j->pool,
                                            .n_rows = j->n_pool * B,
                                            .dtype = (linseq_pool_dtype)j->s.pool,
                                            .src_rows = j->rows + c * B};
            return linseq_op_decode_pool(op->name, p, &j->ex, &pool, j->out);
        }
        return op->decode(p, &j->ex, j->pool, j->n_pool * B, j->rows + c * B, j->out);
    }
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
    fprintf(stderr, "linseq bench: %s failed: %s (%s)\n", j->s.cmd->name, linseq_last_error(),
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

/* One thread's FMA chains: item t of the peak measurement. */
typedef struct {
    fma_fn fn;
    int64_t iters;
    float mul, add;
    double *flops; /* per item */
} fma_run;

static void fma_item(void *ctx, int64_t t, int thread)
{
    (void)thread;
    const fma_run *r = ctx;
    r->flops[t] = r->fn(r->iters, r->mul, r->add);
}

/* Best of `trials` runs of the FMA chains on `threads` threads at once (the library's own
 * pool, which the calls use too), GFLOP/s in all. */
static double measure_fma(int threads, int trials)
{
    fma_run run = {.fn = LS_ISA_PICK(ls_isa_active(), ls_peak_fma),
                   .mul = 0.999999f,
                   .add = 1e-7f,
                   .iters = 1 << 12};
    run.flops = calloc((size_t)threads, sizeof(double));
    if (!run.flops) return 0.0;
    for (;;) { /* about PEAK_TRIAL_S per run; also ramps the clock up */
        const double t0 = now_s();
        run.fn(run.iters, run.mul, run.add);
        if (now_s() - t0 > PEAK_TRIAL_S || run.iters > ((int64_t)1 << 40)) break;
        run.iters *= 2;
    }
    double best = 0.0;
    for (int r = 0; r < trials; r++) {
        const double t0 = now_s();
        ls_parallel_for_static(threads, threads, fma_item, &run);
        const double seconds = now_s() - t0;
        double flops = 0.0;
        for (int t = 0; t < threads; t++) flops += run.flops[t];
        if (flops / seconds > best) best = flops / seconds;
    }
    free(run.flops);
    return best * 1e-9;
}

/* One thread's slice of the triad (item id of nt), or its first touch of the pages. */
typedef struct {
    triad_fn fn;
    float *a, *b, *c;
    int64_t n;
    int nt;
    bool touch;
} triad_run;

static void triad_item(void *ctx, int64_t id, int thread)
{
    (void)thread;
    const triad_run *r = ctx;
    /* Slices of whole cache lines. */
    const int64_t per = (r->n / r->nt + 15) / 16 * 16;
    const int64_t lo = id * per < r->n ? id * per : r->n, hi = lo + per < r->n ? lo + per : r->n;
    if (r->touch) {
        for (int64_t i = lo; i < hi; i++) r->a[i] = 0.0f, r->b[i] = 1.0f, r->c[i] = 2.0f;
    } else {
        r->fn(hi - lo, r->a + lo, r->b + lo, r->c + lo, 0.5f);
    }
}

/* Best of `trials` triads over 3 arrays of `mib` MiB, GB/s counting 12 bytes per element
 * (2 reads, 1 write; like STREAM, and like the op byte counts, no write-allocate traffic).
 * Each thread streams the slice it first touched (the pool's static split gives thread t
 * slice t whenever t is running). */
static double measure_triad(int threads, int mib, int trials)
{
    const int64_t n = (int64_t)mib * (1 << 20) / (int64_t)sizeof(float);
    const size_t bytes = (size_t)n * sizeof(float);
    triad_run run = {.fn = LS_ISA_PICK(ls_isa_active(), ls_peak_triad), .n = n, .nt = threads};
    float *a = run.a = aligned_alloc(64, bytes), *b = run.b = aligned_alloc(64, bytes);
    float *c = run.c = aligned_alloc(64, bytes);
    double best = 0.0;
    if (!a || !b || !c) goto out;
    for (int r = -1; r < trials; r++) { /* r = -1 touches the pages first */
        run.touch = r < 0;
        const double t0 = now_s();
        ls_parallel_for_static(threads, threads, triad_item, &run);
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
        fprintf(stderr,
                "linseq bench: note: no memory for 3 arrays of %d MiB; bandwidth "
                "fractions left out\n",
                mib);
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
    const char *decay; /* "channel" or "head" for ops with a decay, else NULL */
    timing tm;
    double tokens, flops, bytes;
    int64_t n_pool; /* decode: copies of the states cycled through; 0 otherwise */
    const peak *pk; /* NULL with --no-peak */
} result;

static const char *mode_name(const spec *s)
{
    if (!has_modes(s)) return NULL;
    return s->mode == LINSEQ_MODE_RECURRENT ? "recurrent" : "chunked";
}

/* --decay's spelling of a problem's decay; NULL for ops without one. */
static const char *decay_text(const spec *s, const void *p)
{
    const int decay = spec_decay(s, p);
    if (decay < 0) return NULL;
    if (decay == LINSEQ_DECAY_PER_HEAD) return "head";
    if (decay == LINSEQ_DECAY_PER_CHANNEL) return "channel";
    return ls_enum_value_name(decay_option(s->cmd->op), decay);
}

/* "B=1 T=2048 H=16 K=128 V=128": the sizes the benchmark varies, in the table's order
 * (with T, 1 for decode). */
static void shape_text(const spec *s, char *buf, size_t n)
{
    const ls_op *op = s->cmd->op;
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < op->n_sizes && at < n; i++)
        if (op->sizes[i].bench_default > 0)
            at += (size_t)snprintf(buf + at, n - at, "%s%s=%" PRId64, at ? " " : "",
                                   op->sizes[i].name, s->size[i]);
}

/* "kda chunked-64 B=1 T=2048 H=16 K=128 V=128 per-channel" */
static void label_text(const result *r, char *buf, size_t n)
{
    const spec *s = &r->s;
    char shape[256], mode[32] = "", decay[32] = "";
    shape_text(s, shape, sizeof shape);
    if (mode_name(s) && s->mode == LINSEQ_MODE_CHUNKED)
        snprintf(mode, sizeof mode, " chunked-%d", s->chunk);
    else if (mode_name(s))
        snprintf(mode, sizeof mode, " recurrent");
    if (r->decay) snprintf(decay, sizeof decay, " per-%s", r->decay);
    static const char *const pool_names[] = {" f32-pool", " bf16-pool", " f16-pool"};
    snprintf(buf, n, "%s%s %s%s%s%s%s%s", s->cmd->name, mode, shape, decay,
             s->dtype == LINSEQ_DTYPE_BF16 ? " bf16" : "",
             s->products == LINSEQ_PRODUCTS_BF16 ? " bf16-products" : "",
             s->pool >= 0 ? pool_names[s->pool] : "", s->tap_major ? " tap-major" : "");
}

/* Fewer CPU-seconds than threads x wall time: some thread waited for a processor, and the
 * timing says more about the machine's other load than about the kernel. The calling thread
 * is checked on its own too: the pool's idle threads spin briefly, so a 1-thread run can show
 * two processors busy while its one working thread waits. */
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
    const ls_op *op = s->cmd->op;
    printf("{\"op\": \"%s\"", s->cmd->name);
    if (case_name) printf(", \"case\": \"%s\"", case_name);
    printf(", \"shape\": {");
    for (int i = 0, first = 1; i < op->n_sizes; i++)
        if (op->sizes[i].bench_default > 0) {
            printf("%s\"%s\": %" PRId64, first ? "" : ", ", op->sizes[i].name, s->size[i]);
            first = 0;
        }
    printf("}");
    if (mode_name(s) && s->mode == LINSEQ_MODE_CHUNKED)
        printf(", \"mode\": \"chunked\", \"chunk_size\": %d", s->chunk);
    else if (mode_name(s))
        printf(", \"mode\": \"recurrent\", \"chunk_size\": null");
    else
        printf(", \"mode\": null, \"chunk_size\": null");
    if (r->decay)
        printf(", \"decay\": \"%s\"", r->decay);
    else
        printf(", \"decay\": null");
    printf(", \"dtype\": \"%s\"", s->dtype == LINSEQ_DTYPE_BF16 ? "bf16" : "f32");
    printf(", \"products\": \"%s\"", s->products == LINSEQ_PRODUCTS_BF16 ? "bf16" : "f32");
    static const char *const pool_names[] = {"\"f32\"", "\"bf16\"", "\"f16\""};
    printf(", \"pool\": %s", s->pool >= 0 ? pool_names[s->pool] : "null");
    printf(", \"tap_major\": %s", s->tap_major ? "true" : "false");
    printf(", \"threads\": %d, \"isa\": \"%s\", \"repeats\": %d, \"warmup\": %d", s->threads,
           linseq_isa(), r->tm.repeats, r->tm.warmup);
    printf(", \"median_s\": %.9g, \"min_s\": %.9g, \"max_s\": %.9g", r->tm.median, r->tm.min,
           r->tm.max);
    printf(", \"tokens\": %.17g, \"tokens_per_s\": %.9g, \"us_per_token\": %.9g", r->tokens,
           r->tokens / r->tm.median, r->tm.median / r->tokens * 1e6);
    printf(", \"flops\": %.17g, \"gflops\": %.9g, \"bytes\": %.17g, \"gbytes_per_s\": %.9g",
           r->flops, gflops(r), r->bytes, gbs(r));
    printf(", \"cpus_busy\": %.4g, \"contended\": %s, \"busy_processes\": %d", r->tm.cpus_busy,
           contended(r) ? "true" : "false", contend_running());
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
    char label[512]; /* name, mode, a 256-byte shape, decay, dtype, products, pool, layout */
    label_text(r, label, sizeof label);
    printf("%s, %d thread%s, isa %s", label, r->s.threads, r->s.threads == 1 ? "" : "s",
           linseq_isa());
    if (contend_running()) printf(", beside %d busy processes (--contend)", contend_running());
    printf("\n");
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
    *r = (result){.s = *s,
                  .decay = decay_text(s, j.problem),
                  .tokens = j.tokens,
                  .flops = j.flops,
                  .bytes = j.bytes,
                  .n_pool = j.n_pool,
                  .pk = pk};
    rc = time_job(&j, set, &r->tm);
    job_free(&j);
    return rc;
}

/* ---------------------------------------------------------------------------------- */
/* peak                                                                               */
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

/* ---------------------------------------------------------------------------------- */
/* Options                                                                            */
/* ---------------------------------------------------------------------------------- */

/* What an option applies to: op commands (further limited by the op, below), peak, suite. */
#define FOR_OP 1u
#define FOR_PEAK 2u
#define FOR_SUITE 4u
#define FOR_ALL (FOR_OP | FOR_PEAK | FOR_SUITE)

typedef enum opt_id {
    O_SIZE,
    O_MODE,
    O_CHUNK,
    O_DECAY,
    O_THREADS,
    O_REPEATS,
    O_WARMUP,
    O_MIB,
    O_JSON,
    O_NO_PEAK,
    O_COLD,
    O_CONTEND,
    O_DTYPE,
    O_PRODUCTS,
    O_POOL,
    O_TAP_MAJOR
} opt_id;

typedef struct option_def {
    const char *name;
    opt_id id;
    unsigned applies;
    bool flag;
} option_def;

/* Besides these, --NAME for each size of the table an op's benchmark varies (--B, --T...). */
static const option_def options[] = {
    {"--mode", O_MODE, FOR_OP, false},
    {"--chunk-size", O_CHUNK, FOR_OP, false},
    {"--decay", O_DECAY, FOR_OP, false},
    {"--threads", O_THREADS, FOR_ALL, false},
    {"--repeats", O_REPEATS, FOR_ALL, false},
    {"--warmup", O_WARMUP, FOR_OP | FOR_SUITE, false},
    {"--mib", O_MIB, FOR_ALL, false},
    {"--json", O_JSON, FOR_ALL, true},
    {"--no-peak", O_NO_PEAK, FOR_OP | FOR_SUITE, true},
    {"--cold", O_COLD, FOR_OP, true},
    {"--contend", O_CONTEND, FOR_ALL, false},
    {"--dtype", O_DTYPE, FOR_OP, false},
    {"--products", O_PRODUCTS, FOR_OP, false},
    {"--pool", O_POOL, FOR_OP, false},
    {"--tap-major", O_TAP_MAJOR, FOR_OP, true},
};

/* The option named by a[0 .. len): a fixed one, or a size option (*size: the size's name);
 * NULL when none is. */
static const option_def *find_option(const char *a, size_t len, const char **size)
{
    static const option_def size_option = {"--size", O_SIZE, FOR_OP, false};
    for (size_t k = 0; k < sizeof options / sizeof options[0]; k++)
        if (strlen(options[k].name) == len && strncmp(a, options[k].name, len) == 0)
            return &options[k];
    int n;
    const command *c = commands(&n);
    for (int i = 0; len > 2 && strncmp(a, "--", 2) == 0 && i < n; i++)
        for (int k = 0; k < c[i].op->n_sizes; k++) {
            const char *name = c[i].op->sizes[k].name;
            if (bench_size(&c[i], k) && strlen(name) == len - 2 &&
                strncmp(a + 2, name, len - 2) == 0) {
                *size = name;
                return &size_option;
            }
        }
    return NULL;
}

/* The index of the size option `name` in c's op, or -1 when its benchmark has no such size. */
static int size_index(const command *c, const char *name)
{
    for (int k = 0; k < c->op->n_sizes; k++)
        if (bench_size(c, k) && strcmp(c->op->sizes[k].name, name) == 0) return k;
    return -1;
}

static bool option_applies(const option_def *o, const char *size, const command *c, unsigned target)
{
    if (!(o->applies & target)) return false;
    if (target != FOR_OP) return true;
    switch (o->id) {
    case O_SIZE: return size_index(c, size) >= 0;
    case O_MODE:
    case O_CHUNK: return c->op->has_modes && c->kind != RUN_DECODE;
    case O_DECAY: return decay_option(c->op) != NULL;
    case O_COLD:
    case O_POOL: return c->kind == RUN_DECODE;
    case O_TAP_MAJOR: return state_tap_major_option(c->op) != NULL;
    default: return true;
    }
}

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

static int set_value(const option_def *o, const char *size, const char *v, spec *s, settings *set)
{
    int64_t x = 0;
    switch (o->id) {
    case O_SIZE:
        if (!parse_i64(v, 1, MAX_SIZE, &x))
            return usage_fail("--%s: '%s' is not a size from 1 to 2^31", size, v);
        s->size[size_index(s->cmd, size)] = x;
        return LS_EXIT_OK;
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
    case O_CONTEND:
        if (!parse_i64(v, 0, CONTEND_MAX, &x))
            return usage_fail("--contend: '%s' is not a count from 0 to %d", v, CONTEND_MAX);
        set->contend = (int)x;
        return LS_EXIT_OK;
    case O_DTYPE:
        if (strcmp(v, "f32") == 0 || strcmp(v, "float32") == 0)
            s->dtype = LINSEQ_DTYPE_F32;
        else if (strcmp(v, "bf16") == 0 || strcmp(v, "bfloat16") == 0)
            s->dtype = LINSEQ_DTYPE_BF16;
        else
            return usage_fail("--dtype: '%s' is not f32 or bf16", v);
        return LS_EXIT_OK;
    case O_PRODUCTS:
        if (strcmp(v, "f32") == 0 || strcmp(v, "bf16") == 0)
            s->products = v[0] == 'b' ? LINSEQ_PRODUCTS_BF16 : LINSEQ_PRODUCTS_F32;
        else
            return usage_fail("--products: '%s' is not f32 or bf16", v);
        return LS_EXIT_OK;
    case O_POOL:
        if (strcmp(v, "f32") == 0 || strcmp(v, "bf16") == 0 || strcmp(v, "f16") == 0)
            s->pool = v[0] == 'b'   ? LINSEQ_POOL_BF16
                      : v[1] == '1' ? LINSEQ_POOL_F16
                                    : LINSEQ_POOL_F32;
        else
            return usage_fail("--pool: '%s' is not f32, bf16 or f16", v);
        return LS_EXIT_OK;
    default: return LS_EXIT_OK;
    }
}

#define PARSED_HELP (-1)

/* args[0 .. n) after the command `what` (s->cmd for an op, else NULL) into s and set:
 * LS_EXIT_OK, PARSED_HELP for --help, or a usage error. */
static int parse_options(int n, char **args, const char *what, unsigned target, spec *s,
                         settings *set)
{
    for (int i = 0; i < n; i++) {
        const char *a = args[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return PARSED_HELP;
        const char *eq = strchr(a, '=');
        const size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const char *size = NULL;
        const option_def *o = find_option(a, len, &size);
        if (!o) {
            if (a[0] != '-') return usage_fail("%s takes no operand '%s'", what, a);
            return usage_fail("unknown option '%s'", a);
        }
        if (!option_applies(o, size, s->cmd, target))
            return usage_fail("option '%.*s' does not apply to %s", (int)len, a, what);
        if (o->flag) {
            if (eq) return usage_fail("option '%s' takes no value", o->name);
            if (o->id == O_JSON) set->json = true;
            if (o->id == O_NO_PEAK) set->no_peak = true;
            if (o->id == O_COLD) set->cold = true;
            if (o->id == O_TAP_MAJOR) s->tap_major = true;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < n ? args[++i] : NULL;
        if (!v) return usage_fail("option '%.*s' needs a value", (int)len, a);
        const int rc = set_value(o, size, v, s, set);
        if (rc != LS_EXIT_OK) return rc;
    }
    return LS_EXIT_OK;
}

/* Every tensor's element count must fit comfortably in int64 and size_t arithmetic. */
static bool shape_fits(const spec *s)
{
    const ls_op *op = s->cmd->op;
    void *p = calloc(1, op->problem_size);
    bool fits = p != NULL;
    if (p) spec_problem(s, p);
    for (int i = 0; fits && i < op->n_tensors; i++) {
        int64_t n;
        fits = ls_tensor_count(&op->tensors[i], p, &n) && n < ((int64_t)1 << 60);
    }
    free(p);
    return fits;
}

/* ---------------------------------------------------------------------------------- */
/* suite                                                                              */
/* ---------------------------------------------------------------------------------- */

typedef enum note { NONE, US_PER_TOKEN, FWD_RATIO, SCALING } note;

typedef struct suite_case {
    const char *name;
    const char *args; /* the command line after `linseq bench`; --threads: else all */
    note what;
    int ref; /* the case a FWD_RATIO or SCALING note compares with */
} suite_case;

#define KDA128 "--K 128 --V 128"
/* The standard shapes. KDA: per-channel decay, chunk 64; SSM1: N = 16; conv: W = 4.
 * The 1-thread runs come last and refer to their all-thread twins for the scaling. */
static const suite_case suite_cases[] = {
    /*  0 */ {"KDA fwd chunked B=1 H=16 T=4096 K=V=128", "kda --B 1 --T 4096 --H 16 " KDA128, NONE,
              0},
    /*  1 */
    {"KDA fwd chunked B=4 H=16 T=2048 K=V=128", "kda --B 4 --T 2048 --H 16 " KDA128, NONE, 0},
    /*  2 */
    {"KDA fwd chunked B=1 H=32 T=1024 K=V=128", "kda --B 1 --T 1024 --H 32 " KDA128, NONE, 0},
    /*  3 */
    {"KDA fwd chunked B=8 H=8 T=1024 K=V=64", "kda --B 8 --T 1024 --H 8 --K 64 --V 64", NONE, 0},
    /*  4 */
    {"KDA fwd recurrent B=1 H=32 T=512 K=V=128",
     "kda --B 1 --T 512 --H 32 " KDA128 " --mode recurrent", NONE, 0},
    /*  5 */
    {"KDA fwd chunked B=1 H=32 T=512 K=V=128", "kda --B 1 --T 512 --H 32 " KDA128, NONE, 0},
    /*  6 */
    {"KDA fwd chunked B=1 H=1 T=4096 K=V=128", "kda --B 1 --T 4096 --H 1 " KDA128 " --threads 1",
     US_PER_TOKEN, 0},
    /*  7 */ {"KDA decode B=1 H=32 K=V=128", "kda-decode --B 1 --H 32 " KDA128, NONE, 0},
    /*  8 */ {"KDA decode B=8 H=32 K=V=128", "kda-decode --B 8 --H 32 " KDA128, NONE, 0},
    /*  9 */ {"KDA decode B=32 H=32 K=V=128", "kda-decode --B 32 --H 32 " KDA128, NONE, 0},
    /* 10 */
    {"KDA fwd chunked B=1 H=16 T=2048 K=V=128", "kda --B 1 --T 2048 --H 16 " KDA128, NONE, 0},
    /* 11 */
    {"KDA fwd+bwd chunked B=1 H=16 T=2048 K=V=128", "kda-fwdbwd --B 1 --T 2048 --H 16 " KDA128,
     FWD_RATIO, 10},
    /* 12 */ {"SSM1 fwd D=1536 T=2048", "ssm1 --B 1 --T 2048 --D 1536", NONE, 0},
    /* 13 */ {"SSM1 fwd+bwd D=1536 T=2048", "ssm1-fwdbwd --B 1 --T 2048 --D 1536", FWD_RATIO, 12},
    /* 14 */ {"SSM1 decode B=1 D=1536", "ssm1-decode --B 1 --D 1536", NONE, 0},
    /* 15 */ {"SSM1 fwd D=4096 T=2048", "ssm1 --B 1 --T 2048 --D 4096", NONE, 0},
    /* 16 */ {"SSM1 fwd+bwd D=4096 T=2048", "ssm1-fwdbwd --B 1 --T 2048 --D 4096", FWD_RATIO, 15},
    /* 17 */ {"SSM1 decode B=1 D=4096", "ssm1-decode --B 1 --D 4096", NONE, 0},
    /* 18 */ {"SSM1 fwd D=4096 T=512", "ssm1 --B 1 --T 512 --D 4096", NONE, 0},
    /* 19 */ {"SSM1 fwd D=1536 T=512", "ssm1 --B 1 --T 512 --D 1536", NONE, 0},
    /* 20 */ {"conv D=4096 T=2048", "conv --B 1 --T 2048 --D 4096", NONE, 0},
    /* 21 */ {"conv D=4096 T=512", "conv --B 1 --T 512 --D 4096", NONE, 0},
    /* 22 */
    {"KDA fwd chunked B=1 H=16 T=4096 K=V=128", "kda --B 1 --T 4096 --H 16 " KDA128 " --threads 1",
     SCALING, 0},
    /* 23 */
    {"KDA fwd+bwd chunked B=1 H=16 T=2048 K=V=128",
     "kda-fwdbwd --B 1 --T 2048 --H 16 " KDA128 " --threads 1", SCALING, 11},
    /* 24 */ {"SSM1 fwd D=4096 T=2048", "ssm1 --B 1 --T 2048 --D 4096 --threads 1", SCALING, 15},
    /* 25 */
    {"SSM1 fwd+bwd D=4096 T=2048", "ssm1-fwdbwd --B 1 --T 2048 --D 4096 --threads 1", SCALING, 16},
    /* 26 */ {"conv D=4096 T=2048", "conv --B 1 --T 2048 --D 4096 --threads 1", SCALING, 20},
};
#undef KDA128
#define N_SUITE ((int)(sizeof suite_cases / sizeof suite_cases[0]))

/* A suite case's spec, its threads `threads` unless it names its own. */
static int suite_spec(const suite_case *c, int threads, spec *s)
{
    char line[256], *args[32];
    int n = 0;
    snprintf(line, sizeof line, "%s", c->args);
    char *save = NULL;
    for (char *tok = strtok_r(line, " ", &save); tok && n < 32; tok = strtok_r(NULL, " ", &save))
        args[n++] = tok;
    const command *cmd = n > 0 ? find_command(args[0]) : NULL;
    if (!cmd) return usage_fail("suite case '%s': no op '%s'", c->name, n > 0 ? args[0] : "");
    *s = default_spec(cmd);
    settings own = {.threads = 0};
    const int rc = parse_options(n - 1, args + 1, cmd->name, FOR_OP, s, &own);
    if (rc != LS_EXIT_OK) return LS_EXIT_ERROR;
    s->threads = own.threads > 0 ? own.threads : threads;
    return LS_EXIT_OK;
}

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

static void suite_header(const settings *set, int n)
{
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
}

static void suite_notes(const result *res)
{
    bool any_contended = false;
    for (int i = 0; i < N_SUITE; i++) any_contended |= contended(&res[i]);
    if (any_contended)
        printf("* fewer processors busy than threads while timing: another process was running\n");
    printf("\n");
    for (int i = 0; i < N_SUITE; i++) {
        const suite_case *c = &suite_cases[i];
        const result *r = &res[i], *ref = &res[c->ref];
        char text[96];
        if (c->what == US_PER_TOKEN)
            printf("%s, 1 thread: %.2f us per token\n", c->name, r->tm.median / r->tokens * 1e6);
        else if (c->what == FWD_RATIO)
            printf("%s: %.2fx the forward\n", c->name, r->tm.median / ref->tm.median);
        else if (c->what == SCALING)
            printf(
                "%s: %s\n", c->name,
                ls_speedup_text(r->tm.median, ref->tm.median, ref->s.threads, text, sizeof text));
    }
}

static int cmd_suite(const settings *set)
{
    const int n = set->threads > 0 ? set->threads : all_procs();
    result res[N_SUITE];
    spec specs[N_SUITE];
    for (int i = 0; i < N_SUITE; i++) /* every case parses before any runs */
        if (suite_spec(&suite_cases[i], n, &specs[i]) != LS_EXIT_OK) return LS_EXIT_ERROR;
    suite_header(set, n);
    for (int i = 0; i < N_SUITE; i++) {
        const suite_case *c = &suite_cases[i];
        const int rc = bench_one(&specs[i], set, &res[i]);
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
    if (!set->json) suite_notes(res);
    return LS_EXIT_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Usage                                                                              */
/* ---------------------------------------------------------------------------------- */

#define USAGE_WIDTH 92 /* columns of a usage line */

/* Writes word after *col columns of the current line, wrapping to column `indent`. */
static void usage_word(FILE *f, int *col, int indent, const char *word)
{
    const int len = (int)strlen(word);
    if (*col > indent && *col + 1 + len > USAGE_WIDTH) {
        *col = fprintf(f, "\n%*s", indent, "") - 1;
    } else if (*col > indent) {
        *col += fprintf(f, " ");
    }
    *col += fprintf(f, "%s", word);
}

/* "gate (kda_gate)": the command, and its op where the names differ. */
static void usage_name(const command *c, char *buf, size_t n)
{
    const char *base = c->op->bench_name ? c->op->bench_name : c->op->name;
    if (strcmp(base, c->op->name) != 0)
        snprintf(buf, n, "%s (%s)", c->name, c->op->name);
    else
        snprintf(buf, n, "%s", c->name);
}

/* "  kda-decode        --B --H --K --V --decay --cold": the options that apply to the
 * command, as option_applies decides; `width`: the widest name's columns. */
static void usage_command(FILE *f, const command *c, int width)
{
    char name[96], flag[64];
    usage_name(c, name, sizeof name);
    int col = fprintf(f, "        %-*s ", width, name);
    const int indent = col;
    for (int k = 0; k < c->op->n_sizes; k++) {
        snprintf(flag, sizeof flag, "--%s", c->op->sizes[k].name);
        if (bench_size(c, k)) usage_word(f, &col, indent, flag);
    }
    if (c->op->has_modes && c->kind != RUN_DECODE) {
        usage_word(f, &col, indent, "--mode");
        usage_word(f, &col, indent, "--chunk-size");
    }
    if (decay_option(c->op)) usage_word(f, &col, indent, "--decay");
    if (c->kind == RUN_DECODE) {
        usage_word(f, &col, indent, "--cold");
        usage_word(f, &col, indent, "--pool");
    }
    if (state_tap_major_option(c->op)) usage_word(f, &col, indent, "--tap-major");
    fputc('\n', f);
}

/* "  kda        B=1 T=2048 H=16 K=128 V=128, chunked, chunk 64, per-channel decay" */
static void usage_defaults(FILE *f, const command *c, int width)
{
    const spec s = default_spec(c);
    char name[96], shape[256], mode[32] = "", decay[48] = "";
    void *p = calloc(1, c->op->problem_size);
    if (!p) return;
    spec_problem(&s, p);
    usage_name(c, name, sizeof name);
    shape_text(&s, shape, sizeof shape);
    if (has_modes(&s)) snprintf(mode, sizeof mode, ", chunked, chunk %d", s.chunk);
    if (decay_text(&s, p)) snprintf(decay, sizeof decay, ", per-%s decay", decay_text(&s, p));
    fprintf(f, "        %-*s %s%s%s\n", width, name, shape, mode, decay);
    free(p);
}

const char *ls_speedup_text(double one_thread_s, double threads_s, int threads, char *buf, size_t n)
{
    const double speedup = one_thread_s / threads_s;
    const bool faster = speedup >= 1.0;
    snprintf(buf, n, "%.2fx %s on %d thread%s than on 1", faster ? speedup : 1.0 / speedup,
             faster ? "faster" : "slower", threads, threads == 1 ? "" : "s");
    return buf;
}

void ls_bench_usage(FILE *f)
{
    int n, width = 0;
    const command *c = commands(&n);
    for (int i = 0; i < n; i++) {
        char name[96];
        usage_name(&c[i], name, sizeof name);
        if ((int)strlen(name) > width) width = (int)strlen(name);
    }
    fputs(usage_head, f);
    for (int i = 0; i < n; i++) usage_command(f, &c[i], width + 1);
    fputs("      defaults (the benchmark's, from the op table):\n", f);
    for (int i = 0; i < n; i++)
        if (c[i].kind == RUN_FORWARD) usage_defaults(f, &c[i], width + 1);
    fputs(usage_tail, f);
}

/* "kda, kda-fwdbwd, ..., conv, peak or suite" */
static void command_list(char *buf, size_t n)
{
    int n_cmds;
    const command *c = commands(&n_cmds);
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n_cmds && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s, ", c[i].name);
    if (at < n) snprintf(buf + at, n - at, "peak or suite");
}

int cmd_bench(int argc, char **argv)
{
    char list[1024];
    command_list(list, sizeof list);
    if (argc < 3) return usage_fail("needs an op: %s", list);
    if (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) {
        ls_bench_usage(stdout);
        return LS_EXIT_OK;
    }
    const command *cmd = find_command(argv[2]);
    const unsigned target = cmd                             ? FOR_OP
                            : strcmp(argv[2], "peak") == 0  ? FOR_PEAK
                            : strcmp(argv[2], "suite") == 0 ? FOR_SUITE
                                                            : 0u;
    if (!target) return usage_fail("unknown op '%s'", argv[2]);

    spec s = cmd ? default_spec(cmd) : (spec){.cmd = NULL};
    settings set = {.threads = 0, .repeats = 0, .warmup = -1, .mib = 256};
    const int parsed = parse_options(argc - 3, argv + 3, argv[2], target, &s, &set);
    if (parsed == PARSED_HELP) {
        ls_bench_usage(stdout);
        return LS_EXIT_OK;
    }
    if (parsed != LS_EXIT_OK) return parsed;
    if (cmd && !shape_fits(&s)) return usage_fail("%s: the shape is too large", cmd->name);

    if (set.contend && !contend_start(set.contend)) {
        fprintf(stderr, "linseq bench: cannot start %d busy processes (--contend)\n", set.contend);
        return LS_EXIT_ERROR;
    }
    if (target == FOR_PEAK) return cmd_peak(&set);
    if (target == FOR_SUITE) return cmd_suite(&set);

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
