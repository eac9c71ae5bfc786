/* The op table against the structs and calls it describes: its fields tile each public
 * struct exactly (so a binding laid out from it cannot misbind a field, and a field added
 * to linseq.h without a table entry fails here), its tensors are consistent (every gradient
 * of an input, every upstream gradient of an output, call arguments in order), the JSON
 * export says the same, and a call through the table equals the direct call bit for bit. */
#include <math.h>
#include <stdalign.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "optable/optable.h"
#include "testutil.h"

static size_t align_of(ls_ctype t)
{
    switch (t) {
    case LS_CTYPE_I64: return alignof(int64_t);
    case LS_CTYPE_F32: return alignof(float);
    case LS_CTYPE_BOOL: return alignof(bool);
    case LS_CTYPE_ENUM: return alignof(linseq_mode);
    case LS_CTYPE_INT: return alignof(int);
    default: return alignof(void *);
    }
}

/* Sorted fields tile [0, size): each starts at the first offset its alignment allows after
 * the previous one, and the struct ends at the first multiple of the largest alignment. */
static void check_tiling(const char *what, const ls_field *f, int n, size_t size)
{
    size_t at = 0, max_align = 1;
    for (int i = 0; i < n; i++) {
        const size_t al = align_of(f[i].type);
        const size_t expected = (at + al - 1) / al * al;
        CHECK(f[i].offset == expected,
              "%s.%s at offset %zu, expected %zu: a field of the "
              "struct is missing from the op table, or has the wrong type",
              what, f[i].name, f[i].offset, expected);
        at = f[i].offset + f[i].size;
        if (al > max_align) max_align = al;
    }
    const size_t end = (at + max_align - 1) / max_align * max_align;
    CHECK(end == size, "%s: the table's fields end at %zu, sizeof is %zu (a field is missing)",
          what, end, size);
}

static void check_layouts(const ls_op *op)
{
    ls_field f[LS_OP_MAX_FIELDS];
    check_tiling(op->problem_type, f, ls_op_fields(op, false, f), op->problem_size);
    if (!op->backward) { /* a forward-only op has no grads struct (check_offers) */
        CHECK(ls_op_fields(op, true, f) == 0, "%s: grads fields without a backward", op->name);
        return;
    }
    check_tiling(op->grads_type, f, ls_op_fields(op, true, f), op->grads_size);
    CHECK(op->grads_size <= LS_OP_GRADS_BYTES, "%s: %zu bytes, LS_OP_GRADS_BYTES is %zu",
          op->grads_type, op->grads_size, (size_t)LS_OP_GRADS_BYTES);
}

/* What an op offers hangs together, so that a consumer may test one field for each: a
 * backward has a grads struct and gradient tensors, and a forward-only op has neither, nor a
 * training step; a training step is its three calls; decode names its state, an input, and
 * the output that is that state (which may alias it). */
static void check_offers(const ls_op *op)
{
    const bool bwd = op->backward != NULL;
    CHECK(bwd == (op->grads_type != NULL) && bwd == (op->grads_size > 0),
          "%s: backward %s, grads_type %s, grads_size %zu disagree", op->name, bwd ? "set" : "NULL",
          op->grads_type ? op->grads_type : "NULL", op->grads_size);
    CHECK(bwd == (ls_op_count(op, LS_ROLE_GRAD) > 0) &&
              bwd == (ls_op_count(op, LS_ROLE_UPSTREAM) > 0),
          "%s: backward %s, but %d gradient and %d upstream tensors", op->name,
          bwd ? "set" : "NULL", ls_op_count(op, LS_ROLE_GRAD), ls_op_count(op, LS_ROLE_UPSTREAM));
    const bool train = op->forward_train != NULL;
    CHECK(train == (op->backward_saved != NULL) && train == (op->saved_size != NULL),
          "%s: a training step needs saved_size, forward_train and backward_saved", op->name);
    CHECK(bwd || (!train && !op->bench_fwdbwd), "%s: a training step without a backward", op->name);
    CHECK(ls_op_count(op, LS_ROLE_OUTPUT) >= 1, "%s: no output", op->name);
    const bool decode = op->decode != NULL;
    CHECK(decode == (op->decode_state != NULL) && decode == (op->decode_state_out != NULL),
          "%s: decode needs decode_state and decode_state_out", op->name);
    if (decode) {
        const ls_tensor_desc *in = ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state);
        const ls_tensor_desc *out = ls_op_tensor_named(op, LS_ROLE_OUTPUT, op->decode_state_out);
        CHECK(in && out, "%s: decode's state %s / %s is not an input / an output", op->name,
              op->decode_state, op->decode_state_out);
        CHECK(!out || !out->alias_of || strcmp(out->alias_of, op->decode_state) == 0,
              "%s: decode's state %s aliases %s", op->name, op->decode_state_out, out->alias_of);
    }
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        if (!t->alias_of) continue;
        CHECK(t->role == LS_ROLE_OUTPUT && ls_op_tensor_named(op, LS_ROLE_INPUT, t->alias_of),
              "%s: %s aliases %s, which is not an input (or %s is no output)", op->name, t->name,
              t->alias_of, t->name);
    }
}

