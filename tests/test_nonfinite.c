/* NaN and Inf in the inputs: a non-finite value at one position of one input may only change
 * the outputs that depend on that position. Every other output element must be bitwise the
 * clean run's: tokens before it (forward) or after it (an upstream gradient, backward), the
 * other sequences of a packed row or batch, the other heads and channels; and a NaN must show
 * in some output that depends on it. Every op of the op table, its forward and (unless it is
 * forward-only) its backward, KDA in both modes; never a crash, and never a hang (an alarm
 * ends the test).
 *
 * The dependency rule is written per tensor, not per op: each element has a sequence (or none,
 * for parameters), a token (or none, for states and parameters) and a set of "units" (the
 * value heads of KDA, the channels of SSM1 and conv1d, the (head, channel) pairs of the gate),
 * and an output element may change iff it shares the poisoned element's sequence and a unit,
 * and its token is not on the far side of the poisoned token. An input that does not enter
 * an op (q of KDA's segment summary) has no unit: nothing may change.
 *
 * The tensors, their shapes and roles and the calls come from the op table; the units cannot,
 * so an op has a row in `rows` (bottom) with its problems and unit rules. An op without one
 * runs the generic case (generic_cases): each tensor one unit, so the sequences' isolation
 * and causality are still checked, at sizes and values from the table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "optable/optable.h"
#include "testutil.h"

enum { SEQ_ALL = -1, TOK_NONE = -1 };

typedef enum {
    L_TOKEN, /* [rows, heads, inner]: rows = B*T, each (sequence, token) */
    L_STATE, /* [sequences, heads, inner] */
    L_PARAM  /* [heads, inner], shared by every sequence */
} layout;

typedef struct tensor {
    const char *name;
    const ls_tensor_desc *desc; /* the op table's tensor: its role and call argument */
    float *data;
    layout lay;
    int64_t heads, inner;
    int span;      /* units per head: head h covers units [h*span, (h+1)*span) */
    bool upstream; /* backward: a gradient of an output (d_o, d_y ...) */
} tensor;

enum { MAX_IN = 12, MAX_OUT = 10 };

typedef struct op_case {
    char name[96];
    const char *const *unused; /* the inputs that do not enter the op (NULL-terminated) */
    bool backward;
    bool elementwise; /* an output token depends on its own token only (the gate) */
    /* the generic case's backward: an input may not enter it (a bias the gradients never
     * read), which only a row can say, so a NaN in one need not show */
    bool nan_may_vanish;
    /* input "g" is a log decay (KDA without the gate in the kernel): its contract is g <= 0,
     * and a positive value (+Inf here) is refused once the kernels meet it */
    bool g_log_decay;
    int n_in, n_out;
    tensor in[MAX_IN], out[MAX_OUT];
    const int64_t *cu; /* sequence offsets of the rows, or NULL: T rows per sequence */
    int64_t B, T;
    const ls_op *op;
    const void *problem; /* the op's problem struct, pointing into the tensors */
    linseq_exec exec;
} op_case;

