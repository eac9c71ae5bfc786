/* The job catalog: each op in the configurations whose thread splits differ (several items,
 * one wide KDA item whose state columns are split, packed sequences, sums over the batch). */
#include "op_jobs.h"

#include <stdlib.h>
#include <string.h>

#include "kda_fixture.h"
#include "testutil.h"

typedef enum {
    J_KDA_FORWARD, J_KDA_BACKWARD, J_KDA_DECODE, J_KDA_TRAINING, J_GATE_FORWARD,
    J_GATE_BACKWARD, J_SSM1_FORWARD, J_SSM1_BACKWARD, J_CONV_FORWARD, J_CONV_BACKWARD
} job_kind;

enum { JOB_MAX_OWNED = 24 };

struct job {
    char name[80];
    job_kind kind;
    linseq_exec exec;
    int n_out;
    const char *out_name[JOB_MAX_OUT];
    size_t out_len[JOB_MAX_OUT];
    bool kda_gate_grads; /* KDA backward: dA_log and ddt_bias exist */
    kda_fixture kda;
    linseq_kda_gate_problem gate;
    linseq_ssm1_problem ssm;
    linseq_conv1d_problem conv;
    const float *up[2]; /* upstream gradients */
    const float *pool0; /* decode: the state pool before the step */
    int64_t pool_rows;
    const int64_t *rows;
    void *owned[JOB_MAX_OWNED];
    int n_owned;
};

static void *own(job *j, void *p)
{
    if (j->n_owned == JOB_MAX_OWNED) abort();
    j->owned[j->n_owned++] = p;
    return p;
}

static float *random_floats(job *j, tu_rng *r, size_t n, double lo, double hi)
{
    float *x = own(j, tu_alloc(n));
    tu_fill_uniform(r, x, n, lo, hi);
    return x;
}

static void output(job *j, const char *name, size_t len)
{
    j->out_name[j->n_out] = name;
    j->out_len[j->n_out++] = len;
}

/* ---------------------------------------------------------------------------------------- */
/* KDA                                                                                        */
/* ---------------------------------------------------------------------------------------- */

static const int64_t CU3[4] = {0, 13, 50, 64};

/* Per-channel decay with the gate in the kernel, l2norm and h0; two sequences, 8 items. */
static const kda_spec SPEC_GATED = {.B = 2, .T = 37, .H = 2, .HV = 4, .K = 16, .V = 24,
                                    .decay = LINSEQ_DECAY_PER_CHANNEL, .l2norm = true,
                                    .with_h0 = true, .gmag = 0.5, .regime = GATE_RAND,
                                    .seed = 71};
/* Per-head decay, V-first states, three packed sequences of 13, 37 and 14 tokens. */
static const kda_spec SPEC_VARLEN = {.B = 1, .T = 64, .H = 2, .HV = 4, .K = 16, .V = 24,
                                     .decay = LINSEQ_DECAY_PER_HEAD, .with_h0 = true,
                                     .v_first = true, .gmag = 0.3, .regime = GATE_RAND,
                                     .n_seqs = 3, .cu = CU3, .seed = 72};
/* One sequence and head, V = 96: the threads split the state's columns. */
static const kda_spec SPEC_WIDE = {.B = 1, .T = 150, .H = 1, .HV = 1, .K = 32, .V = 96,
                                   .decay = LINSEQ_DECAY_PER_CHANNEL, .l2norm = true,
                                   .with_h0 = true, .gmag = 1.0, .regime = GATE_EXTREME,
                                   .seed = 73};

static size_t kda_len(const kda_spec *s, int what)
{
    const int64_t BT = s->B * s->T, HV = s->HV ? s->HV : s->H;
    switch (what) {
    case 0: return (size_t)(BT * s->H * s->K);          /* q, k */
    case 1: return (size_t)(BT * HV * s->V);            /* v, o */
    case 2: return (size_t)(BT * HV);                   /* beta */
    case 3: return (size_t)(BT * HV * (s->decay == LINSEQ_DECAY_PER_CHANNEL ? s->K : 1));
    case 4: return (size_t)((s->n_seqs ? s->n_seqs : s->B) * HV * s->K * s->V);
    default: return (size_t)HV * (s->decay == LINSEQ_DECAY_PER_CHANNEL ? (size_t)s->K : 1);
    }
}

