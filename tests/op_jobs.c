/* The job catalog: every call of every op of the op table, and some calls again in the
 * configurations whose thread splits differ.
 *
 * From the table alone, each op gets a job per call it offers: the forward, the backward, the
 * training step (forward_train, then backward_saved) and one decode step, each on the
 * benchmark's options at small sizes; a new op, forward-only or without decode included,
 * is in the catalog with no line here. The hand-written specs add the configurations that
 * matter to the thread splits (several items, one wide KDA item whose state columns are
 * split, GVA, packed sequences, sums over the batch, a decode pool with a padding request);
 * each must name an op of the table and a call it offers.
 *
 * A job is built from its op's table entry: the sizes and options of its spec (by the
 * table's names), realistic inputs and upstream gradients drawn by ls_op_fill for every
 * tensor the problem has, and as outputs every output (forward) or gradient (backward) the
 * table lists. */
#include "op_jobs.h"

#include <stdlib.h>
#include <string.h>

#include "optable/optable.h"
#include "testutil.h"

typedef enum { J_FORWARD, J_BACKWARD, J_TRAINING, J_DECODE, J_KINDS } job_kind;
static const char *const kind_name[J_KINDS] = {"forward", "backward", "training", "decode"};

enum { JOB_MAX_OWNED = 24, JOB_PROBLEM_BYTES = 512 };

typedef struct job_spec {
    const char *op, *label;
    job_kind kind;
    /* "B=2 T=37 decay=per_channel ...": the table's size and option names; NULL: the
     * benchmark's options at small sizes (small_problem) */
    const char *setup;
    linseq_mode mode;
    int chunk;
    const int64_t *cu; /* packed sequences, or NULL */
    int64_t n_seqs;
} job_spec;

struct job {
    char name[96];
    const ls_op *op;
    job_kind kind;
    linseq_exec exec;
    _Alignas(max_align_t) unsigned char problem[JOB_PROBLEM_BYTES];
    const float *up[LS_OP_MAX_OUT]; /* upstream gradients, by call argument */
    int n_out;
    const char *out_name[JOB_MAX_OUT];
    size_t out_len[JOB_MAX_OUT];
    const ls_tensor_desc *out_desc[JOB_MAX_OUT];
    const float *pool0; /* decode: the state pool before the step */
    int64_t pool_rows;
    const int64_t *rows;
    void *owned[JOB_MAX_OWNED];
    int n_owned;
};

static const int64_t CU3[4] = {0, 13, 50, 64};
static const int64_t CU_SSM[4] = {0, 30, 31, 90};

/* KDA: per-channel decay with the gate in the kernel, l2norm, GVA, two sequences (8 items);
 * per-head decay, V-first states, three packed sequences of 13, 37 and 14 tokens; one
 * sequence and head with V = 96, whose state columns the threads split. */
#define KDA_GATED "B=2 T=37 H=2 HV=4 K=16 V=24 decay=per_channel use_qk_l2norm=1 gate_in_kernel=1"
#define KDA_VARLEN "B=1 T=64 H=2 HV=4 K=16 V=24 decay=per_head state_v_first=1"
#define KDA_WIDE "B=1 T=150 H=1 HV=1 K=32 V=96 decay=per_channel use_qk_l2norm=1"
#define REC LINSEQ_MODE_RECURRENT
#define CHUNKED LINSEQ_MODE_CHUNKED

