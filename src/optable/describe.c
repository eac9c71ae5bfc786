/* The layouts of the public structs, derived from the op table, and the table as JSON for
 * bindings (linseq_op_table_json): a binding lays out its copies of the structs from this
 * text instead of repeating linseq.h field by field. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optable/optable.h"

static const size_t ctype_size[] = {[LS_CTYPE_I64] = sizeof(int64_t),
                                    [LS_CTYPE_F32] = sizeof(float),
                                    [LS_CTYPE_BOOL] = sizeof(bool),
                                    [LS_CTYPE_ENUM] = sizeof(linseq_mode),
                                    [LS_CTYPE_INT] = sizeof(int),
                                    [LS_CTYPE_PTR] = sizeof(void *),
                                    [LS_CTYPE_STRIDES] = sizeof(linseq_strides)};
static const char *const ctype_name[] = {
    [LS_CTYPE_I64] = "int64",      [LS_CTYPE_F32] = "float32", [LS_CTYPE_BOOL] = "bool",
    [LS_CTYPE_ENUM] = "enum",      [LS_CTYPE_INT] = "int",     [LS_CTYPE_PTR] = "pointer",
    [LS_CTYPE_STRIDES] = "strides"};
static const char *const role_name[] = {[LS_ROLE_INPUT] = "input",
                                        [LS_ROLE_OUTPUT] = "output",
                                        [LS_ROLE_UPSTREAM] = "upstream",
                                        [LS_ROLE_GRAD] = "grad"};

static int add_field(ls_field *out, int n, const char *name, ls_ctype type, size_t offset)
{
    for (int i = 0; i < n; i++)
        if (out[i].offset == offset) return n; /* two keys for one field (SSM1's activation) */
    if (n == LS_OP_MAX_FIELDS) return n;
    out[n] = (ls_field){name, type, offset, ctype_size[type]};
    return n + 1;
}