static void check_tensors(const ls_op *op)
{
    for (int r = LS_ROLE_OUTPUT; r <= LS_ROLE_UPSTREAM; r++)
        for (int i = 0; ls_op_tensor(op, (ls_op_role)r, i); i++)
            CHECK(ls_op_tensor(op, (ls_op_role)r, i)->offset == (size_t)i,
                  "%s: call argument %s is not at index %d", op->name,
                  ls_op_tensor(op, (ls_op_role)r, i)->name, i);
    CHECK(ls_op_count(op, LS_ROLE_OUTPUT) <= LS_OP_MAX_OUT, "%s: too many outputs", op->name);
    CHECK(ls_op_count(op, LS_ROLE_GRAD) <= LS_OP_MAX_GRADS, "%s: too many grads", op->name);
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        if (t->role == LS_ROLE_GRAD)
            CHECK(t->grad_of && ls_op_tensor_named(op, LS_ROLE_INPUT, t->grad_of),
                  "%s: %s is the gradient of no input", op->name, t->name);
        if (t->role == LS_ROLE_UPSTREAM)
            CHECK(t->grad_of && ls_op_tensor_named(op, LS_ROLE_OUTPUT, t->grad_of),
                  "%s: %s is the gradient of no output", op->name, t->name);
        /* unique across roles: linseq_op_tensor_shape finds a tensor by its name alone */
        for (int j = 0; j < i; j++)
            CHECK(strcmp(op->tensors[j].name, t->name) != 0, "%s: %s listed twice", op->name,
                  t->name);
    }
}