static void kda_job(job *j, const char *name, job_kind kind, const kda_spec *s, linseq_mode mode,
                    int chunk, bool gate)
{
    snprintf(j->name, sizeof j->name, "%s", name);
    j->kind = kind;
    j->exec = (linseq_exec){.mode = mode, .chunk_size = chunk};
    kda_fixture_make(&j->kda, s);
    tu_rng r = {s->seed * 7};
    const int64_t HV = s->HV ? s->HV : s->H;
    if (gate) {
        j->kda.p.gate_in_kernel = true;
        j->kda.p.A_log = random_floats(j, &r, (size_t)HV, -1.0, 0.5);
        j->kda.p.dt_bias = random_floats(j, &r, kda_len(s, 5), -1.0, 1.0);
        j->kda_gate_grads = true;
    }
    if (kind == J_KDA_FORWARD || kind == J_KDA_TRAINING) {
        output(j, "o", kda_len(s, 1));
        output(j, "ht", kda_len(s, 4));
    }
    if (kind == J_KDA_BACKWARD || kind == J_KDA_TRAINING) {
        j->up[0] = random_floats(j, &r, kda_len(s, 1), -1.0, 1.0);
        j->up[1] = random_floats(j, &r, kda_len(s, 4), -1.0, 1.0);
        output(j, "dq", kda_len(s, 0));
        output(j, "dk", kda_len(s, 0));
        output(j, "dv", kda_len(s, 1));
        output(j, "dbeta", kda_len(s, 2));
        output(j, "dg", kda_len(s, 3));
        output(j, "dh0", kda_len(s, 4));
        if (gate) {
            output(j, "dA_log", (size_t)HV);
            output(j, "ddt_bias", kda_len(s, 5));
        }
    }
}

static void kda_decode_job(job *j)
{
    static const int64_t rows[3] = {4, -1, 1};
    const kda_spec s = {.B = 3, .T = 1, .H = 2, .HV = 4, .K = 16, .V = 24,
                        .decay = LINSEQ_DECAY_PER_CHANNEL, .l2norm = true, .gmag = 0.5,
                        .regime = GATE_RAND, .seed = 74};
    kda_job(j, "kda decode (pool of 5, a padding request)", J_KDA_DECODE, &s,
            LINSEQ_MODE_RECURRENT, 0, false);
    tu_rng r = {75};
    j->pool_rows = 5;
    j->rows = rows;
    const size_t pool = (size_t)(j->pool_rows * 4 * 16 * 24);
    j->pool0 = random_floats(j, &r, pool, -0.5, 0.5);
    output(j, "state", pool);
    output(j, "o", kda_len(&s, 1));
}

