/* NaN and Inf in the inputs: a non-finite value at one position of one input may only change
 * the outputs that depend on that position. Every other output element must be bitwise the
 * clean run's: tokens before it (forward) or after it (an upstream gradient, backward), the
 * other sequences of a packed row or batch, the other heads and channels; and a NaN must show
 * in some output that depends on it. Every op, forward and backward, KDA in both modes; never
 * a crash, and never a hang (an alarm ends the test).
 *
 * The dependency rule is written per tensor, not per op: each element has a sequence (or none,
 * for parameters), a token (or none, for states and parameters) and a set of "units" (the
 * value heads of KDA, the channels of SSM1 and conv1d, the (head, channel) pairs of the gate),
 * and an output element may change iff it shares the poisoned element's sequence and a unit,
 * and its token is not on the far side of the poisoned token. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

enum { SEQ_ALL = -1, TOK_NONE = -1 };

typedef enum {
    L_TOKEN, /* [rows, heads, inner]: rows = B*T, each (sequence, token)  */
    L_STATE, /* [sequences, heads, inner]                                 */
    L_PARAM  /* [heads, inner], shared by every sequence                 */
} layout;

typedef struct tensor {
    const char *name;
    float *data;
    layout lay;
    int64_t heads, inner;
    int span;      /* units per head: head h covers units [h*span, (h+1)*span) */
    bool upstream; /* backward: a gradient of an output (d_o, d_y ...)          */
} tensor;

enum { MAX_IN = 12, MAX_OUT = 10 };

typedef struct op_case {
    char name[96];
    bool backward;
    bool elementwise; /* an output token depends on its own token only (the gate) */
    int n_in, n_out;
    tensor in[MAX_IN], out[MAX_OUT];
    const int64_t *cu; /* sequence offsets of the rows, or NULL: T rows per sequence */
    int64_t B, T;
    linseq_status (*run)(const struct op_case *oc);
    const void *problem; /* the op's problem struct, pointing into the tensors        */
    linseq_exec exec;
} op_case;

static size_t count(const op_case *oc, const tensor *t)
{
    const int64_t rows = t->lay == L_TOKEN ? oc->B * oc->T
                         : t->lay == L_STATE ? (oc->cu ? 2 : oc->B)
                                             : 1;
    return (size_t)(rows * t->heads * t->inner);
}

/* The sequence, token and units of element idx of t. */
typedef struct {
    int64_t seq, tok;
    uint64_t units;
} where;

static where locate(const op_case *oc, const tensor *t, size_t idx)
{
    const int64_t per_row = t->heads * t->inner, row = (int64_t)idx / per_row;
    const int64_t head = ((int64_t)idx / t->inner) % t->heads;
    where w = {SEQ_ALL, TOK_NONE, ((((uint64_t)1) << t->span) - 1) << (head * t->span)};
    if (t->lay == L_STATE) w.seq = row;
    if (t->lay == L_TOKEN) {
        if (oc->cu) {
            w.seq = oc->cu[1] <= row ? 1 : 0;
            w.tok = row - oc->cu[w.seq];
        } else {
            w.seq = row / oc->T;
            w.tok = row % oc->T;
        }
    }
    return w;
}

static bool may_change(const op_case *oc, const where *p, bool p_upstream, const where *o)
{
    if (p->seq != SEQ_ALL && o->seq != SEQ_ALL && p->seq != o->seq) return false;
    if (!(p->units & o->units)) return false;
    if (p->tok == TOK_NONE || o->tok == TOK_NONE) return true;
    if (oc->elementwise) return o->tok == p->tok;
    if (!oc->backward) return o->tok >= p->tok; /* causal */
    if (p_upstream) return o->tok <= p->tok;    /* gradients flow back in time */
    return true; /* a forward input: every token's gradient sees it through the state */
}

static float *clean_out[MAX_OUT];
static int runs;