static const cJSON *item(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

/* What the JSON says an op offers (a binding skips what it lacks) and its tensors' flags. */
static void check_json_offers(const ls_op *op, const cJSON *jop)
{
    const cJSON *grads = item(jop, "grads"), *decode = item(jop, "decode");
    CHECK(cJSON_IsNull(grads) == !op->backward && cJSON_IsBool(item(jop, "backward")) &&
              cJSON_IsTrue(item(jop, "backward")) == (op->backward != NULL),
          "%s: JSON backward / grads", op->name);
    CHECK(cJSON_IsBool(item(jop, "training")) &&
              cJSON_IsTrue(item(jop, "training")) == (op->forward_train != NULL),
          "%s: JSON training", op->name);
    CHECK(cJSON_IsBool(item(jop, "modes")) && cJSON_IsTrue(item(jop, "modes")) == op->has_modes,
          "%s: JSON modes", op->name);
    CHECK(cJSON_IsNull(decode) == !op->decode, "%s: JSON decode", op->name);
    if (op->decode && cJSON_IsObject(decode))
        CHECK(strcmp(cJSON_GetStringValue(item(decode, "state")), op->decode_state) == 0 &&
                  strcmp(cJSON_GetStringValue(item(decode, "state_out")), op->decode_state_out) ==
                      0,
              "%s: JSON decode state", op->name);
    for (int t = 0; t < op->n_tensors && t < cJSON_GetArraySize(item(jop, "tensors")); t++) {
        const cJSON *jt = cJSON_GetArrayItem(item(jop, "tensors"), t);
        const char *alias = cJSON_GetStringValue(item(jt, "alias_of"));
        const ls_tensor_desc *d = &op->tensors[t];
        CHECK(cJSON_IsTrue(item(jt, "token")) == d->token &&
                  (alias && d->alias_of ? strcmp(alias, d->alias_of) == 0 : !alias == !d->alias_of),
              "%s.%s: JSON token / alias_of", op->name, d->name);
    }
}

/* The JSON a binding reads names the same fields at the same offsets. */
static void check_json(void)
{
    const char *text = linseq_op_table_json();
    CHECK(text != NULL, "linseq_op_table_json returned NULL");
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK(root != NULL, "linseq_op_table_json is not valid JSON");
    if (!root) return;
    CHECK(cJSON_IsNumber(item(item(root, "exec"), "size")) &&
              item(item(root, "exec"), "size")->valuedouble == (double)sizeof(linseq_exec),
          "exec.size");
    int n_ops;
    const ls_op *const *ops = ls_ops(&n_ops);
    const cJSON *jops = item(root, "ops");
    CHECK(cJSON_GetArraySize(jops) == n_ops, "ops: %d in JSON, %d in the table",
          cJSON_GetArraySize(jops), n_ops);
    for (int i = 0; i < n_ops && i < cJSON_GetArraySize(jops); i++) {
        const cJSON *jop = cJSON_GetArrayItem(jops, i), *prob = item(jop, "problem");
        ls_field f[LS_OP_MAX_FIELDS];
        const int n = ls_op_fields(ops[i], false, f);
        CHECK(strcmp(cJSON_GetStringValue(item(jop, "name")), ops[i]->name) == 0, "op name");
        CHECK(item(prob, "size")->valuedouble == (double)ops[i]->problem_size, "%s size",
              ops[i]->name);
        CHECK(cJSON_GetArraySize(item(prob, "fields")) == n, "%s field count", ops[i]->name);
        for (int k = 0; k < n && k < cJSON_GetArraySize(item(prob, "fields")); k++) {
            const cJSON *jf = cJSON_GetArrayItem(item(prob, "fields"), k);
            CHECK(strcmp(cJSON_GetStringValue(item(jf, "name")), f[k].name) == 0 &&
                      item(jf, "offset")->valuedouble == (double)f[k].offset,
                  "%s field %d", ops[i]->name, k);
        }
        CHECK(cJSON_GetArraySize(item(jop, "tensors")) == ops[i]->n_tensors, "%s tensors",
              ops[i]->name);
        check_json_offers(ops[i], jop);
    }
    cJSON_Delete(root);
}

/* The problem struct copied into an output buffer (the forward's first output, or the first
 * gradient for the backward): the kernels would read its fields while writing over them, so
 * the call must be refused as aliasing, naming the struct, with nothing written. (An SSM1
 * forward with its struct inside y crashed before the structs took part in the check.) */
static void check_struct_inside_output(const ls_op *op, const void *problem, float *buf,
                                       const ls_tensor_desc *t, float *const *out, float *const *up,
                                       float *const *grads, bool backward)
{
    int64_t n = 0;
    if (!buf || !ls_tensor_count(t, problem, &n) ||
        (size_t)n * sizeof(float) < op->problem_size + 64)
        return;
    /* the buffer's values go back afterwards: the struct's bytes read as floats may be NaN,
     * which the caller's check of the call's outputs would take for an unwritten element */
    float *values = tu_alloc((size_t)n);
    memcpy(values, buf, (size_t)n * sizeof(float));
    void *inside = (unsigned char *)buf + 32; /* keeps the struct's alignment */
    memcpy(inside, problem, op->problem_size);
    float *before = tu_alloc((size_t)n);
    memcpy(before, buf, (size_t)n * sizeof(float));
    const linseq_exec ex = {.threads = 1};
    const linseq_status st = backward
                                 ? ls_op_backward(op, inside, &ex, (const float *const *)up, grads)
                                 : op->forward(inside, &ex, out);
    CHECK(st == LINSEQ_ERR_ALIASING && strstr(linseq_last_error(), "problem struct"),
          "%s %s with its problem struct inside %s: %s (%s)", op->name,
          backward ? "backward" : "forward", t->name, linseq_status_string(st),
          linseq_last_error());
    CHECK(memcmp(before, buf, (size_t)n * sizeof(float)) == 0, "%s: %s written by a refused call",
          op->name, t->name);
    memcpy(buf, values, (size_t)n * sizeof(float));
    free(before), free(values);
}

/* Realistic inputs at the benchmark's options and small sizes, through the table's calls:
 * every output and gradient the table declares is written (each is NaN before the call and
 * finite after), so no argument of an adapter is dropped or swapped with an absent one. */
enum { PROBLEM_BYTES = 512 };

/* The benchmark's options at small sizes: the problem every call below runs. */
static void small_problem(const ls_op *op, void *problem)
{
    CHECK(op->problem_size <= PROBLEM_BYTES, "%s: problem struct too large", op->name);
    for (int i = 0; i < op->n_sizes; i++) {
        const int64_t d = op->sizes[i].bench_default;
        ls_size_set(&op->sizes[i], problem, d > 64 ? 8 + d % 23 : d);
    }
    if (op->bench_options) op->bench_options(problem);
}

/* An output that may be its input's buffer has that input's shape. */
static void check_alias_shape(const ls_op *op, const void *problem, const ls_tensor_desc *t)
{
    const ls_tensor_desc *in =
        t->alias_of ? ls_op_tensor_named(op, LS_ROLE_INPUT, t->alias_of) : NULL;
    if (!in) return;
    int64_t a[LS_OP_MAX_DIMS], b[LS_OP_MAX_DIMS];
    const int na = t->shape(problem, a), nb = in->shape(problem, b);
    bool same = na == nb;
    for (int d = 0; same && d < na; d++) same = a[d] == b[d];
    CHECK(same, "%s: %s may be %s's buffer but has another shape", op->name, t->name, in->name);
}

/* linseq_op_forward(op's name) writes the bits the table's forward wrote into out. */
static void check_forward_by_name(const ls_op *op, const void *problem, const linseq_exec *ex,
                                  float *const *out)
{
    float *again[LS_OP_MAX_OUT] = {0};
    int64_t n[LS_OP_MAX_OUT] = {0};
    for (int k = 0; ls_op_tensor(op, LS_ROLE_OUTPUT, k); k++)
        if (out[k] && ls_tensor_count(ls_op_tensor(op, LS_ROLE_OUTPUT, k), problem, &n[k]))
            again[k] = tu_alloc((size_t)n[k]);
    CHECK_OK(linseq_op_forward(op->name, problem, ex, again));
    for (int k = 0; k < LS_OP_MAX_OUT; k++) {
        CHECK(!again[k] || memcmp(again[k], out[k], (size_t)n[k] * sizeof(float)) == 0,
              "%s: linseq_op_forward differs from the table's forward in output %d", op->name, k);
        free(again[k]);
    }
}

/* The calls by name refuse an unknown op, a call the op lacks and a missing array, naming
 * them. */
static void check_calls_by_name_refused(void)
{
    linseq_kda_problem kp = {.B = 1, .T = 1, .H = 1, .K = 1, .V = 1};
    float *none[LS_OP_MAX_OUT] = {0};
    CHECK(linseq_op_forward("frob", &kp, NULL, none) == LINSEQ_ERR_INVALID_VALUE &&
              strstr(linseq_last_error(), "'frob'"),
          "linseq_op_forward of an unknown op: %s", linseq_last_error());
    CHECK(linseq_op_forward("kda", &kp, NULL, NULL) == LINSEQ_ERR_NULL_POINTER &&
              strstr(linseq_last_error(), "outputs"),
          "linseq_op_forward without outputs: %s", linseq_last_error());
    int n_ops;
    const ls_op *const *ops = ls_ops(&n_ops);
    for (int i = 0; i < n_ops; i++) {
        if (!ops[i]->decode)
            CHECK(linseq_op_decode(ops[i]->name, &kp, NULL, NULL, 1, NULL, none) ==
                          LINSEQ_ERR_UNSUPPORTED &&
                      strstr(linseq_last_error(), ops[i]->name),
                  "linseq_op_decode of %s, which has none: %s", ops[i]->name, linseq_last_error());
        if (!ops[i]->backward)
            CHECK(linseq_op_backward(ops[i]->name, &kp, NULL, (const float *const *)none, NULL) ==
                          LINSEQ_ERR_UNSUPPORTED &&
                      strstr(linseq_last_error(), ops[i]->name),
                  "linseq_op_backward of %s, which has none: %s", ops[i]->name,
                  linseq_last_error());
    }
}

static void check_calls(const ls_op *op)
{
    _Alignas(max_align_t) unsigned char problem[PROBLEM_BYTES] = {0};
    small_problem(op, problem);
    float *bufs[LS_OP_MAX_TENSORS] = {0};
    float *out[LS_OP_MAX_OUT] = {0}, *up[LS_OP_MAX_OUT] = {0}, *grads[LS_OP_MAX_GRADS] = {0};
    int64_t count[LS_OP_MAX_TENSORS] = {0};
    int n_out = 0, n_up = 0, n_grads = 0;
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        int64_t dims[LS_OP_MAX_DIMS];
        const int nd = t->shape(problem, dims);
        CHECK(ls_tensor_count(t, problem, &count[i]), "%s.%s count", op->name, t->name);
        int64_t pub[LINSEQ_OP_MAX_DIMS];
        const int pub_nd = linseq_op_tensor_shape(op->name, t->name, problem, pub);
        bool same = pub_nd == nd;
        for (int d = 0; same && d < nd; d++) same = pub[d] == dims[d];
        CHECK(same, "%s.%s: linseq_op_tensor_shape disagrees with the table", op->name, t->name);
        check_alias_shape(op, problem, t);
        const bool present = nd > 0 && (t->role != LS_ROLE_INPUT || t->required || t->bench);
        bufs[i] = present ? tu_alloc((size_t)count[i]) : NULL;
        const bool written = t->role == LS_ROLE_OUTPUT || t->role == LS_ROLE_GRAD;
        for (int64_t k = 0; bufs[i] && written && k < count[i]; k++) bufs[i][k] = NAN;
        if (bufs[i] && !written) ls_op_fill(t, bufs[i], count[i], dims, nd, 1000u + (uint64_t)i);
        if (t->role == LS_ROLE_INPUT) ls_tensor_set(t, problem, bufs[i]);
        if (t->role == LS_ROLE_OUTPUT) out[n_out++] = bufs[i];
        if (t->role == LS_ROLE_UPSTREAM) up[n_up++] = bufs[i];
        if (t->role == LS_ROLE_GRAD) grads[n_grads++] = bufs[i];
    }
    const linseq_exec ex = {.threads = 1};
    CHECK_OK(op->forward(problem, &ex, out));
    check_forward_by_name(op, problem, &ex, out);
    if (op->backward)
        CHECK_OK(ls_op_backward(op, problem, &ex, (const float *const *)up, grads));
    else
        CHECK(ls_op_backward(op, problem, &ex, (const float *const *)up, grads) ==
                  LINSEQ_ERR_UNSUPPORTED,
              "%s: forward-only, but ls_op_backward does not refuse", op->name);
    check_struct_inside_output(op, problem, out[0], ls_op_tensor(op, LS_ROLE_OUTPUT, 0), out, up,
                               grads, false);
    check_struct_inside_output(op, problem, grads[0], ls_op_tensor(op, LS_ROLE_GRAD, 0), out, up,
                               grads, true);
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        bool finite = true;
        for (int64_t k = 0; bufs[i] && k < count[i]; k++) finite = finite && isfinite(bufs[i][k]);
        CHECK(finite, "%s.%s: not every element written by the call through the table", op->name,
              t->name);
        free(bufs[i]);
    }
}