static const job_spec specs[] = {
    {"kda", "forward recurrent (gate in kernel)", J_FORWARD, KDA_GATED, REC, 0, NULL, 0},
    {"kda", "forward chunked 16 (gate in kernel)", J_FORWARD, KDA_GATED, CHUNKED, 16, NULL, 0},
    {"kda", "forward chunked 32 (varlen, per head, V-first)", J_FORWARD, KDA_VARLEN, CHUNKED, 32,
     CU3, 3},
    {"kda", "forward chunked 64 (one wide item)", J_FORWARD, KDA_WIDE, CHUNKED, 64, NULL, 0},
    {"kda", "forward recurrent (one wide item)", J_FORWARD, KDA_WIDE, REC, 0, NULL, 0},
    {"kda", "backward chunked 16 (gate in kernel)", J_BACKWARD, KDA_GATED, CHUNKED, 16, NULL, 0},
    {"kda", "backward recurrent (varlen, per head, V-first)", J_BACKWARD, KDA_VARLEN, REC, 16, CU3,
     3},
    {"kda", "decode (pool of 5, a padding request)", J_DECODE,
     "B=3 T=1 H=2 HV=4 K=16 V=24 decay=per_channel use_qk_l2norm=1", REC, 0, NULL, 0},
    {"kda", "training chunked 32 (gate in kernel)", J_TRAINING, KDA_GATED, CHUNKED, 32, NULL, 0},
    {"kda", "training recurrent (varlen)", J_TRAINING, KDA_VARLEN, REC, 16, CU3, 3},
    {"kda_gate", "forward (per channel)", J_FORWARD, "B=2 T=33 H=4 K=64 decay=per_channel", 0, 0,
     NULL, 0},
    {"kda_gate", "backward (per head, lower bound)", J_BACKWARD,
     "B=3 T=50 H=6 K=64 decay=per_head lower_bound=-3", 0, 0, NULL, 0},
    {"ssm1", "forward (3 packed sequences)", J_FORWARD, "B=1 T=90 D=200 N=8 G=2 dt_softplus=1", 0,
     0, CU_SSM, 3},
    {"ssm1", "backward (batch of 2, 70 tokens)", J_BACKWARD, "B=2 T=70 D=130 N=8 G=2 dt_softplus=1",
     0, 0, NULL, 0},
    {"ssm1", "training (3 packed sequences)", J_TRAINING, "B=1 T=90 D=200 N=8 G=2 dt_softplus=1", 0,
     0, CU_SSM, 3},
    {"causal_conv1d", "forward (batch of 2)", J_FORWARD, "B=2 T=100 D=300 W=4 activation=silu", 0,
     0, NULL, 0},
    {"causal_conv1d", "backward (3 packed sequences)", J_BACKWARD,
     "B=1 T=90 D=200 W=4 activation=silu", 0, 0, CU_SSM, 3},
    /* vLLM's layouts: [N,W-1,D] states, a [W,D] weight */
    {"causal_conv1d", "forward (tap-major states and weight)", J_FORWARD,
     "B=2 T=100 D=300 W=4 activation=silu state_tap_major=1 weight_tap_major=1", 0, 0, NULL, 0},
    {"causal_conv1d", "backward (tap-major states, 3 packed sequences)", J_BACKWARD,
     "B=1 T=90 D=200 W=4 activation=silu state_tap_major=1", 0, 0, CU_SSM, 3},
    {"causal_conv1d", "decode (tap-major states and weight, a padding request)", J_DECODE,
     "B=3 T=1 D=300 W=4 activation=silu state_tap_major=1 weight_tap_major=1", 0, 0, NULL, 0},
};
#define N_SPECS ((int)(sizeof specs / sizeof specs[0]))

static __attribute__((noreturn)) void spec_error(const job_spec *s, const char *what)
{
    fprintf(stderr, "op_jobs: %s %s: %s\n", s->op, s->label, what);
    exit(2);
}

static void *own(job *j, void *p)
{
    if (j->n_owned == JOB_MAX_OWNED) abort();
    j->owned[j->n_owned++] = p;
    return p;
}

/* One "name=value" of a spec: a size, or an option by its meta.json key. */
static void set_field(const job_spec *s, job *j, const char *name, const char *value)
{
    const ls_op *op = j->op;
    for (int i = 0; i < op->n_sizes; i++)
        if (strcmp(op->sizes[i].name, name) == 0) {
            ls_size_set(&op->sizes[i], j->problem, strtoll(value, NULL, 10));
            return;
        }
    for (int i = 0; i < op->n_options; i++) {
        const ls_option_desc *o = &op->options[i];
        if (strcmp(o->key, name) != 0) continue;
        unsigned char *field = j->problem + o->offset;
        if (o->type == LS_CTYPE_BOOL) {
            const bool b = strcmp(value, "1") == 0;
            memcpy(field, &b, sizeof b);
        } else if (o->type == LS_CTYPE_F32) {
            const float f = strtof(value, NULL);
            memcpy(field, &f, sizeof f);
        } else {
            const ls_enum_name *n = o->names;
            while (n->name && strcmp(n->name, value) != 0) n++;
            if (!n->name) spec_error(s, value);
            memcpy(field, &n->value, sizeof n->value);
        }
        return;
    }
    spec_error(s, name);
}

