/* The op table's list and the generic operations on its descriptions (optable.h). */
#include "optable/optable.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The descriptions, each defined in its family's folder. Adding an op: its name here and in
 * the list below. */
extern const ls_op ls_op_kda, ls_op_kda_gate, ls_op_ssm1, ls_op_conv1d, ls_op_kda_segment,
    ls_op_ssm1_segment, ls_op_ema, ls_op_ssd, ls_op_ssd_segment;

static const ls_op *const all_ops[] = {&ls_op_kda,    &ls_op_kda_gate,    &ls_op_ssm1,
                                       &ls_op_conv1d, &ls_op_kda_segment, &ls_op_ssm1_segment,
                                       &ls_op_ema,    &ls_op_ssd,         &ls_op_ssd_segment};

const ls_enum_name ls_activation_names[] = {
    {"silu", LINSEQ_ACT_SILU},           {"sigmoid", LINSEQ_ACT_SIGMOID},
    {"gelu_tanh", LINSEQ_ACT_GELU_TANH}, {"relu", LINSEQ_ACT_RELU},
    {"identity", LINSEQ_ACT_IDENTITY},   {"none", LINSEQ_ACT_IDENTITY},
    {"default", LINSEQ_ACT_DEFAULT},     {NULL, 0}};

const ls_op *const *ls_ops(int *count)
{
    *count = (int)(sizeof all_ops / sizeof all_ops[0]);
    return all_ops;
}

const ls_op *ls_op_find(const char *name)
{
    for (size_t i = 0; i < sizeof all_ops / sizeof all_ops[0]; i++)
        if (strcmp(all_ops[i]->name, name) == 0) return all_ops[i];
    return NULL;
}

const ls_tensor_desc *ls_op_tensor(const ls_op *op, ls_op_role role, int i)
{
    for (int t = 0; t < op->n_tensors; t++)
        if (op->tensors[t].role == role && i-- == 0) return &op->tensors[t];
    return NULL;
}

int ls_op_count(const ls_op *op, ls_op_role role)
{
    int n = 0;
    for (int t = 0; t < op->n_tensors; t++) n += op->tensors[t].role == role;
    return n;
}

const ls_tensor_desc *ls_op_tensor_named(const ls_op *op, ls_op_role role, const char *name)
{
    for (int t = 0; t < op->n_tensors; t++)
        if (op->tensors[t].role == role && strcmp(op->tensors[t].name, name) == 0)
            return &op->tensors[t];
    return NULL;
}

const char *ls_tensor_dims(const ls_op *op, const ls_tensor_desc *t, const void *p, char *buf,
                           size_t n)
{
    const char *dims = t->dims, *alt = strstr(dims, "] (["), *end = strrchr(dims, ' ');
    size_t len = strlen(dims);
    if (alt && end && end > alt && dims[len - 1] == ')') {
        const size_t key_len = len - 1 - (size_t)(end + 1 - dims);
        bool set = false;
        for (int i = 0; i < op->n_options; i++) {
            const ls_option_desc *o = &op->options[i];
            if (o->type == LS_CTYPE_BOOL && strlen(o->key) == key_len &&
                strncmp(o->key, end + 1, key_len) == 0)
                memcpy(&set, (const unsigned char *)p + o->offset, sizeof set);
        }
        if (set)
            dims = alt + 3, len = (size_t)(end - dims);
        else
            len = (size_t)(alt + 1 - dims);
    }
    snprintf(buf, n, "%.*s", (int)len, dims);
    return buf;
}

bool ls_tensor_count(const ls_tensor_desc *t, const void *p, int64_t *count)
{
    int64_t d[LS_OP_MAX_DIMS], n = 1;
    const int nd = t->shape(p, d);
    for (int i = 0; i < nd; i++)
        if (d[i] < 0 || __builtin_mul_overflow(n, d[i], &n)) return false;
    *count = nd ? n : 0;
    return true;
}

const void *ls_tensor_get(const ls_tensor_desc *t, const void *strct)
{
    const void *ptr;
    memcpy(&ptr, (const char *)strct + t->offset, sizeof ptr);
    return ptr;
}

void ls_tensor_set(const ls_tensor_desc *t, void *strct, const void *ptr)
{
    memcpy((char *)strct + t->offset, &ptr, sizeof ptr);
}

int64_t ls_size_get(const ls_size_desc *s, const void *p)
{
    int64_t v;
    memcpy(&v, (const char *)p + s->offset, sizeof v);
    return v;
}

void ls_size_set(const ls_size_desc *s, void *p, int64_t value)
{
    memcpy((char *)p + s->offset, &value, sizeof value);
}

void ls_op_set_varlen(const ls_op *op, void *p, const int64_t *cu_seqlens, int64_t n_seqs)
{
    memcpy((char *)p + op->cu_seqlens_offset, &cu_seqlens, sizeof cu_seqlens);
    memcpy((char *)p + op->n_seqs_offset, &n_seqs, sizeof n_seqs);
}

const int64_t *ls_op_cu_seqlens(const ls_op *op, const void *p)
{
    const int64_t *cu = NULL;
    if (op->varlen) memcpy(&cu, (const char *)p + op->cu_seqlens_offset, sizeof cu);
    return cu;
}

const char *ls_enum_value_name(const ls_option_desc *o, int value)
{
    for (const ls_enum_name *n = o->names; n && n->name; n++)
        if (n->value == value) return n->name;
    return NULL;
}

linseq_status ls_op_backward(const ls_op *op, const void *p, const linseq_exec *exec,
                             const float *const *upstream, float *const *grads)
{
    /* The grads struct's bytes; the op's backward copies them into its typed struct. */
    _Alignas(void *) unsigned char strct[LS_OP_GRADS_BYTES] = {0};
    if (!op->backward) return LINSEQ_ERR_UNSUPPORTED;                 /* a forward-only op */
    if (op->grads_size > sizeof strct) return LINSEQ_ERR_UNSUPPORTED; /* a test keeps it so */
    for (int i = 0; i < ls_op_count(op, LS_ROLE_GRAD); i++)
        ls_tensor_set(ls_op_tensor(op, LS_ROLE_GRAD, i), strct, grads[i]);
    return op->backward(p, exec, upstream, strct);
}