/* Realistic values for an input of the problem that exists and that a benchmark passes, set
 * into the problem; NULL (and unset) otherwise. The caller frees it. */
static float *given_input(const ls_tensor_desc *t, void *problem, uint64_t seed)
{
    int64_t dims[LS_OP_MAX_DIMS], n = 0;
    const int nd = t->shape(problem, dims);
    if (!nd || !(t->required || t->bench) || !ls_tensor_count(t, problem, &n)) return NULL;
    float *x = tu_alloc((size_t)n);
    ls_op_fill(t, x, n, dims, nd, seed);
    ls_tensor_set(t, problem, x);
    return x;
}

static bool all_finite(const float *x, int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        if (!isfinite(x[k])) return false;
    return true;
}

/* One decode step through the table: B requests on rows 0 .. B-1 of a pool shaped like the
 * decode state (rows NULL); every output but the state is written, and the pool stays finite. */
static void check_decode(const ls_op *op)
{
    if (!op->decode) return;
    _Alignas(max_align_t) unsigned char problem[PROBLEM_BYTES] = {0};
    small_problem(op, problem);
    const ls_size_desc *T = NULL;
    for (int i = 0; i < op->n_sizes; i++)
        if (strcmp(op->sizes[i].name, "T") == 0) T = &op->sizes[i];
    CHECK(T != NULL, "%s: decode, but no size T to set to 1", op->name);
    if (T) ls_size_set(T, problem, 1);
    const ls_tensor_desc *state = ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state);
    int64_t dims[LS_OP_MAX_DIMS], n_pool = 0, n_rows = 0, count[LS_OP_MAX_TENSORS] = {0};
    const int nd = state ? state->shape(problem, dims) : 0;
    CHECK(nd > 0 && ls_tensor_count(state, problem, &n_pool), "%s: decode state", op->name);
    for (int i = 0; i < op->n_sizes; i++)
        if (strcmp(op->sizes[i].name, "B") == 0) n_rows = ls_size_get(&op->sizes[i], problem);
    float *bufs[LS_OP_MAX_TENSORS] = {0}, *out[LS_OP_MAX_OUT] = {0};
    float *pool = tu_alloc((size_t)n_pool);
    if (nd > 0) ls_op_fill(state, pool, n_pool, dims, nd, 77);
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        if (t->role == LS_ROLE_INPUT && t != state)
            bufs[i] = given_input(t, problem, 2000u + (uint64_t)i);
        if (t->role != LS_ROLE_OUTPUT || strcmp(t->name, op->decode_state_out) == 0 ||
            !ls_tensor_count(t, problem, &count[i]) || count[i] == 0)
            continue;
        bufs[i] = out[t->offset] = tu_alloc((size_t)count[i]);
        for (int64_t k = 0; k < count[i]; k++) bufs[i][k] = NAN;
    }
    const linseq_exec ex = {.threads = 1};
    CHECK_OK(op->decode(problem, &ex, pool, n_rows, NULL, out));
    for (int i = 0; i < op->n_tensors; i++) {
        if (op->tensors[i].role == LS_ROLE_OUTPUT)
            CHECK(!bufs[i] || all_finite(bufs[i], count[i]), "%s decode: %s not written", op->name,
                  op->tensors[i].name);
        free(bufs[i]);
    }
    CHECK(all_finite(pool, n_pool), "%s decode: the state pool is not finite", op->name);
    free(pool);
}