static size_t count(const op_case *oc, const tensor *t)
{
    const int64_t rows = t->lay == L_TOKEN   ? oc->B * oc->T
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

/* Runs the case's call through the op table (below). */
static linseq_status run(const op_case *oc);

static float *clean_out[MAX_OUT];
static int runs;

/* Poisons element idx of input i with value, runs, and checks every output element. */
static void poison_run(op_case *oc, int i, size_t idx, float value)
{
    tensor *t = &oc->in[i];
    const float saved = t->data[idx];
    t->data[idx] = value;
    for (int k = 0; k < oc->n_out; k++) tu_poison(oc->out[k].data, count(oc, &oc->out[k]) * 4);
    const linseq_status st = run(oc);
    t->data[idx] = saved;
    runs++;
    /* an input whose values the description bounds (LS_VALUES_IN: EMA's decay a) refuses a
     * non-finite value: LINSEQ_ERR_INVALID_VALUE naming it, no output written */
    if (t->desc->bounded) {
        bool written = false;
        for (int k = 0; k < oc->n_out; k++)
            written |= !tu_is_poisoned(oc->out[k].data, count(oc, &oc->out[k]) * 4);
        CHECK(st == LINSEQ_ERR_INVALID_VALUE && strstr(linseq_last_error(), t->name) && !written,
              "%s: %s[%zu] = %g: %s (%s); expected it refused, naming %s, nothing written",
              oc->name, t->name, idx, (double)value, linseq_status_string(st), linseq_last_error(),
              t->name);
        return;
    }
    if (oc->g_log_decay && strcmp(t->name, "g") == 0 && value > 0) {
        CHECK(st == LINSEQ_ERR_INVALID_VALUE && strstr(linseq_last_error(), "'g'") &&
                  strstr(linseq_last_error(), "positive"),
              "%s: g[%zu] = %g: %s (%s); expected it refused as a positive log decay", oc->name,
              idx, (double)value, linseq_status_string(st), linseq_last_error());
        return;
    }
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
          oc->name, t->name, idx, (double)value, leaked,
          leak_out >= 0 ? oc->out[leak_out].name : "", first_leak,
          leak_out >= 0 ? (double)oc->out[leak_out].data[first_leak] : 0.0,
          leak_out >= 0 ? (double)clean_out[leak_out][first_leak] : 0.0);
    /* A NaN must show: an output that silently absorbed it would hide the bad input. (An
     * Inf may legitimately vanish: a sigmoid of it, or e^-inf = 0 as a decay.) An input that
     * does not enter the op (no units) must change nothing, which the leak check saw. */
    CHECK(!isnan(value) || t->span == 0 || oc->nan_may_vanish || nonfinite > 0,
          "%s: NaN in %s[%zu] left every output finite", oc->name, t->name, idx);
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
    const linseq_status st = run(oc);
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
/* The tensors of a case are the op table's: every input and output (forward) or input,
 * upstream gradient and gradient (backward) the problem has, at the size the table gives,
 * passed by the table's calls. What the table does not know is the dependency rule: which
 * units an element belongs to. Each op lists it per input and output by name (a gradient
 * has its input's units, an upstream gradient its output's), with the range its values are
 * drawn from; the layout follows from the table (a per-token tensor, a state whose dims
 * start [N..., anything else a parameter). */

typedef struct unit_rule {
    const char *name; /* an input or output in the op table */
    int64_t heads, inner;
    int span;
    double lo, hi; /* inputs: uniform values (lo > hi: the table's distribution); upstream
                    * gradients are drawn from [-1, 1] */
} unit_rule;

static linseq_status run(const op_case *oc)
{
    float *out[LS_OP_MAX_OUT] = {0}, *grads[LS_OP_MAX_GRADS] = {0};
    const float *up[LS_OP_MAX_OUT] = {0};
    for (int i = 0; i < oc->n_in; i++)
        if (oc->in[i].desc->role == LS_ROLE_UPSTREAM) up[oc->in[i].desc->offset] = oc->in[i].data;
    for (int k = 0; k < oc->n_out; k++) {
        const ls_tensor_desc *t = oc->out[k].desc;
        if (t->role == LS_ROLE_OUTPUT) out[t->offset] = oc->out[k].data;
        for (int g = 0; t->role == LS_ROLE_GRAD && ls_op_tensor(oc->op, LS_ROLE_GRAD, g); g++)
            if (ls_op_tensor(oc->op, LS_ROLE_GRAD, g) == t) grads[g] = oc->out[k].data;
    }
    return oc->backward ? ls_op_backward(oc->op, oc->problem, &oc->exec, up, grads)
                        : oc->op->forward(oc->problem, &oc->exec, out);
}

static layout layout_of(const ls_tensor_desc *t)
{
    if (t->token) return L_TOKEN;
    /* a state: one row per sequence, [N_seq,...], or [B,...] for an op without varlen */
    return strncmp(t->dims, "[N", 2) == 0 || strncmp(t->dims, "[B,", 3) == 0 ? L_STATE : L_PARAM;
}

static bool enters(const op_case *oc, const char *input)
{
    for (const char *const *u = oc->unused; u && *u; u++)
        if (strcmp(*u, input) == 0) return false;
    return true;
}

static void free_case(op_case *oc)
{
    for (int i = 0; i < oc->n_in; i++) free(oc->in[i].data);
    for (int k = 0; k < oc->n_out; k++) free(oc->out[k].data);
}

/* The tensors of oc->op under problem (its sizes and options set), filled, and the problem
 * pointing at its inputs (every optional one given: each is poisoned in turn); then the case
 * runs. The inputs come first in the table, so a gradient that exists only with its input
 * (SSM1's dD_skip, conv's dbias) sees it. */
static void build_and_run(op_case *oc, void *problem, const unit_rule *rules, int n_rules,
                          tu_rng *r)
{
    const ls_op *op = oc->op;
    oc->problem = problem;
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        const bool output = t->role == (oc->backward ? LS_ROLE_GRAD : LS_ROLE_OUTPUT);
        const bool input =
            t->role == LS_ROLE_INPUT || (oc->backward && t->role == LS_ROLE_UPSTREAM);
        int64_t n;
        if (!(input || output) || !ls_tensor_count(t, problem, &n) || n == 0) continue;
        const char *rule_name = t->grad_of ? t->grad_of : t->name;
        const unit_rule *u = NULL;
        for (int k = 0; k < n_rules; k++)
            if (strcmp(rules[k].name, rule_name) == 0) u = &rules[k];
        if (!u || oc->n_in == MAX_IN || oc->n_out == MAX_OUT) {
            CHECK(0, "%s: %s: no unit rule, or more tensors than MAX_IN / MAX_OUT", oc->name,
                  t->name);
            continue;
        }
        tensor *x = output ? &oc->out[oc->n_out++] : &oc->in[oc->n_in++];
        *x = (tensor){.name = t->name,
                      .desc = t,
                      .lay = layout_of(t),
                      .heads = u->heads,
                      .inner = u->inner,
                      .span = enters(oc, rule_name) ? u->span : 0,
                      .upstream = t->role == LS_ROLE_UPSTREAM};
        CHECK((int64_t)count(oc, x) == n,
              "%s: %s has %lld elements in the op table, %zu by its "
              "unit rule",
              oc->name, t->name, (long long)n, count(oc, x));
        x->data = tu_alloc((size_t)n);
        if (t->role == LS_ROLE_INPUT && u->lo > u->hi) { /* the table's realistic values */
            int64_t dims[LS_OP_MAX_DIMS];
            const int nd = t->shape(problem, dims);
            ls_op_fill(t, x->data, n, dims, nd, tu_next(r));
            ls_tensor_set(t, problem, x->data);
        } else if (t->role == LS_ROLE_INPUT) {
            tu_fill_uniform(r, x->data, (size_t)n, u->lo, u->hi);
            ls_tensor_set(t, problem, x->data);
        } else if (t->role == LS_ROLE_UPSTREAM) {
            tu_fill_uniform(r, x->data, (size_t)n, -1, 1);
        }
    }
    run_case(oc);
    free_case(oc);
}