/* Poisons element idx of input i with value, runs, and checks every output element. */
static void poison_run(op_case *oc, int i, size_t idx, float value)
{
    tensor *t = &oc->in[i];
    const float saved = t->data[idx];
    t->data[idx] = value;
    for (int k = 0; k < oc->n_out; k++) tu_poison(oc->out[k].data, count(oc, &oc->out[k]) * 4);
    const linseq_status st = oc->run(oc);
    t->data[idx] = saved;
    runs++;
    CHECK(st == LINSEQ_OK, "%s: %s[%zu] = %g: %s (%s)", oc->name, t->name, idx, (double)value,
          linseq_status_string(st), linseq_last_error());
    if (st != LINSEQ_OK) return;

    const where p = locate(oc, t, idx);
    size_t leaked = 0, nonfinite = 0, first_leak = 0;
    int leak_out = -1;
    for (int k = 0; k < oc->n_out; k++) {
        const tensor *ot = &oc->out[k];
        const size_t n = count(oc, ot);
        for (size_t e = 0; e < n; e++) {
            const where o = locate(oc, ot, e);
            if (may_change(oc, &p, t->upstream, &o)) {
                nonfinite += !isfinite(ot->data[e]);
            } else if (memcmp(&ot->data[e], &clean_out[k][e], sizeof(float)) != 0) {
                if (!leaked++) first_leak = e, leak_out = k;
            }
        }
    }
    CHECK(leaked == 0,
          "%s: %s[%zu] = %g changed %zu output elements that do not depend on it (first: "
          "%s[%zu] = %g, clean %g)",
          oc->name, t->name, idx, (double)value, leaked, leak_out >= 0 ? oc->out[leak_out].name : "",
          first_leak, leak_out >= 0 ? (double)oc->out[leak_out].data[first_leak] : 0.0,
          leak_out >= 0 ? (double)clean_out[leak_out][first_leak] : 0.0);
    /* A NaN must show: an output that silently absorbed it would hide the bad input. (An
     * Inf may legitimately vanish: a sigmoid of it, or e^-inf = 0 as a decay.) */
    CHECK(!isnan(value) || nonfinite > 0, "%s: NaN in %s[%zu] left every output finite",
          oc->name, t->name, idx);
}

/* Two positions per input: one in each sequence (the middle of the first, a token in the
 * middle of a chunk of the second), or the first and last element of a state or parameter. */
static void positions(const op_case *oc, const tensor *t, size_t pos[2])
{
    const size_t n = count(oc, t);
    if (t->lay != L_TOKEN) {
        pos[0] = 0;
        pos[1] = n - 1;
        return;
    }
    const int64_t per_row = t->heads * t->inner;
    const int64_t s1 = oc->cu ? oc->cu[1] : oc->T;
    const int64_t row0 = s1 / 2, row1 = s1 + 5;
    pos[0] = (size_t)(row0 * per_row + per_row / 3);
    pos[1] = (size_t)(row1 * per_row + per_row - 1);
}

static void run_case(op_case *oc)
{
    for (int k = 0; k < oc->n_out; k++) {
        clean_out[k] = tu_alloc(count(oc, &oc->out[k]));
        tu_poison(oc->out[k].data, count(oc, &oc->out[k]) * 4);
    }
    const linseq_status st = oc->run(oc);
    CHECK(st == LINSEQ_OK, "%s: clean run: %s (%s)", oc->name, linseq_status_string(st),
          linseq_last_error());
    for (int k = 0; k < oc->n_out; k++) {
        const size_t n = count(oc, &oc->out[k]);
        memcpy(clean_out[k], oc->out[k].data, n * sizeof(float));
        size_t bad = 0;
        for (size_t e = 0; e < n; e++) bad += !isfinite(clean_out[k][e]);
        CHECK(bad == 0, "%s: clean run: %zu non-finite values in %s", oc->name, bad,
              oc->out[k].name);
    }
    static const float values[] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < oc->n_in; i++) {
        size_t pos[2];
        positions(oc, &oc->in[i], pos);
        for (int j = 0; j < 2; j++)
            for (int v = 0; v < 3; v++) poison_run(oc, i, pos[j], values[v]);
    }
    for (int k = 0; k < oc->n_out; k++) free(clean_out[k]);
}

/* ---------------------------------------------------------------------------------------- */
/* Building the cases                                                                         */
/* ---------------------------------------------------------------------------------------- */

static tensor *add(op_case *oc, bool output, const char *name, layout lay, int64_t heads,
                   int64_t inner, int span)
{
    tensor *t = output ? &oc->out[oc->n_out++] : &oc->in[oc->n_in++];
    *t = (tensor){.name = name, .lay = lay, .heads = heads, .inner = inner, .span = span};
    t->data = tu_alloc(count(oc, t));
    return t;
}