/* Every size at the ends of its range: each shape function and ls_tensor_count must answer
 * without signed overflow (test-sanitize runs this under UBSan; conv's W - 1 at INT64_MIN
 * was one, found by fuzzing), and a negative or overflowing size must be refused by the
 * count, never give a count that looks valid. */
static void check_extreme_sizes(const ls_op *op)
{
    static const int64_t extremes[] = {INT64_MIN, -1, 0, INT64_MAX};
    void *problem = calloc(1, op->problem_size);
    for (int s = 0; s < op->n_sizes; s++)
        for (size_t e = 0; e < sizeof extremes / sizeof extremes[0]; e++) {
            for (int i = 0; i < op->n_sizes; i++) ls_size_set(&op->sizes[i], problem, 3);
            ls_size_set(&op->sizes[s], problem, extremes[e]);
            for (int t = 0; t < op->n_tensors; t++) {
                int64_t dims[LS_OP_MAX_DIMS], count = 0;
                const int nd = op->tensors[t].shape(problem, dims);
                const bool ok = ls_tensor_count(&op->tensors[t], problem, &count);
                bool negative = false;
                for (int d = 0; d < nd; d++) negative = negative || dims[d] < 0;
                CHECK(!(ok && negative), "%s.%s with %s = %lld: a negative dim counted as %lld",
                      op->name, op->tensors[t].name, op->sizes[s].name, (long long)extremes[e],
                      (long long)count);
                CHECK(!ok || count >= 0, "%s.%s: negative count", op->name, op->tensors[t].name);
                int64_t pub[LINSEQ_OP_MAX_DIMS];
                CHECK(ok || linseq_op_tensor_shape(op->name, op->tensors[t].name, problem, pub) < 0,
                      "%s.%s: linseq_op_tensor_shape gave a shape the count refuses", op->name,
                      op->tensors[t].name);
            }
        }
    free(problem);
}