static int by_offset(const void *a, const void *b)
{
    const ls_field *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

int ls_op_fields(const ls_op *op, bool grads, ls_field *out)
{
    int n = 0;
    if (!grads) {
        for (int i = 0; i < op->n_sizes; i++)
            n = add_field(out, n, op->sizes[i].name, LS_CTYPE_I64, op->sizes[i].offset);
        for (int i = 0; i < op->n_options; i++)
            n = add_field(out, n, op->options[i].field, op->options[i].type, op->options[i].offset);
        if (op->varlen) {
            n = add_field(out, n, "cu_seqlens", LS_CTYPE_PTR, op->cu_seqlens_offset);
            n = add_field(out, n, "n_seqs", LS_CTYPE_I64, op->n_seqs_offset);
        }
        for (int i = 0; i < op->n_strides; i++)
            n = add_field(out, n, op->strides[i].field, LS_CTYPE_STRIDES, op->strides[i].offset);
    }
    const ls_op_role role = grads ? LS_ROLE_GRAD : LS_ROLE_INPUT;
    for (int i = 0; i < op->n_tensors; i++)
        if (op->tensors[i].role == role)
            n = add_field(out, n, op->tensors[i].field, LS_CTYPE_PTR, op->tensors[i].offset);
    qsort(out, (size_t)n, sizeof *out, by_offset);
    return n;
}

#define EXEC_FIELD(f, t)                                                                           \
    {                                                                                              \
#f, t, offsetof(linseq_exec, f), sizeof(((linseq_exec *)0)->f)                             \
    }
static const ls_field exec_fields[] = {
    EXEC_FIELD(mode, LS_CTYPE_ENUM),        EXEC_FIELD(chunk_size, LS_CTYPE_INT),
    EXEC_FIELD(threads, LS_CTYPE_INT),      EXEC_FIELD(device, LS_CTYPE_ENUM),
    EXEC_FIELD(device_index, LS_CTYPE_INT), EXEC_FIELD(stream, LS_CTYPE_PTR),
    EXEC_FIELD(dtype, LS_CTYPE_ENUM),       EXEC_FIELD(products, LS_CTYPE_ENUM),
};

const ls_field *ls_exec_fields(int *count)
{
    *count = (int)(sizeof exec_fields / sizeof exec_fields[0]);
    return exec_fields;
}

#define POOL_FIELD(f, t)                                                                           \
    {                                                                                              \
#f, t, offsetof(linseq_state_pool, f), sizeof(((linseq_state_pool *)0)->f)                 \
    }
static const ls_field pool_fields[] = {
    POOL_FIELD(data, LS_CTYPE_PTR),       POOL_FIELD(n_rows, LS_CTYPE_I64),
    POOL_FIELD(row_stride, LS_CTYPE_I64), POOL_FIELD(dtype, LS_CTYPE_ENUM),
    POOL_FIELD(src_rows, LS_CTYPE_PTR),   POOL_FIELD(dst_rows, LS_CTYPE_PTR),
    POOL_FIELD(index_bits, LS_CTYPE_INT), POOL_FIELD(has_pad_value, LS_CTYPE_BOOL),
    POOL_FIELD(pad_value, LS_CTYPE_I64),
};

const ls_field *ls_state_pool_fields(int *count)
{
    *count = (int)(sizeof pool_fields / sizeof pool_fields[0]);
    return pool_fields;
}

/* ---------------------------------------------------------------------------------- */
/* JSON                                                                               */
/* ---------------------------------------------------------------------------------- */

typedef struct text {
    char *s;
    size_t len, cap;
    bool failed;
} text;

__attribute__((format(printf, 2, 3))) static void put(text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const size_t room = t->cap - t->len;
        const int n = t->failed ? -1 : vsnprintf(t->s + t->len, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if ((size_t)n < room) {
            t->len += (size_t)n;
            return;
        }
        char *grown = realloc(t->s, 2 * t->cap + (size_t)n);
        if (!grown) {
            t->failed = true;
            return;
        }
        t->s = grown;
        t->cap = 2 * t->cap + (size_t)n;
    }
}

/* Names in the table are C identifiers and short texts without quotes or backslashes. */
static void put_fields(text *t, const ls_field *f, int n)
{
    put(t, "[");
    for (int i = 0; i < n; i++)
        put(t, "%s{\"name\":\"%s\",\"type\":\"%s\",\"offset\":%zu,\"size\":%zu}", i ? "," : "",
            f[i].name, ctype_name[f[i].type], f[i].offset, f[i].size);
    put(t, "]");
}

static void put_options(text *t, const ls_op *op)
{
    put(t, "\"options\":[");
    for (int i = 0; i < op->n_options; i++) {
        const ls_option_desc *o = &op->options[i];
        put(t, "%s{\"key\":\"%s\",\"field\":\"%s\",\"type\":\"%s\"", i ? "," : "", o->key, o->field,
            ctype_name[o->type]);
        if (o->names) {
            put(t, ",\"values\":{");
            for (const ls_enum_name *e = o->names; e->name; e++)
                put(t, "%s\"%s\":%d", e == o->names ? "" : ",", e->name, e->value);
            put(t, "}");
        }
        put(t, "}");
    }
    put(t, "]");
}

static void put_tensors(text *t, const ls_op *op)
{
    put(t, "\"tensors\":[");
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *d = &op->tensors[i];
        put(t, "%s{\"name\":\"%s\",\"role\":\"%s\",\"dims\":\"%s\",\"required\":%s", i ? "," : "",
            d->name, role_name[d->role], d->dims, d->required ? "true" : "false");
        if (d->field) put(t, ",\"field\":\"%s\"", d->field);
        if (d->grad_of) put(t, ",\"grad_of\":\"%s\"", d->grad_of);
        if (d->alias_of) put(t, ",\"alias_of\":\"%s\"", d->alias_of);
        put(t, ",\"token\":%s", d->token ? "true" : "false");
        if (d->bounded) put(t, ",\"range\":[%.17g,%.17g]", d->lo, d->hi);
        for (int k = 0; k < op->n_strides; k++)
            if (d->role == LS_ROLE_INPUT && strcmp(op->strides[k].tensor, d->name) == 0)
                put(t, ",\"strides\":\"%s\"", op->strides[k].field);
        put(t, "}");
    }
    put(t, "]");
}

