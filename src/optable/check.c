/* The validation of a call from its op's description (check.h). */
#include "optable/check.h"

#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "core/status.h"

static int enum_get(const ls_option_desc *o, const void *p)
{
    int v;
    memcpy(&v, (const char *)p + o->offset, sizeof v);
    return v;
}

/* "none, per_head, per_channel" */
static void enum_names(const ls_option_desc *o, char *buf, size_t n)
{
    size_t w = 0;
    buf[0] = '\0';
    for (const ls_enum_name *e = o->names; e->name && w < n; e++) {
        const int k = snprintf(buf + w, n - w, "%s%s (%d)", w ? ", " : "", e->name, e->value);
        if (k < 0) break;
        w += (size_t)k;
    }
}

static linseq_status check_enum(const char *fn, const ls_option_desc *o, const void *p)
{
    const int v = enum_get(o, p);
    for (const ls_enum_name *e = o->names; e->name; e++)
        if (e->value == v) return LINSEQ_OK;
    char names[256];
    enum_names(o, names, sizeof names);
    return ls_fail(fn, LINSEQ_ERR_INVALID_ENUM, "%s = %d; expected one of: %s", o->field, v, names);
}

static linseq_status check_sizes(const char *fn, const ls_op *op, const void *p)
{
    linseq_status st;
    for (int i = 0; i < op->n_sizes; i++) {
        const ls_size_desc *s = &op->sizes[i];
        if ((st = ls_check_min(fn, s->name, ls_size_get(s, p), s->required ? 1 : 0))) return st;
    }
    return LINSEQ_OK;
}

/* The problem's n_seqs (a varlen op's). */
static int64_t n_seqs_of(const ls_op *op, const void *p)
{
    int64_t n_seqs;
    memcpy(&n_seqs, (const char *)p + op->n_seqs_offset, sizeof n_seqs);
    return n_seqs;
}

static linseq_status check_n_seqs(const char *fn, const ls_op *op, const void *p)
{
    if (!ls_op_cu_seqlens(op, p)) return LINSEQ_OK; /* n_seqs is ignored without cu_seqlens */
    const int64_t n_seqs = n_seqs_of(op, p);
    linseq_status st = ls_check_min(fn, "n_seqs", n_seqs, 1);
    if (!st && n_seqs == INT64_MAX)
        st = ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW, "n_seqs + 1 overflows int64");
    return st;
}

linseq_status ls_op_check_problem(const char *fn, const ls_op *op, const void *p,
                                  const linseq_exec *exec, bool cpu_bf16)
{
    if (!p)
        return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "argument 'problem' is NULL; expected a %s",
                       op->problem_type);
    linseq_status st;
    if ((st = check_sizes(fn, op, p))) return st;
    for (int i = 0; i < op->n_options; i++)
        if (op->options[i].type == LS_CTYPE_ENUM && (st = check_enum(fn, &op->options[i], p)))
            return st;
    if ((st = check_n_seqs(fn, op, p))) return st;
    return cpu_bf16 ? ls_check_exec_bf16(fn, exec) : ls_check_exec(fn, exec);
}

/* The strides field describing input t, or NULL. */
static const ls_strides_desc *strides_of(const ls_op *op, const ls_tensor_desc *t)
{
    for (int i = 0; i < op->n_strides; i++)
        if (strcmp(op->strides[i].tensor, t->name) == 0) return &op->strides[i];
    return NULL;
}

static bool strides_zero(linseq_strides s)
{
    return !s.batch && !s.token && !s.channel && !s.state;
}

void ls_op_add_cu_seqlens(ls_args *a, const ls_op *op, const void *p)
{
    const int64_t *cu = ls_op_cu_seqlens(op, p);
    if (!cu) return;
    const int64_t n_seqs = n_seqs_of(op, p);
    ls_arg(a, "cu_seqlens", "n_seqs+1", cu, true, LS_IN, sizeof(int64_t), 1,
           n_seqs < INT64_MAX ? n_seqs + 1 : INT64_MAX);
}