static void parse_setup(const job_spec *s, job *j)
{
    char text[256], *save = NULL;
    snprintf(text, sizeof text, "%s", s->setup);
    for (char *tok = strtok_r(text, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) spec_error(s, tok);
        *eq = '\0';
        set_field(s, j, tok, eq + 1);
    }
}

/* Realistic values for every tensor of the problem of that role; returns how many. */
static int fill_role(job *j, ls_op_role role, uint64_t seed)
{
    int n = 0;
    for (int i = 0; ls_op_tensor(j->op, role, i); i++) {
        const ls_tensor_desc *t = ls_op_tensor(j->op, role, i);
        if (j->kind == J_DECODE && t->role == LS_ROLE_INPUT &&
            !strcmp(t->name, j->op->decode_state))
            continue; /* in the pool */
        int64_t dims[LS_OP_MAX_DIMS], count;
        const int nd = t->shape(j->problem, dims);
        if (!ls_tensor_count(t, j->problem, &count)) abort();
        if (count == 0) continue;
        float *x = own(j, tu_alloc((size_t)count));
        ls_op_fill(t, x, count, dims, nd, seed + (uint64_t)i);
        if (role == LS_ROLE_INPUT) ls_tensor_set(t, j->problem, x);
        if (role == LS_ROLE_UPSTREAM) j->up[t->offset] = x;
        n++;
    }
    return n;
}

/* Every tensor of that role the problem has becomes an output of the job. */
static void add_outputs(job *j, ls_op_role role)
{
    for (int i = 0; ls_op_tensor(j->op, role, i); i++) {
        const ls_tensor_desc *t = ls_op_tensor(j->op, role, i);
        int64_t count;
        if (!ls_tensor_count(t, j->problem, &count)) abort();
        if (count == 0) continue;
        if (j->n_out == JOB_MAX_OUT) abort();
        j->out_name[j->n_out] = t->name;
        j->out_desc[j->n_out] = t;
        j->out_len[j->n_out++] = (size_t)count;
    }
}

static const ls_size_desc *size_named(const ls_op *op, const char *name)
{
    for (int i = 0; i < op->n_sizes; i++)
        if (strcmp(op->sizes[i].name, name) == 0) return &op->sizes[i];
    return NULL;
}

/* The benchmark's options at small sizes (as test_optable and test_bench make them). */
static void small_problem(job *j)
{
    for (int i = 0; i < j->op->n_sizes; i++) {
        const int64_t d = j->op->sizes[i].bench_default;
        ls_size_set(&j->op->sizes[i], j->problem, d > 64 ? 8 + d % 23 : d);
    }
    if (j->op->bench_options) j->op->bench_options(j->problem);
}

/* Decode (optable.h): B requests, one token each (T = 1), their states rows of a pool shaped
 * like the input decode_state at B = 1, updated in place; the state input and cu_seqlens are
 * not given. The pool has B + 2 rows, request b on row B + 1 - b; a hand-written spec makes
 * request 1 a padding request (row -1: KDA's and SSM1's convention, which the table does not
 * state, so its own decode jobs have none). out[0] is the pool after the step, then every
 * output but the state. */