#define N_RULES(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const int64_t CU[3] = {0, 19, 40};

/* One row per op of the table: the problems it runs (a function of the op and the row) and
 * the inputs that do not enter its forward and its backward (NULL-terminated lists). */
typedef struct op_row {
    const char *op;
    void (*cases)(const ls_op *op, const struct op_row *row);
    const char *const unused_forward[4], *const unused_backward[4];
} op_row;

/* The calls a case runs: the forward, and the backward where the op has one. */
static int n_calls(const ls_op *op) { return op->backward ? 2 : 1; }

static op_case case_of(const ls_op *op, const op_row *row, bool varlen, bool backward)
{
    return (op_case){.op = op,
                     .unused = backward ? row->unused_backward : row->unused_forward,
                     .cu = varlen ? CU : NULL,
                     .B = varlen ? 1 : 2,
                     .T = varlen ? 40 : 20,
                     .backward = backward};
}

/* KDA and its segment summary: two layouts of the same 40 tokens (a packed row of 19 + 21, or
 * a batch of 2 x 20), in two flavours (per-channel decay with the gate in the kernel, l2norm
 * and beta logits; or per-head decay, raw g and V-first states). Units: the value heads; a qk
 * head belongs to the KG value heads of its group. The summary's P and R are states. */
enum { KH = 2, KHV = 4, KK = 8, KV = 8, KG = KHV / KH };