/* The pointer of the i-th tensor of its role: from the struct (INPUT, GRAD) or the array. */
static const void *pointer_of(const ls_tensor_desc *t, const void *src)
{
    if (t->role == LS_ROLE_INPUT || t->role == LS_ROLE_GRAD) return ls_tensor_get(t, src);
    return ((const void *const *)src)[t->offset];
}

static linseq_status add_tensor(ls_args *a, const ls_op *op, const void *p, const ls_tensor_desc *t,
                                const void *ptr, size_t elem)
{
    /* messages name an argument as a C caller knows it: the struct field (B_proj), else the
     * call argument (o) */
    const char *name = t->field ? t->field : t->name;
    const ls_strides_desc *sd = t->role == LS_ROLE_INPUT ? strides_of(op, t) : NULL;
    if (sd) {
        linseq_strides s;
        memcpy(&s, (const char *)p + sd->offset, sizeof s);
        if (!strides_zero(s)) {
            int64_t sizes[LS_OP_MAX_DIMS];
            const int n = sd->axes(p, sizes);
            return ls_arg_strided(a, name, sd->field, ptr, t->required, s, elem, n, sizes);
        }
    }
    /* an absent optional tensor has nothing to check (a row for it would be skipped by every
     * check of ls_args_validate): leaving it out keeps a decode step's validation short */
    if (!ptr && !t->required) return LINSEQ_OK;
    int64_t d[LS_OP_MAX_DIMS];
    const int nd = t->shape(p, d);
    if (nd <= 0) return LINSEQ_OK; /* the tensor does not exist with these options */
    const bool out = t->role == LS_ROLE_OUTPUT || t->role == LS_ROLE_GRAD;
    ls_tensor *row = ls_arg(a, name, t->dims, ptr, t->required, out ? LS_OUT : LS_IN, elem, nd,
                            d[0], nd > 1 ? d[1] : 0, nd > 2 ? d[2] : 0, nd > 3 ? d[3] : 0);
    if (t->alias_of) {
        const ls_tensor_desc *in = ls_op_tensor_named(op, LS_ROLE_INPUT, t->alias_of);
        row->may_alias = in ? ls_tensor_get(in, p) : NULL;
    }
    return LINSEQ_OK;
}

linseq_status ls_op_add_tensors(ls_args *a, const ls_op *op, const void *p, ls_op_role role,
                                const void *src, size_t token_bytes)
{
    if (role == LS_ROLE_INPUT) ls_op_add_cu_seqlens(a, op, p);
    linseq_status st;
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        if (t->role != role) continue;
        const void *ptr = src ? pointer_of(t, src) : NULL;
        if ((st = add_tensor(a, op, p, t, ptr, t->token ? token_bytes : sizeof(float)))) return st;
    }
    return LINSEQ_OK;
}

int64_t ls_op_size_named(const ls_op *op, const void *p, const char *name)
{
    for (int i = 0; i < op->n_sizes; i++)
        if (strcmp(op->sizes[i].name, name) == 0) return ls_size_get(&op->sizes[i], p);
    return 0;
}

/* The pool: n_rows rows shaped as the decode_state input (its dims with the first replaced). */
static void add_pool(ls_args *a, const ls_op *op, const void *p, const float *pool, int64_t n_rows)
{
    const ls_tensor_desc *t = ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state);
    int64_t d[LS_OP_MAX_DIMS];
    const int nd = t->shape(p, d);
    ls_arg(a, "state", "n_state_rows rows, each one request's state", pool, true, LS_OUT,
           sizeof(float), nd, n_rows, nd > 1 ? d[1] : 0, nd > 2 ? d[2] : 0, nd > 3 ? d[3] : 0);
}