static void free_case(op_case *oc)
{
    for (int i = 0; i < oc->n_in; i++) free(oc->in[i].data);
    for (int k = 0; k < oc->n_out; k++) free(oc->out[k].data);
}

static void fill(tu_rng *r, const op_case *oc, tensor *t, double lo, double hi)
{
    tu_fill_uniform(r, t->data, count(oc, t), lo, hi);
}

static const int64_t CU[3] = {0, 19, 40};

/* KDA: two layouts of the same 40 tokens (a packed row of 19 + 21, or a batch of 2 x 20),
 * in two flavours (per-channel decay with the gate in the kernel, l2norm and beta logits; or
 * per-head decay, raw g and V-first states). */
enum { KH = 2, KHV = 4, KK = 8, KV = 8, KG = KHV / KH };

typedef struct {
    linseq_kda_problem p;
    op_case oc;
} kda_case;

static linseq_status run_kda(const op_case *oc)
{
    const linseq_kda_problem *p = oc->problem;
    if (!oc->backward) return linseq_kda_forward(p, &oc->exec, oc->out[0].data, oc->out[1].data);
    const linseq_kda_grads gr = {.dq = oc->out[0].data, .dk = oc->out[1].data,
                                 .dv = oc->out[2].data, .dbeta = oc->out[3].data,
                                 .dg = oc->out[4].data, .dh0 = oc->out[5].data,
                                 .dA_log = oc->n_out > 6 ? oc->out[6].data : NULL,
                                 .ddt_bias = oc->n_out > 7 ? oc->out[7].data : NULL};
    return linseq_kda_backward(p, &oc->exec, oc->in[oc->n_in - 2].data,
                               oc->in[oc->n_in - 1].data, &gr);
}

static void kda_cases(void)
{
    for (int flavour = 0; flavour < 2; flavour++)
        for (int varlen = 0; varlen < 2; varlen++)
            for (int mode = LINSEQ_MODE_RECURRENT; mode <= LINSEQ_MODE_CHUNKED; mode++)
                for (int backward = 0; backward < 2; backward++) {
                    kda_case kc = {0};
                    op_case *oc = &kc.oc;
                    const bool gate = flavour == 0;
                    const int64_t gK = gate ? KK : 1;
                    oc->cu = varlen ? CU : NULL;
                    oc->B = varlen ? 1 : 2;
                    oc->T = varlen ? 40 : 20;
                    oc->backward = backward;
                    oc->exec = (linseq_exec){.mode = (linseq_mode)mode, .chunk_size = 16};
                    snprintf(oc->name, sizeof oc->name, "kda %s %s %s %s",
                             gate ? "per-channel gate" : "per-head", varlen ? "varlen" : "batch",
                             mode == LINSEQ_MODE_RECURRENT ? "recurrent" : "chunked",
                             backward ? "backward" : "forward");
                    tu_rng r = {1000u + (uint64_t)(flavour * 8 + varlen * 4 + mode * 2 + backward)};
                    tensor *q = add(oc, false, "q", L_TOKEN, KH, KK, KG);
                    tensor *k = add(oc, false, "k", L_TOKEN, KH, KK, KG);
                    tensor *v = add(oc, false, "v", L_TOKEN, KHV, KV, 1);
                    tensor *beta = add(oc, false, "beta", L_TOKEN, KHV, 1, 1);
                    tensor *g = add(oc, false, "g", L_TOKEN, KHV, gK, 1);
                    tensor *h0 = add(oc, false, "h0", L_STATE, KHV, KK * KV, 1);
                    fill(&r, oc, q, -1, 1);
                    fill(&r, oc, v, -1, 1);
                    fill(&r, oc, h0, -0.5, 0.5);
                    if (gate) {
                        fill(&r, oc, k, -1, 1);
                        fill(&r, oc, beta, -2, 2);
                        fill(&r, oc, g, -3, 1);
                    } else {
                        fill(&r, oc, k, -0.3, 0.3);
                        fill(&r, oc, beta, 0.1, 0.9);
                        fill(&r, oc, g, -1, 0);
                    }
                    linseq_kda_problem p = {
                        .B = oc->B, .T = oc->T, .H = KH, .HV = KHV, .K = KK, .V = KV,
                        .cu_seqlens = oc->cu, .n_seqs = varlen ? 2 : 0, .q = q->data,
                        .k = k->data, .v = v->data, .beta = beta->data, .g = g->data,
                        .h0 = h0->data,
                        .decay = gate ? LINSEQ_DECAY_PER_CHANNEL : LINSEQ_DECAY_PER_HEAD,
                        .qk_l2norm = gate, .beta_is_logit = gate, .gate_in_kernel = gate,
                        .state_v_first = !gate};
                    if (gate) {
                        tensor *A_log = add(oc, false, "A_log", L_PARAM, KHV, 1, 1);
                        tensor *dt_bias = add(oc, false, "dt_bias", L_PARAM, KHV, KK, 1);
                        fill(&r, oc, A_log, -1, 0.5);
                        fill(&r, oc, dt_bias, -1, 1);
                        p.A_log = A_log->data;
                        p.dt_bias = dt_bias->data;
                    }
                    if (backward) {
                        tensor *d_o = add(oc, false, "d_o", L_TOKEN, KHV, KV, 1);
                        tensor *d_ht = add(oc, false, "d_ht", L_STATE, KHV, KK * KV, 1);
                        d_o->upstream = d_ht->upstream = true;
                        fill(&r, oc, d_o, -1, 1);
                        fill(&r, oc, d_ht, -1, 1);
                        add(oc, true, "dq", L_TOKEN, KH, KK, KG);
                        add(oc, true, "dk", L_TOKEN, KH, KK, KG);
                        add(oc, true, "dv", L_TOKEN, KHV, KV, 1);
                        add(oc, true, "dbeta", L_TOKEN, KHV, 1, 1);
                        add(oc, true, "dg", L_TOKEN, KHV, gK, 1);
                        add(oc, true, "dh0", L_STATE, KHV, KK * KV, 1);
                        if (gate) {
                            add(oc, true, "dA_log", L_PARAM, KHV, 1, 1);
                            add(oc, true, "ddt_bias", L_PARAM, KHV, KK, 1);
                        }
                    } else {
                        add(oc, true, "o", L_TOKEN, KHV, KV, 1);
                        add(oc, true, "ht", L_STATE, KHV, KK * KV, 1);
                    }
                    kc.p = p;
                    oc->problem = &kc.p;
                    oc->run = run_kda;
                    run_case(oc);
                    free_case(oc);
                }
}