static linseq_status run_kda(const job *j, const linseq_exec *ex, float *const *out)
{
    const linseq_kda_problem *p = &j->kda.p;
    linseq_kda_grads gr = {0};
    float *const *g = out;
    switch (j->kind) {
    case J_KDA_FORWARD: return linseq_kda_forward(p, ex, out[0], out[1]);
    case J_KDA_DECODE:
        memcpy(out[0], j->pool0, j->out_len[0] * sizeof(float));
        return linseq_kda_decode(p, ex, out[0], j->pool_rows, j->rows, out[1]);
    case J_KDA_TRAINING: g = out + 2; break;
    default: break;
    }
    gr = (linseq_kda_grads){.dq = g[0], .dk = g[1], .dv = g[2], .dbeta = g[3], .dg = g[4],
                            .dh0 = g[5], .dA_log = j->kda_gate_grads ? g[6] : NULL,
                            .ddt_bias = j->kda_gate_grads ? g[7] : NULL};
    if (j->kind == J_KDA_BACKWARD) return linseq_kda_backward(p, ex, j->up[0], j->up[1], &gr);
    size_t bytes;
    linseq_status st = linseq_kda_saved_size(p, ex, &bytes);
    if (st) return st;
    void *saved = malloc(bytes);
    if (!saved) return LINSEQ_ERR_OUT_OF_MEMORY;
    st = linseq_kda_forward_train(p, ex, out[0], out[1], saved, bytes);
    if (!st) st = linseq_kda_backward_saved(p, ex, saved, bytes, j->up[0], j->up[1], &gr);
    free(saved);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Gate, SSM1, conv1d                                                                         */
/* ---------------------------------------------------------------------------------------- */

static void gate_job(job *j, bool backward)
{
    tu_rng r = {80u + backward};
    j->kind = backward ? J_GATE_BACKWARD : J_GATE_FORWARD;
    const linseq_decay decay = backward ? LINSEQ_DECAY_PER_HEAD : LINSEQ_DECAY_PER_CHANNEL;
    const int64_t B = backward ? 3 : 2, T = backward ? 50 : 33, H = backward ? 6 : 4, K = 64;
    const int64_t gK = backward ? 1 : K;
    const size_t n = (size_t)(B * T * H * gK);
    snprintf(j->name, sizeof j->name, "kda gate %s", backward ? "backward (per head, lower bound)"
                                                               : "forward (per channel)");
    j->gate = (linseq_kda_gate_problem){
        .B = B, .T = T, .H = H, .K = K, .decay = decay,
        .g_raw = random_floats(j, &r, n, -3.0, 3.0),
        .A_log = random_floats(j, &r, (size_t)H, -1.0, 1.0),
        .dt_bias = random_floats(j, &r, (size_t)(H * gK), -1.0, 1.0),
        .lower_bound = backward ? -3.0f : 0.0f};
    if (!backward) {
        output(j, "g", n);
        return;
    }
    j->up[0] = random_floats(j, &r, n, -1.0, 1.0);
    output(j, "dg_raw", n);
    output(j, "dA_log", (size_t)H);
    output(j, "ddt_bias", (size_t)(H * gK));
}

static const int64_t CU_SSM[4] = {0, 30, 31, 90};

static void ssm1_job(job *j, bool backward)
{
    tu_rng r = {90u + backward};
    j->kind = backward ? J_SSM1_BACKWARD : J_SSM1_FORWARD;
    const int64_t B = backward ? 2 : 1, T = backward ? 70 : 90, D = backward ? 130 : 200, N = 8,
                  G = 2, n_seqs = backward ? 0 : 3, rows = n_seqs ? n_seqs : B;
    snprintf(j->name, sizeof j->name, "ssm1 %s", backward ? "backward (batch of 2, 70 tokens)"
                                                           : "forward (3 packed sequences)");
    const size_t btd = (size_t)(B * T * D), bgn = (size_t)(B * T * G * N);
    const size_t state = (size_t)(rows * D * N);
    j->ssm = (linseq_ssm1_problem){
        .B = B, .T = T, .D = D, .N = N, .G = G, .cu_seqlens = n_seqs ? CU_SSM : NULL,
        .n_seqs = n_seqs, .x = random_floats(j, &r, btd, -1.0, 1.0),
        .dt = random_floats(j, &r, btd, -2.0, 1.0),
        .A = random_floats(j, &r, (size_t)(D * N), -2.0, -0.1),
        .B_proj = random_floats(j, &r, bgn, -1.0, 1.0),
        .C_proj = random_floats(j, &r, bgn, -1.0, 1.0),
        .D_skip = random_floats(j, &r, (size_t)D, -1.0, 1.0),
        .gate = random_floats(j, &r, btd, -2.0, 2.0),
        .h0 = random_floats(j, &r, state, -1.0, 1.0), .dt_softplus = true,
        .dt_bias = random_floats(j, &r, (size_t)D, -1.0, 1.0)};
    if (!backward) {
        output(j, "y", btd);
        output(j, "hT", state);
        return;
    }
    j->up[0] = random_floats(j, &r, btd, -1.0, 1.0);
    j->up[1] = random_floats(j, &r, state, -1.0, 1.0);
    output(j, "dx", btd);
    output(j, "ddt", btd);
    output(j, "dA", (size_t)(D * N));
    output(j, "dB_proj", bgn);
    output(j, "dC_proj", bgn);
    output(j, "dD_skip", (size_t)D);
    output(j, "dgate", btd);
    output(j, "dh0", state);
    output(j, "ddt_bias", (size_t)D);
}

static void conv_job(job *j, bool backward)
{
    tu_rng r = {100u + backward};
    j->kind = backward ? J_CONV_BACKWARD : J_CONV_FORWARD;
    const int64_t B = backward ? 1 : 2, T = backward ? 90 : 100, D = backward ? 200 : 300, W = 4,
                  n_seqs = backward ? 3 : 0, rows = n_seqs ? n_seqs : B;
    snprintf(j->name, sizeof j->name, "conv1d %s", backward ? "backward (3 packed sequences)"
                                                             : "forward (batch of 2)");
    const size_t btd = (size_t)(B * T * D), state = (size_t)(rows * D * (W - 1));
    j->conv = (linseq_conv1d_problem){
        .B = B, .T = T, .D = D, .W = W, .cu_seqlens = n_seqs ? CU_SSM : NULL, .n_seqs = n_seqs,
        .x = random_floats(j, &r, btd, -1.0, 1.0),
        .weight = random_floats(j, &r, (size_t)(D * W), -1.0, 1.0),
        .bias = random_floats(j, &r, (size_t)D, -1.0, 1.0),
        .conv_state = random_floats(j, &r, state, -1.0, 1.0), .activation = LINSEQ_ACT_SILU};
    if (!backward) {
        output(j, "y", btd);
        output(j, "conv_state_out", state);
        return;
    }
    j->up[0] = random_floats(j, &r, btd, -1.0, 1.0);
    j->up[1] = random_floats(j, &r, state, -1.0, 1.0);
    output(j, "dx", btd);
    output(j, "dweight", (size_t)(D * W));
    output(j, "dbias", (size_t)D);
    output(j, "dconv_state", state);
}

/* ---------------------------------------------------------------------------------------- */

int jobs_make(job **list)
{
    enum { N_JOBS = 16 };
    job *j = calloc(N_JOBS, sizeof *j);
    if (!j) abort();
    int n = 0;
    kda_job(&j[n++], "kda forward recurrent (gate in kernel)", J_KDA_FORWARD, &SPEC_GATED,
            LINSEQ_MODE_RECURRENT, 0, true);
    kda_job(&j[n++], "kda forward chunked 16 (gate in kernel)", J_KDA_FORWARD, &SPEC_GATED,
            LINSEQ_MODE_CHUNKED, 16, true);
    kda_job(&j[n++], "kda forward chunked 32 (varlen, per head, V-first)", J_KDA_FORWARD,
            &SPEC_VARLEN, LINSEQ_MODE_CHUNKED, 32, false);
    kda_job(&j[n++], "kda forward chunked 64 (one wide item)", J_KDA_FORWARD, &SPEC_WIDE,
            LINSEQ_MODE_CHUNKED, 64, false);
    kda_job(&j[n++], "kda forward recurrent (one wide item)", J_KDA_FORWARD, &SPEC_WIDE,
            LINSEQ_MODE_RECURRENT, 0, false);
    kda_job(&j[n++], "kda backward chunked 16 (gate in kernel)", J_KDA_BACKWARD, &SPEC_GATED,
            LINSEQ_MODE_CHUNKED, 16, true);
    kda_job(&j[n++], "kda backward recurrent (varlen, per head, V-first)", J_KDA_BACKWARD,
            &SPEC_VARLEN, LINSEQ_MODE_RECURRENT, 16, false);
    kda_decode_job(&j[n++]);
    kda_job(&j[n++], "kda training chunked 32 (gate in kernel)", J_KDA_TRAINING, &SPEC_GATED,
            LINSEQ_MODE_CHUNKED, 32, true);
    kda_job(&j[n++], "kda training recurrent (varlen)", J_KDA_TRAINING, &SPEC_VARLEN,
            LINSEQ_MODE_RECURRENT, 16, false);
    gate_job(&j[n++], false);
    gate_job(&j[n++], true);
    ssm1_job(&j[n++], false);
    ssm1_job(&j[n++], true);
    conv_job(&j[n++], false);
    conv_job(&j[n++], true);
    *list = j;
    return n;
}

void jobs_free(job *list, int n)
{
    for (int i = 0; i < n; i++) {
        if (list[i].kind <= J_KDA_TRAINING) kda_fixture_free(&list[i].kda);
        for (int k = 0; k < list[i].n_owned; k++) free(list[i].owned[k]);
    }
    free(list);
}

const job *job_at(const job *list, int i) { return &list[i]; }
const char *job_name(const job *j) { return j->name; }
int job_outputs(const job *j) { return j->n_out; }
const char *job_output_name(const job *j, int k) { return j->out_name[k]; }
size_t job_output_len(const job *j, int k) { return j->out_len[k]; }

linseq_status job_run(const job *j, int threads, float *const *out)
{
    linseq_exec ex = j->exec;
    ex.threads = threads;
    switch (j->kind) {
    case J_GATE_FORWARD: return linseq_kda_gate_forward(&j->gate, &ex, out[0]);
    case J_GATE_BACKWARD: {
        const linseq_kda_gate_grads gr = {.dg_raw = out[0], .dA_log = out[1], .ddt_bias = out[2]};
        return linseq_kda_gate_backward(&j->gate, &ex, j->up[0], &gr);
    }
    case J_SSM1_FORWARD: return linseq_ssm1_forward(&j->ssm, &ex, out[0], out[1]);
    case J_SSM1_BACKWARD: {
        const linseq_ssm1_grads gr = {.dx = out[0], .ddt = out[1], .dA = out[2],
                                      .dB_proj = out[3], .dC_proj = out[4], .dD_skip = out[5],
                                      .dgate = out[6], .dh0 = out[7], .ddt_bias = out[8]};
        return linseq_ssm1_backward(&j->ssm, &ex, j->up[0], j->up[1], &gr);
    }
    case J_CONV_FORWARD: return linseq_conv1d_forward(&j->conv, &ex, out[0], out[1]);
    case J_CONV_BACKWARD: {
        const linseq_conv1d_grads gr = {.dx = out[0], .dweight = out[1], .dbias = out[2],
                                        .dconv_state = out[3]};
        return linseq_conv1d_backward(&j->conv, &ex, j->up[0], j->up[1], &gr);
    }
    default: return run_kda(j, &ex, out);
    }
}