/* What every decode step checks of its problem: one token, and no state of its own. */
static linseq_status check_decode_problem(const char *fn, const ls_op *op, const void *p)
{
    const int64_t T = ls_op_size_named(op, p, "T");
    if (T != 1)
        return ls_fail(fn, LINSEQ_ERR_INVALID_SIZE,
                       "T = %lld; decode takes exactly one token per request (T = 1)",
                       (long long)T);
    const ls_tensor_desc *state = ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state);
    if (ls_tensor_get(state, p) || ls_op_cu_seqlens(op, p))
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "problem->%s must be NULL: decode reads and writes the 'state' pool",
                       ls_tensor_get(state, p) ? state->field : "cu_seqlens");
    return LINSEQ_OK;
}

linseq_status ls_op_add_decode(ls_args *a, const ls_op *op, const void *p, float *pool,
                               int64_t n_rows, const int64_t *rows, float *const *out,
                               size_t token_bytes)
{
    const char *fn = a->fn;
    const int64_t B = ls_op_size_named(op, p, "B");
    linseq_status st;
    if ((st = check_decode_problem(fn, op, p))) return st;
    if ((st = ls_check_min(fn, "n_state_rows", n_rows, 1))) return st;
    if (!rows && n_rows < B)
        return ls_fail(fn, LINSEQ_ERR_SHAPE_MISMATCH,
                       "n_state_rows = %lld < B = %lld; without state_rows request b uses row b",
                       (long long)n_rows, (long long)B);
    ls_arg(a, "state_rows", "B", rows, false, LS_IN, sizeof(int64_t), 1, B);
    add_pool(a, op, p, pool, n_rows);
    return ls_op_add_tensors(a, op, p, LS_ROLE_OUTPUT, out, token_bytes);
}

linseq_status ls_op_add_decode_rows(ls_args *a, const ls_op *op, const void *p,
                                    const ls_state_rows *rows, int64_t n_rows, float *const *out,
                                    size_t token_bytes)
{
    linseq_status st;
    if ((st = check_decode_problem(a->fn, op, p))) return st;
    const ls_tensor_desc *t = ls_op_tensor_named(op, LS_ROLE_INPUT, op->decode_state);
    int64_t d[LS_OP_MAX_DIMS], row = 1;
    const int nd = t->shape(p, d);
    for (int i = 1; i < nd; i++) row *= d[i];
    /* the pool layer checked that this span fits (ls_pool_check) */
    const int64_t span = (n_rows - 1) * rows->stride + row;
    const size_t elem = ls_state_elem_bytes(rows->dtype);
    ls_arg(a, "pool->data", "the pool's rows", rows->from, true, LS_OUT, elem, 1, span);
    if (rows->to != rows->from)
        ls_arg(a, "the destination rows", "the pool's rows", rows->to, true, LS_OUT, elem, 1, span);
    return ls_op_add_tensors(a, op, p, LS_ROLE_OUTPUT, out, token_bytes);
}

linseq_status ls_op_check_decode_rows(const char *fn, const ls_op *op, const void *p,
                                      int64_t n_rows, const int64_t *rows)
{
    return rows ? ls_check_state_rows(fn, rows, ls_op_size_named(op, p, "B"), n_rows) : LINSEQ_OK;
}

linseq_status ls_op_check_values(const char *fn, const ls_op *op, const void *p,
                                 const linseq_exec *exec)
{
    if (ls_on_cuda(exec)) return LINSEQ_OK;
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        const float *x = t->role == LS_ROLE_INPUT && t->bounded ? ls_tensor_get(t, p) : NULL;
        int64_t n;
        if (!x || !ls_tensor_count(t, p, &n)) continue;
        for (int64_t k = 0; k < n; k++)
            if (!((double)x[k] >= t->lo && (double)x[k] <= t->hi)) /* NaN fails both */
                return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                               "%s[%lld] = %g; expected values in [%g, %g]", t->field, (long long)k,
                               (double)x[k], t->lo, t->hi);
    }
    return LINSEQ_OK;
}