static void check_op(const ls_op *op)
{
    check_layouts(op);
    check_offers(op);
    check_tensors(op);
    check_calls(op);
    check_decode(op);
    check_extreme_sizes(op);
}

/* A forward-only op with a decode step, as the table may hold: SSM1 without its backward, its
 * gradient tensors or its training step. The checks above must take it as they take every op
 * (until the table holds such an op, this is what runs their forward-only branches). */
static void check_forward_only_twin(void)
{
    const ls_op *ssm1 = ls_op_find("ssm1");
    CHECK(ssm1 && ssm1->decode, "no SSM1 with a decode step to make the twin of");
    if (!ssm1 || !ssm1->decode) return;
    static ls_tensor_desc tensors[LS_OP_MAX_TENSORS];
    ls_op twin = *ssm1;
    twin.n_tensors = 0;
    for (int i = 0; i < ssm1->n_tensors; i++)
        if (ssm1->tensors[i].role == LS_ROLE_INPUT || ssm1->tensors[i].role == LS_ROLE_OUTPUT)
            tensors[twin.n_tensors++] = ssm1->tensors[i];
    twin.tensors = tensors;
    twin.backward = NULL;
    twin.grads_type = NULL;
    twin.grads_size = 0;
    twin.saved_size = NULL;
    twin.forward_train = NULL;
    twin.backward_saved = NULL;
    twin.bench_fwdbwd = false;
    check_op(&twin);
}