/* The standalone gate: elementwise, per (head, channel) unit; the batch is its "sequences". */
enum { GB = 2, GT = 6, GH = 2, GK = 8 };

static linseq_status run_gate(const op_case *oc)
{
    const linseq_kda_gate_problem *p = oc->problem;
    if (!oc->backward) return linseq_kda_gate_forward(p, &oc->exec, oc->out[0].data);
    const linseq_kda_gate_grads gr = {.dg_raw = oc->out[0].data, .dA_log = oc->out[1].data,
                                      .ddt_bias = oc->out[2].data};
    return linseq_kda_gate_backward(p, &oc->exec, oc->in[3].data, &gr);
}

static void gate_cases(void)
{
    for (int lower = 0; lower < 2; lower++)
        for (int backward = 0; backward < 2; backward++) {
            op_case oc = {.B = GB, .T = GT, .backward = backward, .run = run_gate};
            snprintf(oc.name, sizeof oc.name, "kda gate %s %s", lower ? "lower-bound" : "default",
                     backward ? "backward" : "forward");
            tu_rng r = {2000u + (uint64_t)(lower * 2 + backward)};
            tensor *g_raw = add(&oc, false, "g_raw", L_TOKEN, GH * GK, 1, 1);
            tensor *A_log = add(&oc, false, "A_log", L_PARAM, GH, 1, GK);
            tensor *dt_bias = add(&oc, false, "dt_bias", L_PARAM, GH * GK, 1, 1);
            fill(&r, &oc, g_raw, -3, 3);
            fill(&r, &oc, A_log, -1, 1);
            fill(&r, &oc, dt_bias, -1, 1);
            linseq_kda_gate_problem p = {.B = GB, .T = GT, .H = GH, .K = GK,
                                         .decay = LINSEQ_DECAY_PER_CHANNEL, .g_raw = g_raw->data,
                                         .A_log = A_log->data, .dt_bias = dt_bias->data,
                                         .lower_bound = lower ? -5.0f : 0.0f};
            if (backward) {
                tensor *d_g = add(&oc, false, "d_g", L_TOKEN, GH * GK, 1, 1);
                d_g->upstream = true;
                fill(&r, &oc, d_g, -1, 1);
                add(&oc, true, "dg_raw", L_TOKEN, GH * GK, 1, 1);
                add(&oc, true, "dA_log", L_PARAM, GH, 1, GK);
                add(&oc, true, "ddt_bias", L_PARAM, GH * GK, 1, 1);
            } else {
                add(&oc, true, "g", L_TOKEN, GH * GK, 1, 1);
            }
            oc.elementwise = true;
            oc.problem = &p;
            run_case(&oc);
            free_case(&oc);
        }
}