static void kda_case(const ls_op *op, const op_row *row, int flavour, int varlen, int mode,
                     int backward)
{
    const bool gate = flavour == 0;
    const int64_t gK = gate ? KK : 1;
    op_case oc = case_of(op, row, varlen, backward);
    oc.exec = (linseq_exec){.mode = (linseq_mode)mode, .chunk_size = 16};
    oc.g_log_decay = !gate;
    snprintf(oc.name, sizeof oc.name, "%s %s %s %s %s", op->name,
             gate ? "per-channel gate" : "per-head", varlen ? "varlen" : "batch",
             mode == LINSEQ_MODE_RECURRENT ? "recurrent" : "chunked",
             backward ? "backward" : "forward");
    tu_rng r = {1000u + (uint64_t)(flavour * 8 + varlen * 4 + mode * 2 + backward)};
    const unit_rule rules[] = {
        {"q", KH, KK, KG, -1, 1},
        {"k", KH, KK, KG, gate ? -1 : -0.3, gate ? 1 : 0.3},
        {"v", KHV, KV, 1, -1, 1},
        {"beta", KHV, 1, 1, gate ? -2 : 0.1, gate ? 2 : 0.9},
        {"g", KHV, gK, 1, gate ? -3 : -1, gate ? 1 : 0},
        {"h0", KHV, KK * KV, 1, -0.5, 0.5},
        {"A_log", KHV, 1, 1, -1, 0.5},
        {"dt_bias", KHV, KK, 1, -1, 1},
        {"o", KHV, KV, 1, 0, 0},
        {"ht", KHV, KK * KV, 1, 0, 0},
        {"P", KHV, KK * KK, 1, 0, 0},
        {"R", KHV, KK * KV, 1, 0, 0},
    };
    linseq_kda_problem p = {.B = oc.B,
                            .T = oc.T,
                            .H = KH,
                            .HV = KHV,
                            .K = KK,
                            .V = KV,
                            .cu_seqlens = oc.cu,
                            .n_seqs = varlen ? 2 : 0,
                            .decay = gate ? LINSEQ_DECAY_PER_CHANNEL : LINSEQ_DECAY_PER_HEAD,
                            .qk_l2norm = gate,
                            .beta_is_logit = gate,
                            .gate_in_kernel = gate,
                            .state_v_first = !gate};
    build_and_run(&oc, &p, rules, N_RULES(rules), &r);
}

static void kda_cases(const ls_op *op, const op_row *row)
{
    for (int flavour = 0; flavour < 2; flavour++)
        for (int varlen = 0; varlen < 2; varlen++)
            for (int mode = LINSEQ_MODE_RECURRENT; mode <= LINSEQ_MODE_CHUNKED; mode++)
                for (int backward = 0; backward < n_calls(op); backward++)
                    kda_case(op, row, flavour, varlen, mode, backward);
}

/* The standalone gate: elementwise, per (head, channel) unit; the batch is its "sequences". */
enum { GB = 2, GT = 6, GH = 2, GK = 8 };

static void gate_cases(const ls_op *op, const op_row *row)
{
    static const unit_rule rules[] = {
        {"g_raw", GH * GK, 1, 1, -3, 3},
        {"A_log", GH, 1, GK, -1, 1},
        {"dt_bias", GH * GK, 1, 1, -1, 1},
        {"g", GH * GK, 1, 1, 0, 0},
    };
    for (int lower = 0; lower < 2; lower++)
        for (int backward = 0; backward < n_calls(op); backward++) {
            op_case oc = {.op = op,
                          .unused = backward ? row->unused_backward : row->unused_forward,
                          .B = GB,
                          .T = GT,
                          .backward = backward,
                          .elementwise = true};
            snprintf(oc.name, sizeof oc.name, "%s %s %s", op->name,
                     lower ? "lower-bound" : "default", backward ? "backward" : "forward");
            tu_rng r = {2000u + (uint64_t)(lower * 2 + backward)};
            linseq_kda_gate_problem p = {.B = GB,
                                         .T = GT,
                                         .H = GH,
                                         .K = GK,
                                         .decay = LINSEQ_DECAY_PER_CHANNEL,
                                         .lower_bound = lower ? -5.0f : 0.0f};
            build_and_run(&oc, &p, rules, N_RULES(rules), &r);
        }
}

/* SSM1 and its segment summary: D channels in G groups; B_proj and C_proj belong to every
 * channel of their group. The summary's P and R are states. */
enum { SD = 8, SN = 4, SG = 2 };