/* A tensor's dims text under the options: the alternative a boolean option names when set,
 * and its shape agrees (the conv's tap-major weight and states). */
static void check_dims_under_options(void)
{
    const ls_op *op = ls_op_find("causal_conv1d");
    const ls_tensor_desc *w = ls_op_tensor_named(op, LS_ROLE_INPUT, "weight");
    const ls_tensor_desc *s = ls_op_tensor_named(op, LS_ROLE_INPUT, "conv_state");
    linseq_conv1d_problem p = {.B = 2, .T = 3, .D = 5, .W = 4};
    char text[64];
    int64_t d[LS_OP_MAX_DIMS];
    CHECK(!strcmp(ls_tensor_dims(op, w, &p, text, sizeof text), "[D,W]") && w->shape(&p, d) == 2 &&
              d[0] == 5 && d[1] == 4,
          "conv weight: dims %s", text);
    p.weight_tap_major = true;
    CHECK(!strcmp(ls_tensor_dims(op, w, &p, text, sizeof text), "[W,D]") && w->shape(&p, d) == 2 &&
              d[0] == 4 && d[1] == 5,
          "conv weight_tap_major: dims %s", text);
    CHECK(!strcmp(ls_tensor_dims(op, s, &p, text, sizeof text), "[N_seq,D,W-1]"),
          "conv state: dims %s", text);
    p.state_tap_major = true;
    CHECK(!strcmp(ls_tensor_dims(op, s, &p, text, sizeof text), "[N_seq,W-1,D]") &&
              s->shape(&p, d) == 3 && d[1] == 3 && d[2] == 5,
          "conv state_tap_major: dims %s", text);
    CHECK(!strcmp(
              ls_tensor_dims(op, ls_op_tensor_named(op, LS_ROLE_INPUT, "x"), &p, text, sizeof text),
              "[B,T,D]"),
          "conv x: dims %s", text);
}

int main(void)
{
    int n_ops, n_exec;
    const ls_op *const *ops = ls_ops(&n_ops);
    const ls_field *ef = ls_exec_fields(&n_exec);
    check_tiling("linseq_exec", ef, n_exec, sizeof(linseq_exec));
    int n_pool;
    const ls_field *pf = ls_state_pool_fields(&n_pool);
    check_tiling("linseq_state_pool", pf, n_pool, sizeof(linseq_state_pool));
    for (int i = 0; i < n_ops; i++) {
        check_op(ops[i]);
        CHECK(ls_op_find(ops[i]->name) == ops[i], "ls_op_find(%s)", ops[i]->name);
    }
    check_forward_only_twin();
    check_calls_by_name_refused();
    check_json();
    check_dims_under_options();
    int64_t dims[LINSEQ_OP_MAX_DIMS];
    linseq_kda_problem kp = {.B = 1, .T = 1, .H = 1, .K = 1, .V = 1};
    CHECK(linseq_op_tensor_shape("frob", "q", &kp, dims) == -1, "unknown op");
    CHECK(linseq_op_tensor_shape("kda", "frob", &kp, dims) == -1, "unknown tensor");
    CHECK(linseq_op_tensor_shape("kda", "q", NULL, dims) == -1, "NULL problem");
    CHECK(linseq_op_tensor_shape("kda", "g", &kp, dims) == 0, "g without decay");
    return tu_finish("optable");
}