static void decode_setup(const job_spec *s, job *j, tu_rng *r)
{
    const ls_op *op = j->op;
    const ls_size_desc *B = size_named(op, "B"), *T = size_named(op, "T");
    const ls_tensor_desc *state = ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state);
    if (!B || !T || !state) spec_error(s, "decode needs sizes B and T and its state input");
    ls_size_set(T, j->problem, 1);
    ls_tensor_set(state, j->problem, NULL);
    if (op->varlen) ls_op_set_varlen(op, j->problem, NULL, 0);
    const int64_t requests = ls_size_get(B, j->problem);
    j->pool_rows = requests + 2;
    int64_t *rows = own(j, malloc((size_t)requests * sizeof *rows));
    for (int64_t b = 0; b < requests; b++) rows[b] = s->setup && b == 1 ? -1 : requests + 1 - b;
    j->rows = rows;
    unsigned char pool_shape[JOB_PROBLEM_BYTES];
    memcpy(pool_shape, j->problem, sizeof pool_shape);
    ls_size_set(B, pool_shape, j->pool_rows);
    int64_t n;
    if (!ls_tensor_count(state, pool_shape, &n) || n == 0) spec_error(s, "no decode state");
    float *pool = own(j, tu_alloc((size_t)n));
    tu_fill_uniform(r, pool, (size_t)n, -0.5, 0.5);
    j->pool0 = pool;
    j->out_name[0] = "state";
    j->out_len[0] = (size_t)n;
    j->n_out = 1;
    for (int i = 0; ls_op_tensor(op, LS_ROLE_OUTPUT, i); i++) {
        const ls_tensor_desc *t = ls_op_tensor(op, LS_ROLE_OUTPUT, i);
        if (strcmp(t->name, op->decode_state_out) == 0) continue;
        if (!ls_tensor_count(t, j->problem, &n)) abort();
        if (n == 0) continue;
        if (j->n_out == JOB_MAX_OUT) abort();
        j->out_name[j->n_out] = t->name;
        j->out_desc[j->n_out] = t;
        j->out_len[j->n_out++] = (size_t)n;
    }
}

/* Whether the op offers the call of that kind. */
static bool offers(const ls_op *op, job_kind kind)
{
    switch (kind) {
    case J_FORWARD: return true;
    case J_BACKWARD: return op->backward != NULL;
    case J_TRAINING: return op->forward_train != NULL;
    case J_DECODE: return op->decode != NULL;
    default: return false;
    }
}

static void job_make(job *j, const job_spec *s, uint64_t seed)
{
    memset(j, 0, sizeof *j);
    j->op = ls_op_find(s->op);
    if (!j->op) spec_error(s, "no such op in the op table");
    if (!offers(j->op, s->kind)) spec_error(s, "the op does not offer that call");
    if (j->op->problem_size > sizeof j->problem) spec_error(s, "problem struct too large");
    snprintf(j->name, sizeof j->name, "%s %s", s->op, s->label);
    j->kind = s->kind;
    j->exec = (linseq_exec){.mode = s->mode, .chunk_size = s->chunk};
    if (s->setup)
        parse_setup(s, j);
    else
        small_problem(j);
    if (s->cu) ls_op_set_varlen(j->op, j->problem, s->cu, s->n_seqs);
    if (s->kind == J_DECODE) { /* T = 1 before the inputs take their shapes */
        tu_rng r = {seed};
        decode_setup(s, j, &r);
    }
    fill_role(j, LS_ROLE_INPUT, seed);
    if (s->kind == J_BACKWARD || s->kind == J_TRAINING) fill_role(j, LS_ROLE_UPSTREAM, seed + 100);
    if (s->kind == J_FORWARD || s->kind == J_TRAINING) add_outputs(j, LS_ROLE_OUTPUT);
    if (s->kind == J_BACKWARD || s->kind == J_TRAINING) add_outputs(j, LS_ROLE_GRAD);
}

/* The jobs from the table alone: each call of each op on its small problem; false when n is
 * past the last. */
static bool table_spec(int n, job_spec *s, char *label, size_t label_size)
{
    int n_ops;
    const ls_op *const *ops = ls_ops(&n_ops);
    for (int i = 0; i < n_ops; i++)
        for (int k = 0; k < J_KINDS; k++) {
            if (!offers(ops[i], (job_kind)k) || n-- > 0) continue;
            snprintf(label, label_size, "%s (the table's small problem)", kind_name[k]);
            *s = (job_spec){.op = ops[i]->name, .label = label, .kind = (job_kind)k};
            return true;
        }
    return false;
}

int jobs_make(job **list)
{
    job_spec s;
    char label[64];
    int n_table = 0;
    while (table_spec(n_table, &s, label, sizeof label)) n_table++;
    job *j = calloc((size_t)(n_table + N_SPECS), sizeof *j);
    if (!j) abort();
    for (int i = 0; i < n_table; i++) {
        table_spec(i, &s, label, sizeof label);
        job_make(&j[i], &s, 31u + 10u * (uint64_t)i);
    }
    for (int i = 0; i < N_SPECS; i++) job_make(&j[n_table + i], &specs[i], 71u + 10u * (uint64_t)i);
    *list = j;
    return n_table + N_SPECS;
}