static void ssm1_cases(const ls_op *op, const op_row *row)
{
    static const unit_rule rules[] = {
        {"x", SD, 1, 1, -1, 1},        {"dt", SD, 1, 1, -2, 1},       {"A", SD, SN, 1, -2, -0.1},
        {"B", SG, SN, SD / SG, -1, 1}, {"C", SG, SN, SD / SG, -1, 1}, {"D", SD, 1, 1, -1, 1},
        {"gate", SD, 1, 1, -2, 2},     {"dt_bias", SD, 1, 1, -1, 1},  {"h0", SD, SN, 1, -1, 1},
        {"y", SD, 1, 1, 0, 0},         {"hT", SD, SN, 1, 0, 0},       {"P", SD, SN, 1, 0, 0},
        {"R", SD, SN, 1, 0, 0},
    };
    for (int varlen = 0; varlen < 2; varlen++)
        for (int backward = 0; backward < n_calls(op); backward++) {
            op_case oc = case_of(op, row, varlen, backward);
            snprintf(oc.name, sizeof oc.name, "%s %s %s", op->name, varlen ? "varlen" : "batch",
                     backward ? "backward" : "forward");
            tu_rng r = {3000u + (uint64_t)(varlen * 2 + backward)};
            linseq_ssm1_problem p = {.B = oc.B,
                                     .T = oc.T,
                                     .D = SD,
                                     .N = SN,
                                     .G = SG,
                                     .cu_seqlens = oc.cu,
                                     .n_seqs = varlen ? 2 : 0,
                                     .dt_softplus = true};
            build_and_run(&oc, &p, rules, N_RULES(rules), &r);
        }
}

/* Causal conv1d: one unit per channel. */
enum { CD = 8, CW = 4 };

static void conv_cases(const ls_op *op, const op_row *row)
{
    static const unit_rule rules[] = {
        {"x", CD, 1, 1, -1, 1},    {"weight", CD, CW, 1, -1, 1},
        {"bias", CD, 1, 1, -1, 1}, {"conv_state", CD, CW - 1, 1, -1, 1},
        {"y", CD, 1, 1, 0, 0},     {"conv_state_out", CD, CW - 1, 1, 0, 0},
    };
    for (int varlen = 0; varlen < 2; varlen++)
        for (int backward = 0; backward < n_calls(op); backward++) {
            op_case oc = case_of(op, row, varlen, backward);
            snprintf(oc.name, sizeof oc.name, "%s %s %s", op->name, varlen ? "varlen" : "batch",
                     backward ? "backward" : "forward");
            tu_rng r = {4000u + (uint64_t)(varlen * 2 + backward)};
            linseq_conv1d_problem p = {.B = oc.B,
                                       .T = oc.T,
                                       .D = CD,
                                       .W = CW,
                                       .cu_seqlens = oc.cu,
                                       .n_seqs = varlen ? 2 : 0,
                                       .activation = LINSEQ_ACT_SILU};
            build_and_run(&oc, &p, rules, N_RULES(rules), &r);
        }
}

/* EMA: one unit per channel; forward-only, no varlen. Its decay a is refused when not finite. */
enum { ED = 8 };

static void ema_cases(const ls_op *op, const op_row *row)
{
    static const unit_rule rules[] = {
        {"x", ED, 1, 1, -1, 1}, {"a", ED, 1, 1, 0, 1},  {"h0", ED, 1, 1, -1, 1},
        {"y", ED, 1, 1, 0, 0},  {"hT", ED, 1, 1, 0, 0},
    };
    op_case oc = case_of(op, row, false, false);
    snprintf(oc.name, sizeof oc.name, "%s batch forward", op->name);
    tu_rng r = {5000u};
    linseq_ema_problem p = {.B = oc.B, .T = oc.T, .D = ED};
    build_and_run(&oc, &p, rules, N_RULES(rules), &r);
}

/* An op without a row below: one batch problem at small sizes (B = 2, T = 20, every other
 * size its benchmark default capped at 8, 0 kept), with its benchmark options and the table's
 * realistic values. The units are unknown, so each tensor is one unit: what is checked is the
 * sequences' isolation, causality, a NaN in the forward's inputs showing up, and the refusal
 * of bounded inputs. A row with the op's units (and the inputs its backward does not read)
 * makes the check finer. */