/* SSM1: D channels in G groups; B_proj and C_proj belong to every channel of their group. */
enum { SD = 8, SN = 4, SG = 2 };

static linseq_status run_ssm1(const op_case *oc)
{
    const linseq_ssm1_problem *p = oc->problem;
    if (!oc->backward) return linseq_ssm1_forward(p, &oc->exec, oc->out[0].data, oc->out[1].data);
    const linseq_ssm1_grads gr = {
        .dx = oc->out[0].data, .ddt = oc->out[1].data, .dA = oc->out[2].data,
        .dB_proj = oc->out[3].data, .dC_proj = oc->out[4].data, .dD_skip = oc->out[5].data,
        .dgate = oc->out[6].data, .dh0 = oc->out[7].data, .ddt_bias = oc->out[8].data};
    return linseq_ssm1_backward(p, &oc->exec, oc->in[9].data, oc->in[10].data, &gr);
}

static void ssm1_cases(void)
{
    for (int varlen = 0; varlen < 2; varlen++)
        for (int backward = 0; backward < 2; backward++) {
            op_case oc = {.cu = varlen ? CU : NULL, .B = varlen ? 1 : 2, .T = varlen ? 40 : 20,
                          .backward = backward, .run = run_ssm1};
            snprintf(oc.name, sizeof oc.name, "ssm1 %s %s", varlen ? "varlen" : "batch",
                     backward ? "backward" : "forward");
            tu_rng r = {3000u + (uint64_t)(varlen * 2 + backward)};
            const int span = SD / SG;
            tensor *x = add(&oc, false, "x", L_TOKEN, SD, 1, 1);
            tensor *dt = add(&oc, false, "dt", L_TOKEN, SD, 1, 1);
            tensor *A = add(&oc, false, "A", L_PARAM, SD, SN, 1);
            tensor *Bp = add(&oc, false, "B_proj", L_TOKEN, SG, SN, span);
            tensor *Cp = add(&oc, false, "C_proj", L_TOKEN, SG, SN, span);
            tensor *Ds = add(&oc, false, "D_skip", L_PARAM, SD, 1, 1);
            tensor *gate = add(&oc, false, "gate", L_TOKEN, SD, 1, 1);
            tensor *dtb = add(&oc, false, "dt_bias", L_PARAM, SD, 1, 1);
            tensor *h0 = add(&oc, false, "h0", L_STATE, SD, SN, 1);
            fill(&r, &oc, x, -1, 1);
            fill(&r, &oc, dt, -2, 1);
            fill(&r, &oc, A, -2, -0.1);
            fill(&r, &oc, Bp, -1, 1);
            fill(&r, &oc, Cp, -1, 1);
            fill(&r, &oc, Ds, -1, 1);
            fill(&r, &oc, gate, -2, 2);
            fill(&r, &oc, dtb, -1, 1);
            fill(&r, &oc, h0, -1, 1);
            linseq_ssm1_problem p = {
                .B = oc.B, .T = oc.T, .D = SD, .N = SN, .G = SG, .cu_seqlens = oc.cu,
                .n_seqs = varlen ? 2 : 0, .x = x->data, .dt = dt->data, .A = A->data,
                .B_proj = Bp->data, .C_proj = Cp->data, .D_skip = Ds->data, .gate = gate->data,
                .h0 = h0->data, .dt_softplus = true, .dt_bias = dtb->data};
            if (backward) {
                tensor *d_y = add(&oc, false, "d_y", L_TOKEN, SD, 1, 1);
                tensor *d_hT = add(&oc, false, "d_hT", L_STATE, SD, SN, 1);
                d_y->upstream = d_hT->upstream = true;
                fill(&r, &oc, d_y, -1, 1);
                fill(&r, &oc, d_hT, -1, 1);
                add(&oc, true, "dx", L_TOKEN, SD, 1, 1);
                add(&oc, true, "ddt", L_TOKEN, SD, 1, 1);
                add(&oc, true, "dA", L_PARAM, SD, SN, 1);
                add(&oc, true, "dB_proj", L_TOKEN, SG, SN, span);
                add(&oc, true, "dC_proj", L_TOKEN, SG, SN, span);
                add(&oc, true, "dD_skip", L_PARAM, SD, 1, 1);
                add(&oc, true, "dgate", L_TOKEN, SD, 1, 1);
                add(&oc, true, "dh0", L_STATE, SD, SN, 1);
                add(&oc, true, "ddt_bias", L_PARAM, SD, 1, 1);
            } else {
                add(&oc, true, "y", L_TOKEN, SD, 1, 1);
                add(&oc, true, "hT", L_STATE, SD, SN, 1);
            }
            oc.problem = &p;
            run_case(&oc);
            free_case(&oc);
        }
}