void jobs_free(job *list, int n)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < list[i].n_owned; k++) free(list[i].owned[k]);
    free(list);
}

const job *job_at(const job *list, int i) { return &list[i]; }
const char *job_name(const job *j) { return j->name; }
int job_outputs(const job *j) { return j->n_out; }
const char *job_output_name(const job *j, int k) { return j->out_name[k]; }
size_t job_output_len(const job *j, int k) { return j->out_len[k]; }

/* The job's outputs by the table's roles: out_args[i] the i-th OUTPUT, grads[i] the i-th
 * GRAD (NULL where the problem does not have it). */
static void sort_outputs(const job *j, float *const *out, float **out_args, float **grads)
{
    for (int k = 0; k < j->n_out; k++) {
        const ls_tensor_desc *t = j->out_desc[k];
        if (t && t->role == LS_ROLE_OUTPUT) out_args[t->offset] = out[k];
        for (int g = 0; t && t->role == LS_ROLE_GRAD && ls_op_tensor(j->op, LS_ROLE_GRAD, g); g++)
            if (ls_op_tensor(j->op, LS_ROLE_GRAD, g) == t) grads[g] = out[k];
    }
}

/* forward_train, then backward_saved from what it saved (the op's table entries). */
static linseq_status run_training(const job *j, const linseq_exec *ex, float *const *out_args,
                                  float *const *grads)
{
    const ls_op *op = j->op;
    _Alignas(void *) unsigned char gr[LS_OP_GRADS_BYTES] = {0};
    if (op->grads_size > sizeof gr) abort();
    for (int g = 0; ls_op_tensor(op, LS_ROLE_GRAD, g); g++)
        ls_tensor_set(ls_op_tensor(op, LS_ROLE_GRAD, g), gr, grads[g]);
    size_t bytes;
    linseq_status st = op->saved_size(j->problem, ex, &bytes);
    if (st) return st;
    void *saved = malloc(bytes);
    if (!saved) return LINSEQ_ERR_OUT_OF_MEMORY;
    st = op->forward_train(j->problem, ex, out_args, saved, bytes);
    if (!st) st = op->backward_saved(j->problem, ex, saved, bytes, j->up, gr);
    free(saved);
    return st;
}

linseq_status job_run(const job *j, int threads, float *const *out)
{
    linseq_exec ex = j->exec;
    ex.threads = threads;
    float *out_args[LS_OP_MAX_OUT] = {0}, *grads[LS_OP_MAX_GRADS] = {0};
    sort_outputs(j, out, out_args, grads);
    switch (j->kind) {
    case J_FORWARD: return j->op->forward(j->problem, &ex, out_args);
    case J_BACKWARD: return ls_op_backward(j->op, j->problem, &ex, j->up, grads);
    case J_TRAINING: return run_training(j, &ex, out_args, grads);
    case J_DECODE:
        memcpy(out[0], j->pool0, j->out_len[0] * sizeof(float));
        return j->op->decode(j->problem, &ex, out[0], j->pool_rows, j->rows, out_args);
    default: break;
    }
    return LINSEQ_ERR_UNSUPPORTED;
}

bool job_is_decode(const job *j) { return j->kind == J_DECODE; }
const char *job_op_name(const job *j) { return j->op->name; }
int64_t job_pool_rows(const job *j) { return j->pool_rows; }
const int64_t *job_rows(const job *j) { return j->rows; }
const float *job_pool0(const job *j) { return j->pool0; }

int64_t job_requests(const job *j)
{
    const ls_size_desc *B = size_named(j->op, "B");
    return B ? ls_size_get(B, j->problem) : 0;
}

linseq_status job_run_decode_pool(const job *j, int threads, const linseq_state_pool *pool,
                                  float *const *outputs)
{
    linseq_exec ex = j->exec;
    ex.threads = threads;
    float *out_args[LS_OP_MAX_OUT] = {0}, *grads[LS_OP_MAX_GRADS] = {0};
    float *out[JOB_MAX_OUT] = {0};
    for (int k = 1; k < j->n_out; k++) out[k] = outputs[k - 1];
    sort_outputs(j, out, out_args, grads);
    return linseq_op_decode_pool(j->op->name, j->problem, &ex, pool, out_args);
}