static void generic_rules(const op_case *oc, const void *problem, unit_rule *rules, int *n)
{
    for (int i = 0; i < oc->op->n_tensors && *n < MAX_IN + MAX_OUT; i++) {
        const ls_tensor_desc *t = &oc->op->tensors[i];
        int64_t count;
        if ((t->role != LS_ROLE_INPUT && t->role != LS_ROLE_OUTPUT) ||
            !ls_tensor_count(t, problem, &count) || count == 0)
            continue;
        const layout lay = layout_of(t);
        const int64_t rows = lay == L_TOKEN ? oc->B * oc->T : lay == L_STATE ? oc->B : 1;
        rules[(*n)++] = (unit_rule){t->name, 1, count / rows, 1, 1, 0};
    }
}

static void generic_cases(const ls_op *op, const op_row *row)
{
    _Alignas(16) unsigned char problem[1024] = {0};
    CHECK(op->problem_size <= sizeof problem, "%s: problem struct larger than the test's buffer",
          op->name);
    if (op->problem_size > sizeof problem) return;
    for (int call = 0; call < n_calls(op); call++) {
        op_case oc = case_of(op, row, false, call == 1);
        oc.nan_may_vanish = call == 1;
        snprintf(oc.name, sizeof oc.name, "%s batch %s (generic)", op->name,
                 call ? "backward" : "forward");
        memset(problem, 0, sizeof problem);
        for (int i = 0; i < op->n_sizes; i++) {
            const ls_size_desc *s = &op->sizes[i];
            const int64_t d = s->bench_default < 8 ? s->bench_default : 8;
            ls_size_set(s, problem,
                        !strcmp(s->name, "B")   ? oc.B
                        : !strcmp(s->name, "T") ? oc.T
                                                : d);
        }
        if (op->bench_options) op->bench_options(problem);
        unit_rule rules[MAX_IN + MAX_OUT];
        int n = 0;
        generic_rules(&oc, problem, rules, &n);
        tu_rng r = {7000u + (uint64_t)call};
        build_and_run(&oc, problem, rules, n, &r);
    }
}

static const op_row generic_row = {"", generic_cases, {NULL}, {NULL}};

/* Every op of the table, by name. What does not enter a segment summary: linseq.h (q of KDA's;
 * C_proj, D_skip and the gate of SSM1's; C_proj, D_skip and z of SSD's). Their backwards,
 * though, pass a NaN or Inf in q or C on to the other gradients (as 0 * inf would): they are
 * held to the rule of an input that enters, which they meet. */
static const op_row rows[] = {
    {"kda", kda_cases, {NULL}, {NULL}},
    {"kda_gate", gate_cases, {NULL}, {NULL}},
    {"ssm1", ssm1_cases, {NULL}, {NULL}},
    {"causal_conv1d", conv_cases, {NULL}, {NULL}},
    {"kda_segment", kda_cases, {"q", NULL}, {NULL}},
    {"ssm1_segment", ssm1_cases, {"C", "D", "gate", NULL}, {"D", "gate", NULL}},
    {"ema", ema_cases, {NULL}, {NULL}},
    /* SSD's summary, at the generic case's units: C_proj, D_skip and z do not enter */
    {"ssd_segment", generic_cases, {"C", "D", "z", NULL}, {"D", "z", NULL}},
};
#define N_ROWS ((int)(sizeof rows / sizeof rows[0]))

int main(void)
{
    /* a hang is a failure too: the default action of SIGALRM ends the process */
    alarm(600);
    int n_ops;
    const ls_op *const *ops = ls_ops(&n_ops);
    for (int i = 0; i < n_ops; i++) {
        const op_row *row = NULL;
        for (int k = 0; k < N_ROWS; k++)
            if (strcmp(rows[k].op, ops[i]->name) == 0) row = &rows[k];
        if (!row) printf("  %s: no row, the generic case (one unit per tensor)\n", ops[i]->name);
        if (!row) row = &generic_row;
        row->cases(ops[i], row);
    }
    for (int k = 0; k < N_ROWS; k++)
        CHECK(ls_op_find(rows[k].op) != NULL, "row %s names no op of the table", rows[k].op);
    printf("  %d poisoned runs over %d ops\n", runs, n_ops);
    return tu_finish("test_nonfinite");
}
