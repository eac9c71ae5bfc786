/* A small valid case folder of any op of the op table, made from its description alone:
 * what lets the case-loader target (fuzz_case.c) reach every op of ls_ops() without a
 * hand-written seed per op, and what tests/test_op_coverage.c loads and runs for every op to
 * check that it does.
 *
 * The case: every required size 2 (the others absent: their defaults), every enum option
 * its first name (the others absent: false, 0), every INPUT and UPSTREAM tensor that exists
 * with these options, of its table shape and with values of its table distribution (from
 * seed), and every OUTPUT and GRAD in "outputs" and "grads". Not varlen. */
#ifndef LS_FUZZ_TABLE_CASE_H
#define LS_FUZZ_TABLE_CASE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "optable/optable.h"

#define FZ_TABLE_CASE_SIZE 2

/* Writes DIR/NAME.npy: float32 values of shape dims. */
static bool fz_table_npy(const char *dir, const char *name, const float *x, const int64_t *dims,
                         int ndim, int64_t count)
{
    char head[256], path[4096];
    int len = snprintf(head, sizeof head, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    for (int i = 0; i < ndim; i++)
        len += snprintf(head + len, sizeof head - (size_t)len, "%s%lld", i ? ", " : "",
                        (long long)dims[i]);
    len += snprintf(head + len, sizeof head - (size_t)len, "%s), }", ndim == 1 ? "," : "");
    while ((10 + len + 1) % 64) head[len++] = ' ';
    head[len++] = '\n';
    if (snprintf(path, sizeof path, "%s/%s.npy", dir, name) >= (int)sizeof path) return false;
    FILE *f = fopen(path, "wb");
    const unsigned char pre[10] = {0x93,
                                   'N',
                                   'U',
                                   'M',
                                   'P',
                                   'Y',
                                   1,
                                   0,
                                   (unsigned char)(len & 0xff),
                                   (unsigned char)(len >> 8)};
    bool ok = f && fwrite(pre, 1, sizeof pre, f) == sizeof pre &&
              fwrite(head, 1, (size_t)len, f) == (size_t)len &&
              fwrite(x, sizeof *x, (size_t)count, f) == (size_t)count;
    if (f && fclose(f) != 0) ok = false;
    return ok;
}

/* Writes op's case into dir (an existing folder); false, with a message in err, when a file
 * cannot be written or a tensor is larger than such a case should be. */
static bool fz_table_case_write(const ls_op *op, const char *dir, uint64_t seed, char *err,
                                size_t err_size)
{
    void *p = calloc(1, op->problem_size);
    cJSON *meta = cJSON_CreateObject();
    cJSON *lists[4] = {
        /* by ls_op_role: INPUT, OUTPUT, UPSTREAM, GRAD */
        cJSON_AddArrayToObject(meta, "inputs"), cJSON_AddArrayToObject(meta, "outputs"),
        cJSON_AddArrayToObject(meta, "upstream_grads"), cJSON_AddArrayToObject(meta, "grads")};
    bool ok = p && meta && lists[0] && lists[1] && lists[2] && lists[3] &&
              cJSON_AddStringToObject(meta, "op", op->name);
    if (!ok) snprintf(err, err_size, "out of memory");
    for (int i = 0; ok && i < op->n_sizes; i++)
        if (op->sizes[i].required) {
            ls_size_set(&op->sizes[i], p, FZ_TABLE_CASE_SIZE);
            ok = cJSON_AddNumberToObject(meta, op->sizes[i].name, FZ_TABLE_CASE_SIZE) != NULL;
        }
    for (int i = 0; ok && i < op->n_options; i++) {
        const ls_option_desc *o = &op->options[i];
        if (o->type != LS_CTYPE_ENUM || !o->names[0].name) continue;
        memcpy((char *)p + o->offset, &o->names[0].value, sizeof(int));
        ok = cJSON_AddStringToObject(meta, o->key, o->names[0].name) != NULL;
    }
    for (int i = 0; ok && i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        int64_t dims[LS_OP_MAX_DIMS], count = 1;
        const int ndim = t->shape(p, dims);
        if (!ndim) continue;
        cJSON_AddItemToArray(lists[t->role], cJSON_CreateString(t->name));
        if (t->role != LS_ROLE_INPUT && t->role != LS_ROLE_UPSTREAM) continue;
        for (int d = 0; d < ndim; d++) count *= dims[d];
        float *x = count <= (1 << 16) ? malloc((size_t)(count ? count : 1) * sizeof *x) : NULL;
        if (x) ls_op_fill(t, x, count, dims, ndim, seed + (uint64_t)i);
        ok = x && fz_table_npy(dir, t->name, x, dims, ndim, count);
        if (!ok) snprintf(err, err_size, "%s: cannot write %.1024s/%s.npy", op->name, dir, t->name);
        free(x);
    }
    char *text = ok ? cJSON_Print(meta) : NULL;
    if (ok) {
        char path[4096];
        FILE *f = snprintf(path, sizeof path, "%s/meta.json", dir) < (int)sizeof path
                      ? fopen(path, "wb")
                      : NULL;
        ok = f && text && fputs(text, f) >= 0;
        if (f && fclose(f) != 0) ok = false;
        if (!ok) snprintf(err, err_size, "%s: cannot write %.1024s/meta.json", op->name, dir);
    }
    free(text);
    cJSON_Delete(meta);
    free(p);
    return ok;
}

#endif