static void put_op(text *t, const ls_op *op)
{
    ls_field f[LS_OP_MAX_FIELDS];
    put(t, "{\"name\":\"%s\",\"varlen\":%s,\"problem\":{\"type\":\"%s\",\"size\":%zu,\"fields\":",
        op->name, op->varlen ? "true" : "false", op->problem_type, op->problem_size);
    put_fields(t, f, ls_op_fields(op, false, f));
    put(t, "},\"grads\":");
    if (op->backward) { /* a forward-only op has no grads struct: null */
        put(t, "{\"type\":\"%s\",\"size\":%zu,\"fields\":", op->grads_type, op->grads_size);
        put_fields(t, f, ls_op_fields(op, true, f));
        put(t, "}");
    } else {
        put(t, "null");
    }
    put(t, ",\"backward\":%s,\"training\":%s,\"modes\":%s,\"decode\":",
        op->backward ? "true" : "false", op->forward_train ? "true" : "false",
        op->has_modes ? "true" : "false");
    if (op->decode)
        put(t, "{\"state\":\"%s\",\"state_out\":\"%s\"}", op->decode_state, op->decode_state_out);
    else
        put(t, "null");
    put(t, ",\"sizes\":[");
    for (int i = 0; i < op->n_sizes; i++)
        put(t, "%s{\"name\":\"%s\",\"required\":%s}", i ? "," : "", op->sizes[i].name,
            op->sizes[i].required ? "true" : "false");
    put(t, "],");
    put_options(t, op);
    put(t, ",");
    put_tensors(t, op);
    put(t, "}");
}

static char *table_json;

static void build_json(void)
{
    text t = {.s = malloc(8192), .cap = 8192};
    if (!t.s) return;
    int n_exec, n_ops;
    const ls_field *ef = ls_exec_fields(&n_exec);
    const ls_op *const *ops = ls_ops(&n_ops);
    put(&t, "{\"version\":\"%s\",\"exec\":{\"type\":\"linseq_exec\",\"size\":%zu,\"fields\":",
        linseq_version(), sizeof(linseq_exec));
    put_fields(&t, ef, n_exec);
    int n_pool;
    const ls_field *pf = ls_state_pool_fields(&n_pool);
    put(&t, "},\"state_pool\":{\"type\":\"linseq_state_pool\",\"size\":%zu,\"fields\":",
        sizeof(linseq_state_pool));
    put_fields(&t, pf, n_pool);
    put(&t, "},\"ops\":[");
    for (int i = 0; i < n_ops; i++) {
        if (i) put(&t, ",");
        put_op(&t, ops[i]);
    }
    put(&t, "]}\n");
    if (t.failed) {
        free(t.s);
        return;
    }
    table_json = t.s; /* kept for the life of the process */
}

int linseq_op_tensor_shape(const char *op_name, const char *tensor, const void *problem,
                           int64_t dims[LINSEQ_OP_MAX_DIMS])
{
    const ls_op *op = op_name ? ls_op_find(op_name) : NULL;
    if (!op || !tensor || !problem || !dims) return -1;
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        int64_t count;
        if (strcmp(t->name, tensor) != 0) continue;
        if (!ls_tensor_count(t, problem, &count)) return -1;
        return t->shape(problem, dims);
    }
    return -1;
}

int linseq_op_shapes(const char *op_name, const void *problem, int capacity, int *ranks,
                     int64_t *dims)
{
    const ls_op *op = op_name ? ls_op_find(op_name) : NULL;
    if (!op || !problem || !ranks || !dims || capacity < 0) return -1;
    if (op->n_tensors > capacity) return op->n_tensors;
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        int64_t count;
        ranks[i] =
            ls_tensor_count(t, problem, &count) ? t->shape(problem, dims + i * LS_OP_MAX_DIMS) : -1;
    }
    return op->n_tensors;
}

const char *linseq_op_table_json(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_json);
    return table_json;
}