/* Causal conv1d: one unit per channel. */
enum { CD = 8, CW = 4 };

static linseq_status run_conv(const op_case *oc)
{
    const linseq_conv1d_problem *p = oc->problem;
    if (!oc->backward)
        return linseq_conv1d_forward(p, &oc->exec, oc->out[0].data, oc->out[1].data);
    const linseq_conv1d_grads gr = {.dx = oc->out[0].data, .dweight = oc->out[1].data,
                                    .dbias = oc->out[2].data, .dconv_state = oc->out[3].data};
    return linseq_conv1d_backward(p, &oc->exec, oc->in[4].data, oc->in[5].data, &gr);
}

static void conv_cases(void)
{
    for (int varlen = 0; varlen < 2; varlen++)
        for (int backward = 0; backward < 2; backward++) {
            op_case oc = {.cu = varlen ? CU : NULL, .B = varlen ? 1 : 2, .T = varlen ? 40 : 20,
                          .backward = backward, .run = run_conv};
            snprintf(oc.name, sizeof oc.name, "conv1d %s %s", varlen ? "varlen" : "batch",
                     backward ? "backward" : "forward");
            tu_rng r = {4000u + (uint64_t)(varlen * 2 + backward)};
            tensor *x = add(&oc, false, "x", L_TOKEN, CD, 1, 1);
            tensor *w = add(&oc, false, "weight", L_PARAM, CD, CW, 1);
            tensor *b = add(&oc, false, "bias", L_PARAM, CD, 1, 1);
            tensor *s = add(&oc, false, "conv_state", L_STATE, CD, CW - 1, 1);
            fill(&r, &oc, x, -1, 1);
            fill(&r, &oc, w, -1, 1);
            fill(&r, &oc, b, -1, 1);
            fill(&r, &oc, s, -1, 1);
            linseq_conv1d_problem p = {.B = oc.B, .T = oc.T, .D = CD, .W = CW,
                                       .cu_seqlens = oc.cu, .n_seqs = varlen ? 2 : 0,
                                       .x = x->data, .weight = w->data, .bias = b->data,
                                       .conv_state = s->data, .activation = LINSEQ_ACT_SILU};
            if (backward) {
                tensor *d_y = add(&oc, false, "d_y", L_TOKEN, CD, 1, 1);
                tensor *d_s = add(&oc, false, "d_conv_state_out", L_STATE, CD, CW - 1, 1);
                d_y->upstream = d_s->upstream = true;
                fill(&r, &oc, d_y, -1, 1);
                fill(&r, &oc, d_s, -1, 1);
                add(&oc, true, "dx", L_TOKEN, CD, 1, 1);
                add(&oc, true, "dweight", L_PARAM, CD, CW, 1);
                add(&oc, true, "dbias", L_PARAM, CD, 1, 1);
                add(&oc, true, "dconv_state", L_STATE, CD, CW - 1, 1);
            } else {
                add(&oc, true, "y", L_TOKEN, CD, 1, 1);
                add(&oc, true, "conv_state_out", L_STATE, CD, CW - 1, 1);
            }
            oc.problem = &p;
            run_case(&oc);
            free_case(&oc);
        }
}

int main(void)
{
    /* a hang is a failure too: the default action of SIGALRM ends the process */
    alarm(600);
    kda_cases();
    gate_cases();
    ssm1_cases();
    conv_cases();
    printf("  %d poisoned runs\n", runs);
    return tu_finish("test_nonfinite");
}
