/* Loading a case folder into its op's problem struct, running it, writing its outputs.
 *
 * Nothing here is written per op: meta.json's "op" names an entry of the op table
 * (src/optable), whose sizes and options say which keys to read and where they go, whose
 * tensors say which files to load with which shapes under those options, and which outputs,
 * upstream gradients and gradients the op has, and whose calls run it. */
#include "case.h"
#include "case_device.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "optable/optable.h"

/* Far above any real meta.json; stops a wrong path (a huge file) from being slurped. */
#define META_MAX_BYTES (16L << 20)
/* Sizes must be exact in a double, where cJSON keeps every number. */
#define META_MAX_SIZE 9007199254740992.0

/* The name lists of meta.json whose files are read (the others are written or compared). */
enum { LIST_INPUTS, LIST_UPSTREAM, N_READ_LISTS };
static const char *const list_key[N_READ_LISTS] = {"inputs", "upstream_grads"};

typedef struct loader {
    ls_case *c;
    const cJSON *read[N_READ_LISTS]; /* "inputs", "upstream_grads" */
    const cJSON *outputs, *grads;
    bool used[N_READ_LISTS][CASE_MAX_TENSORS]; /* entry i of a list was loaded */
    char *err;
    size_t err_size;
} loader;

/* ---------------------------------------------------------------------------------- */
/* Messages                                                                           */
/* ---------------------------------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static bool fail_to(char *err, size_t err_size,
                                                          const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
    return false;
}

/* "DIR/meta.json: <text>" */
__attribute__((format(printf, 2, 3))) static bool meta_fail(loader *L, const char *fmt, ...)
{
    int n = snprintf(L->err, L->err_size, "%s/meta.json: ", L->c->dir);
    if (n >= 0 && (size_t)n < L->err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(L->err + n, L->err_size - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return false;
}

char *case_path(const char *dir, const char *name, const char *ext)
{
    size_t n = strlen(dir) + strlen(name) + strlen(ext) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s%s", dir, name, ext);
    return p;
}

void case_mode_text(const linseq_exec *exec, char *buf, size_t n)
{
    const linseq_exec ex = exec ? *exec : (linseq_exec){0};
    if (ex.mode == LINSEQ_MODE_RECURRENT)
        snprintf(buf, n, "recurrent");
    else
        snprintf(buf, n, "chunked, chunk %d", ex.chunk_size ? ex.chunk_size : 64);
}

void case_exec_text(const linseq_exec *exec, bool with_mode, char *buf, size_t n)
{
    linseq_exec ex = exec ? *exec : (linseq_exec){0};
    int threads = ex.threads > 0 ? ex.threads : linseq_get_num_threads();
    char mode[48] = "";
    if (with_mode) {
        case_mode_text(exec, mode, sizeof mode - 2);
        strcat(mode, ", ");
    }
    if (ex.device == LINSEQ_DEVICE_CUDA)
        snprintf(buf, n, "%sCUDA device %d", mode, ex.device_index);
    else
        snprintf(buf, n, "%s%d thread%s", mode, threads, threads == 1 ? "" : "s");
}

/* ---------------------------------------------------------------------------------- */
/* meta.json values                                                                   */
/* ---------------------------------------------------------------------------------- */

/* JSON null means "absent" everywhere: the reference data writes e.g. "K": null. */
static const cJSON *meta_get(loader *L, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(L->c->meta, key);
    return cJSON_IsNull(v) ? NULL : v;
}

/* A size: an integer >= 1. Absent leaves *out = 0 unless required. */
static bool meta_size(loader *L, const char *key, bool required, int64_t *out)
{
    const cJSON *v = meta_get(L, key);
    *out = 0;
    if (!v) return required ? meta_fail(L, "the size \"%s\" is missing", key) : true;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= 1.0 && d <= META_MAX_SIZE && d == floor(d)))
        return meta_fail(L, "\"%s\" must be an integer >= 1", key);
    *out = (int64_t)d;
    return true;
}

static bool meta_bool(loader *L, const char *key, bool *out)
{
    const cJSON *v = meta_get(L, key);
    *out = false;
    if (!v) return true;
    if (!cJSON_IsBool(v)) return meta_fail(L, "\"%s\" must be true or false", key);
    *out = cJSON_IsTrue(v);
    return true;
}

static bool meta_float(loader *L, const char *key, float *out)
{
    const cJSON *v = meta_get(L, key);
    *out = 0.0f;
    if (!v) return true;
    if (!cJSON_IsNumber(v)) return meta_fail(L, "\"%s\" must be a number or null", key);
    *out = (float)v->valuedouble;
    return true;
}

static bool meta_string(loader *L, const char *key, const char **out)
{
    const cJSON *v = meta_get(L, key);
    *out = NULL;
    if (!v) return true;
    if (!cJSON_IsString(v)) return meta_fail(L, "\"%s\" must be a string or null", key);
    *out = v->valuestring;
    return true;
}

/* Names become file names, so nothing that could leave the folder is accepted. */
static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= CASE_NAME_LEN) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return false;
    return true;
}

static bool name_list(loader *L, const char *key, bool required, const cJSON **out)
{
    const cJSON *v = meta_get(L, key);
    *out = v;
    if (!v) return required ? meta_fail(L, "the list \"%s\" is missing", key) : true;
    if (!cJSON_IsArray(v)) return meta_fail(L, "\"%s\" must be a list of names", key);
    if (cJSON_GetArraySize(v) > CASE_MAX_TENSORS)
        return meta_fail(L, "\"%s\" has more than %d entries", key, CASE_MAX_TENSORS);
    const cJSON *a, *b;
    cJSON_ArrayForEach(a, v) {
        if (!cJSON_IsString(a) || !valid_name(a->valuestring))
            return meta_fail(L,
                             "\"%s\" holds an entry that is not a name of 1 to %d letters, "
                             "digits or '_'",
                             key, CASE_NAME_LEN - 1);
        for (b = v->child; b != a; b = b->next)
            if (strcmp(a->valuestring, b->valuestring) == 0)
                return meta_fail(L, "\"%s\" lists \"%s\" twice", key, a->valuestring);
    }
    return true;
}

static int list_index(const cJSON *list, const char *name)
{
    int i = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, list) {
        if (strcmp(a->valuestring, name) == 0) return i;
        i++;
    }
    return -1;
}

/* A flag such as has_h0 must agree with its list when both are given. */
static bool check_flag(loader *L, int list, const char *flag, const char *name)
{
    bool f;
    if (!meta_get(L, flag)) return true;
    if (!meta_bool(L, flag, &f)) return false;
    if (f != (list_index(L->read[list], name) >= 0))
        return meta_fail(L, "\"%s\" is %s but \"%s\" %s \"%s\"", flag, f ? "true" : "false",
                         list_key[list], f ? "does not list" : "lists", name);
    return true;
}

/* ---------------------------------------------------------------------------------- */
/* Inputs and outputs                                                                 */
/* ---------------------------------------------------------------------------------- */

/* Reads DIR/NAME.npy, listed in LIST, into the next input slot; *arr is NULL when NAME is
 * not listed. */
static bool read_listed(loader *L, int list, const char *name, bool required, npy_dtype dtype,
                        const npy_array **arr)
{
    ls_case *c = L->c;
    int idx = list_index(L->read[list], name);
    *arr = NULL;
    if (idx < 0)
        return required ? meta_fail(L, "\"%s\" lacks \"%s\", which op %s requires", list_key[list],
                                    name, c->op_name)
                        : true;
    char *path = case_path(c->dir, name, ".npy");
    if (!path) return fail_to(L->err, L->err_size, "out of memory");
    case_tensor *t = &c->inputs[c->n_inputs];
    bool ok = npy_read(path, &t->arr, L->err, L->err_size);
    if (ok && t->arr.dtype != dtype)
        ok = fail_to(L->err, L->err_size, "%s: dtype %s, expected %s", path,
                     npy_dtype_name(t->arr.dtype), npy_dtype_name(dtype));
    free(path);
    if (!ok) {
        npy_free(&t->arr);
        return false;
    }
    snprintf(t->name, sizeof t->name, "%s", name);
    c->n_inputs++;
    L->used[list][idx] = true;
    *arr = &t->arr;
    return true;
}

static bool shape_equal(const npy_array *a, int ndim, const int64_t *shape)
{
    if (a->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (a->shape[i] != shape[i]) return false;
    return true;
}

/* A float32 file from LIST whose shape must be exactly SHAPE ("dims" names it, e.g.
 * "[B,T,H,K]"). */
static bool listed_f32(loader *L, int list, const char *name, bool required, const char *dims,
                       int ndim, const int64_t *shape, const float **out)
{
    const npy_array *a;
    *out = NULL;
    if (!read_listed(L, list, name, required, NPY_F32, &a)) return false;
    if (!a) return true;
    if (!shape_equal(a, ndim, shape)) {
        char got[160], want[160];
        npy_shape_text(a->ndim, a->shape, got, sizeof got);
        npy_shape_text(ndim, shape, want, sizeof want);
        return fail_to(L->err, L->err_size,
                       "%s/%s.npy: shape %s, but meta.json's sizes give %s = %s", L->c->dir, name,
                       got, dims, want);
    }
    *out = a->data;
    return true;
}

static bool input_f32(loader *L, const char *name, bool required, const char *dims, int ndim,
                      const int64_t *shape, const float **out)
{
    return listed_f32(L, LIST_INPUTS, name, required, dims, ndim, shape, out);
}

/* cu_seqlens: int64 [n_seqs + 1]; n_expected > 0 pins n_seqs (KDA's "N"). */
static bool input_cu_seqlens(loader *L, int64_t n_expected, const int64_t **cu, int64_t *n_seqs)
{
    const npy_array *a;
    *cu = NULL;
    *n_seqs = 0;
    if (!read_listed(L, LIST_INPUTS, "cu_seqlens", false, NPY_I64, &a)) return false;
    if (!a) return true;
    char got[160];
    npy_shape_text(a->ndim, a->shape, got, sizeof got);
    if (a->ndim != 1 || a->shape[0] < 2)
        return fail_to(L->err, L->err_size,
                       "%s/cu_seqlens.npy: shape %s, expected [n_seqs + 1] with n_seqs >= 1",
                       L->c->dir, got);
    if (n_expected > 0 && a->shape[0] != n_expected + 1)
        return fail_to(L->err, L->err_size,
                       "%s/cu_seqlens.npy: shape %s, but meta.json's sizes give [N+1] = [%lld]",
                       L->c->dir, got, (long long)n_expected + 1);
    *cu = a->data;
    *n_seqs = a->shape[0] - 1;
    return true;
}

static bool declare(loader *L, case_output *o, const char *kind, const char *name, const char *dims,
                    int ndim, const int64_t *shape)
{
    size_t count;
    if (!npy_shape_count(ndim, shape, &count) || count > SIZE_MAX / sizeof(float))
        return meta_fail(L, "the %s \"%s\" implied by the sizes is too large", kind, name);
    snprintf(o->name, sizeof o->name, "%s", name);
    o->dims = dims;
    o->ndim = ndim;
    memcpy(o->shape, shape, (size_t)ndim * sizeof *shape);
    return true;
}

static bool declare_output(loader *L, const char *name, const char *dims, int ndim,
                           const int64_t *shape)
{
    ls_case *c = L->c;
    return declare(L, &c->produced[c->n_produced++], "output", name, dims, ndim, shape);
}

/* A gradient the backward computes with these options, in grads-struct field SLOT. */
static bool declare_grad(loader *L, int slot, const char *name, const char *dims, int ndim,
                         const int64_t *shape)
{
    ls_case *c = L->c;
    case_output *o = &c->computable[c->n_computable++];
    o->slot = slot;
    return declare(L, o, "gradient", name, dims, ndim, shape);
}

/* After the op's setup: the upstream gradients, with the shapes of their outputs. The
 * backward cannot run without those the table marks required, so they are with "grads". */
static bool load_upstream(loader *L)
{
    ls_case *c = L->c;
    bool need = L->grads && cJSON_GetArraySize(L->grads) > 0;
    for (int i = 0; ls_op_tensor(c->op, LS_ROLE_UPSTREAM, i); i++) {
        const ls_tensor_desc *t = ls_op_tensor(c->op, LS_ROLE_UPSTREAM, i);
        int64_t dims[LS_OP_MAX_DIMS];
        const int ndim = t->shape(c->problem, dims);
        if ((size_t)t->offset >= CASE_MAX_TENSORS)
            return meta_fail(L, "op %s has more upstream gradients than the loader holds",
                             c->op_name);
        if (t->required && need && list_index(L->read[LIST_UPSTREAM], t->name) < 0)
            return meta_fail(L,
                             "\"grads\" is not empty but \"upstream_grads\" lacks \"%s\", "
                             "the gradient of %s that the backward needs",
                             t->name, t->grad_of);
        char dims_text[64];
        snprintf(dims_text, sizeof dims_text, "%s's shape %s", t->grad_of, t->dims);
        if (ndim && !listed_f32(L, LIST_UPSTREAM, t->name, false, dims_text, ndim, dims,
                                &c->upstream[t->offset]))
            return false;
    }
    return true;
}

/* After the op's setup: nothing listed may be left unused or unknown. */
static bool finish_lists(loader *L)
{
    ls_case *c = L->c;
    const cJSON *a;
    for (int list = 0; list < N_READ_LISTS; list++) {
        int i = 0;
        cJSON_ArrayForEach(a, L->read[list]) {
            const bool used = L->used[list][i++];
            if (!used && list == LIST_UPSTREAM && !c->op->backward)
                return meta_fail(L, "\"%s\" lists \"%s\", but op %s is forward-only",
                                 list_key[list], a->valuestring, c->op_name);
            if (!used)
                return meta_fail(L,
                                 "\"%s\" lists \"%s\", which op %s does not take with these "
                                 "options",
                                 list_key[list], a->valuestring, c->op_name);
        }
    }
    cJSON_ArrayForEach(a, L->outputs) {
        int k = 0;
        while (k < c->n_produced && strcmp(c->produced[k].name, a->valuestring) != 0) k++;
        if (k == c->n_produced)
            return meta_fail(L, "\"outputs\" lists \"%s\", which op %s does not produce",
                             a->valuestring, c->op_name);
        c->outputs[c->n_outputs++] = k;
    }
    cJSON_ArrayForEach(a, L->grads) {
        int k = 0;
        while (k < c->n_computable && strcmp(c->computable[k].name, a->valuestring) != 0) k++;
        if (k == c->n_computable && !c->op->backward)
            return meta_fail(L, "\"grads\" lists \"%s\", but op %s is forward-only", a->valuestring,
                             c->op_name);
        if (k == c->n_computable)
            return meta_fail(L,
                             "\"grads\" lists \"%s\", which op %s does not compute with "
                             "these options",
                             a->valuestring, c->op_name);
        c->grads[c->n_grads++] = k;
    }
    return true;
}

/* ---------------------------------------------------------------------------------- */
/* The op, from its description in the op table                                      */
/* ---------------------------------------------------------------------------------- */

static bool meta_option(loader *L, const ls_option_desc *o, void *p)
{
    char *field = (char *)p + o->offset;
    if (o->type == LS_CTYPE_BOOL) {
        bool b;
        if (!meta_bool(L, o->key, &b)) return false;
        memcpy(field, &b, sizeof b);
        return true;
    }
    if (o->type == LS_CTYPE_F32) {
        float f;
        if (!meta_float(L, o->key, &f)) return false;
        memcpy(field, &f, sizeof f);
        return true;
    }
    const char *s;
    if (!meta_string(L, o->key, &s)) return false;
    int value = o->null_value;
    if (s) {
        const ls_enum_name *n = o->names;
        while (n->name && strcmp(n->name, s) != 0) n++;
        if (!n->name)
            value = LS_ENUM_REQUIRED;
        else
            value = n->value;
    }
    if (value == LS_ENUM_KEEP) return true;
    if (value == LS_ENUM_REQUIRED) {
        char expected[256] = "";
        for (const ls_enum_name *n = o->names; n->name; n++)
            snprintf(expected + strlen(expected), sizeof expected - strlen(expected), "%s\"%s\"",
                     n == o->names ? ""
                     : n[1].name   ? ", "
                                   : " or ",
                     n->name);
        return meta_fail(L, "\"%s\" is %s%s%s (expected %s%s)", o->key, s ? "\"" : "",
                         s ? s : "missing", s ? "\"" : "", expected,
                         o->null_value == LS_ENUM_REQUIRED ? "" : " or null");
    }
    memcpy(field, &value, sizeof value); /* every enum of linseq.h is int-sized */
    return true;
}

static int list_of(ls_op_role role)
{
    return role == LS_ROLE_UPSTREAM ? LIST_UPSTREAM : LIST_INPUTS;
}

/* Sizes, options, the presence flags and cu_seqlens from meta.json. */
static bool read_settings(loader *L)
{
    const ls_op *op = L->c->op;
    void *p = L->c->problem;
    for (int i = 0; i < op->n_sizes; i++) {
        int64_t v;
        if (!meta_size(L, op->sizes[i].name, op->sizes[i].required, &v)) return false;
        ls_size_set(&op->sizes[i], p, v);
    }
    for (int i = 0; i < op->n_options; i++)
        if (!meta_option(L, &op->options[i], p)) return false;
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        if (t->case_flag && !check_flag(L, list_of(t->role), t->case_flag, t->name)) return false;
    }
    if (op->varlen) {
        if (!check_flag(L, LIST_INPUTS, "varlen", "cu_seqlens")) return false;
        const int64_t *cu;
        int64_t n_seqs;
        if (!input_cu_seqlens(L, 0, &cu, &n_seqs)) return false;
        ls_op_set_varlen(op, p, cu, n_seqs);
    }
    return true;
}

/* The shape of t under the problem as read so far (0 dims: t does not exist). */
static bool shape_of(loader *L, const ls_tensor_desc *t, int *ndim, int64_t *dims)
{
    int64_t count;
    *ndim = t->shape(L->c->problem, dims);
    bool fits = ls_tensor_count(t, L->c->problem, &count);
    for (int i = 0; i < *ndim; i++) fits = fits && dims[i] < INT64_MAX;
    if (!fits)
        return meta_fail(L, "the sizes overflow: %s %s has more than 2^63 elements", t->name,
                         t->dims);
    return true;
}

/* Every input the options give (then the gradients that depend on which are present),
 * every output and every computable gradient. */
static bool setup_op(loader *L)
{
    ls_case *c = L->c;
    const ls_op *op = c->op;
    if (!read_settings(L)) return false;
    int ndim, slot = 0;
    int64_t dims[LS_OP_MAX_DIMS];
    for (int i = 0; i < op->n_tensors; i++)
        if (!shape_of(L, &op->tensors[i], &ndim, dims)) return false;
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        if (t->role != LS_ROLE_INPUT) continue;
        const float *data = NULL;
        char dims_text[96];
        ls_tensor_dims(op, t, c->problem, dims_text, sizeof dims_text);
        if (!shape_of(L, t, &ndim, dims) ||
            (ndim && !input_f32(L, t->name, t->required, dims_text, ndim, dims, &data)))
            return false;
        ls_tensor_set(t, c->problem, data);
    }
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        if (t->role != LS_ROLE_OUTPUT && t->role != LS_ROLE_GRAD) continue;
        const int this_slot = t->role == LS_ROLE_GRAD ? slot++ : 0;
        if (!shape_of(L, t, &ndim, dims)) return false;
        if (!ndim) continue;
        if (t->role == LS_ROLE_OUTPUT ? !declare_output(L, t->name, t->dims, ndim, dims)
                                      : !declare_grad(L, this_slot, t->name, t->dims, ndim, dims))
            return false;
    }
    return true;
}

static linseq_status call_forward(const ls_case *c, const linseq_exec *exec, float *const *out)
{
    return c->op->forward(c->problem, exec, out);
}

static linseq_status call_backward(const ls_case *c, const linseq_exec *exec, float *const *grads)
{
    return ls_op_backward(c->op, c->problem, exec, c->upstream, grads);
}

bool case_has_mode(const ls_case *c) { return c->op->has_modes; }

const char *case_ops_with_mode(void)
{
    static char names[512];
    int n, n_modes = 0, seen = 0;
    const ls_op *const *ops = ls_ops(&n);
    for (int i = 0; i < n; i++) n_modes += ops[i]->has_modes;
    if (!names[0])
        for (int i = 0; i < n; i++)
            if (ops[i]->has_modes)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                         seen++ == 0      ? ""
                         : seen < n_modes ? ", "
                                          : " and ",
                         ops[i]->name);
    return names;
}

static const char *op_names(void)
{
    static char names[1024];
    int n;
    const ls_op *const *ops = ls_ops(&n);
    if (!names[0])
        for (int i = 0; i < n; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                     i == 0      ? ""
                     : i + 1 < n ? ", "
                                 : " or ",
                     ops[i]->name);
    return names;
}

/* ---------------------------------------------------------------------------------- */
/* Loading                                                                            */
/* ---------------------------------------------------------------------------------- */

/* The whole of a regular file, NUL-terminated: its size is known before anything is read,
 * so a device or a pipe named meta.json cannot make this read without end. */
static char *read_text(const char *path, size_t *len, char *err, size_t err_size)
{
    uint64_t size;
    FILE *f = open_regular_file(path, &size, err, err_size);
    if (!f) return NULL;
    char *buf = NULL;
    if (size > (uint64_t)META_MAX_BYTES)
        fail_to(err, err_size, "%s: larger than %ld bytes", path, META_MAX_BYTES);
    else if (!(buf = malloc((size_t)size + 1)))
        fail_to(err, err_size, "%s: out of memory", path);
    else if (fread(buf, 1, (size_t)size, f) != size || fgetc(f) != EOF) {
        fail_to(err, err_size, "%s: read error (or the file changed while being read)", path);
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[size] = '\0';
        *len = (size_t)size;
    }
    return buf;
}

static int compare_keys(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first key that appears twice in one object of the tree under item (NULL: none, or
 * *oom set when memory ran out), and in *parent the key of that object ("" at the top).
 * cJSON keeps every duplicate and its lookups find the first, where Python's json keeps the
 * last: a case would mean different things to the CLI and to the tools that wrote it. */
static const char *duplicate_key(const cJSON *item, const char *name, const char **parent,
                                 bool *oom)
{
    size_t n = 0;
    for (const cJSON *e = item->child; e; e = e->next) {
        if (e->child) {
            const char *dup = duplicate_key(e, e->string ? e->string : name, parent, oom);
            if (dup || *oom) return dup;
        }
        n++;
    }
    if (!cJSON_IsObject(item) || n < 2) return NULL;
    const char **keys = malloc(n * sizeof *keys);
    if (!keys) {
        *oom = true;
        return NULL;
    }
    n = 0;
    for (const cJSON *e = item->child; e; e = e->next) keys[n++] = e->string ? e->string : "";
    qsort(keys, n, sizeof *keys, compare_keys);
    const char *dup = NULL;
    for (size_t i = 1; i < n && !dup; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0) dup = keys[i];
    free(keys);
    if (dup) *parent = name;
    return dup;
}

static bool parse_meta(ls_case *c, char *err, size_t err_size)
{
    char *path = case_path(c->dir, "meta", ".json");
    if (!path) return fail_to(err, err_size, "out of memory");
    size_t len = 0;
    char *text = read_text(path, &len, err, err_size);
    bool ok = text != NULL;
    if (ok && strlen(text) != len) ok = fail_to(err, err_size, "%s: NUL byte in the file", path);
    if (ok) {
        const char *end = NULL;
        c->meta = cJSON_ParseWithOpts(text, &end, 1);
        if (!c->meta) {
            int line = 1;
            for (const char *s = text; end && s < end; s++) line += *s == '\n';
            ok = fail_to(err, err_size, "%s: malformed JSON (line %d)", path, line);
        } else if (!cJSON_IsObject(c->meta)) {
            ok = fail_to(err, err_size, "%s: the top level is not an object", path);
        } else {
            const char *parent = "";
            bool oom = false;
            const char *dup = duplicate_key(c->meta, "", &parent, &oom);
            if (oom)
                ok = fail_to(err, err_size, "%s: out of memory", path);
            else if (dup)
                ok = fail_to(err, err_size, "%s: duplicate key \"%s\"%s%s%s (each key once)", path,
                             dup, parent[0] ? " in \"" : "", parent, parent[0] ? "\"" : "");
        }
    }
    free(text);
    free(path);
    return ok;
}

bool case_load(const char *dir, ls_case *c, char *err, size_t err_size)
{
    memset(c, 0, sizeof *c);
    c->dir = strdup(dir);
    if (!c->dir) return fail_to(err, err_size, "out of memory");
    /* "cases/foo/" names the case "foo". */
    for (size_t n = strlen(c->dir); n > 1 && c->dir[n - 1] == '/'; n--) c->dir[n - 1] = '\0';
    const char *slash = strrchr(c->dir, '/');
    c->name = slash && slash[1] ? slash + 1 : c->dir;

    loader L = {.c = c, .err = err, .err_size = err_size};
    const char *op_name = NULL;
    bool ok = parse_meta(c, err, err_size) && meta_string(&L, "op", &op_name);
    if (ok && !op_name) ok = meta_fail(&L, "\"op\" is missing");
    const ls_op *op = ok ? ls_op_find(op_name) : NULL;
    if (ok && !op) ok = meta_fail(&L, "unknown op \"%s\" (expected %s)", op_name, op_names());
    if (ok && !(c->problem = calloc(1, op->problem_size)))
        ok = fail_to(err, err_size, "out of memory");
    if (ok) {
        c->op = op;
        c->op_name = op->name;
        ok = name_list(&L, "inputs", true, &L.read[LIST_INPUTS]) &&
             name_list(&L, "upstream_grads", false, &L.read[LIST_UPSTREAM]) &&
             name_list(&L, "outputs", true, &L.outputs) &&
             name_list(&L, "grads", false, &L.grads) && setup_op(&L) && load_upstream(&L) &&
             finish_lists(&L);
    }
    if (!ok) case_free(c);
    return ok;
}

void case_free(ls_case *c)
{
    for (int i = 0; i < c->n_inputs; i++) npy_free(&c->inputs[i].arr);
    cJSON_Delete(c->meta);
    free(c->dir);
    free(c->problem);
    memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------------------------- */
/* Running                                                                            */
/* ---------------------------------------------------------------------------------- */

/* The other ops have one algorithm; a KDA mode or chunk size means nothing to them. */
static linseq_exec op_exec(const ls_case *c, const linseq_exec *exec)
{
    linseq_exec ex = exec ? *exec : (linseq_exec){0};
    if (!case_has_mode(c)) {
        ex.mode = LINSEQ_MODE_DEFAULT;
        ex.chunk_size = 0;
    }
    return ex;
}

static int library_failed(linseq_status st, char *err, size_t err_size)
{
    const char *msg = linseq_last_error();
    if (*msg)
        fail_to(err, err_size, "%s (%s)", msg, linseq_status_string(st));
    else
        fail_to(err, err_size, "%s", linseq_status_string(st));
    return LS_EXIT_FAIL;
}

int case_run(const ls_case *c, const linseq_exec *exec, case_result *r, char *err, size_t err_size)
{
    float *out[CASE_MAX_TENSORS] = {0};
    memset(r, 0, sizeof *r);
    for (int i = 0; i < c->n_produced; i++) {
        const case_output *o = &c->produced[i];
        case_tensor *t = &r->t[r->n];
        if (!npy_alloc_f32(&t->arr, o->ndim, o->shape, err, err_size)) {
            case_result_free(r);
            return LS_EXIT_ERROR;
        }
        snprintf(t->name, sizeof t->name, "%s", o->name);
        out[r->n++] = t->arr.data;
    }
    const linseq_exec ex = op_exec(c, exec);
    linseq_status st;
    /* Whether err was set below tells a device failure from the library's: it must start
     * empty on both paths (the caller's buffer may hold anything, or an earlier message). */
    err[0] = '\0';
    if (ex.device == LINSEQ_DEVICE_CUDA) {
        size_t counts[CASE_MAX_TENSORS];
        for (int i = 0; i < r->n; i++) counts[i] = r->t[i].arr.count;
        st = case_call_on_device(c, call_forward, &ex, out, counts, r->n, err, err_size);
    } else {
        st = call_forward(c, &ex, out);
    }
    if (st != LINSEQ_OK) {
        case_result_free(r);
        return err[0] ? LS_EXIT_FAIL : library_failed(st, err, err_size);
    }
    return LS_EXIT_OK;
}

static void free_grads(case_result *r)
{
    for (int i = 0; i < r->n_grads; i++) npy_free(&r->g[i].arr);
    memset(r->g, 0, sizeof r->g);
    r->n_grads = 0;
}

int case_run_backward(const ls_case *c, const linseq_exec *exec, case_result *r, char *err,
                      size_t err_size)
{
    float *grad[CASE_MAX_TENSORS] = {0}; /* by slot */
    free_grads(r);
    if (c->n_grads == 0) return LS_EXIT_OK;
    for (int i = 0; i < c->n_grads; i++) {
        const case_output *o = &c->computable[c->grads[i]];
        case_tensor *t = &r->g[r->n_grads];
        if (!npy_alloc_f32(&t->arr, o->ndim, o->shape, err, err_size)) {
            free_grads(r);
            return LS_EXIT_ERROR;
        }
        /* NaN, not zeros: a gradient the backward leaves unwritten, or accumulates into
         * instead of overwriting, then fails the comparison even where the reference is 0. */
        float *data = t->arr.data;
        for (size_t k = 0; k < t->arr.count; k++) data[k] = NAN;
        snprintf(t->name, sizeof t->name, "%s", o->name);
        grad[o->slot] = data;
        r->n_grads++;
    }
    const linseq_exec ex = op_exec(c, exec);
    linseq_status st;
    err[0] = '\0'; /* as in case_run: the forward's message may still be in it */
    if (ex.device == LINSEQ_DEVICE_CUDA) {
        size_t counts[CASE_MAX_TENSORS] = {0};
        for (int i = 0; i < r->n_grads; i++)
            counts[c->computable[c->grads[i]].slot] = r->g[i].arr.count;
        st = case_call_on_device(c, call_backward, &ex, grad, counts, CASE_MAX_TENSORS, err,
                                 err_size);
    } else {
        st = call_backward(c, &ex, grad);
    }
    if (st != LINSEQ_OK) {
        free_grads(r);
        return err[0] ? LS_EXIT_FAIL : library_failed(st, err, err_size);
    }
    return LS_EXIT_OK;
}

void case_result_free(case_result *r)
{
    for (int i = 0; i < r->n; i++) npy_free(&r->t[i].arr);
    free_grads(r);
    memset(r, 0, sizeof *r);
}

const case_tensor *case_output_tensor(const ls_case *c, const case_result *r, int i)
{
    return &r->t[c->outputs[i]];
}

/* ---------------------------------------------------------------------------------- */
/* Writing                                                                            */
/* ---------------------------------------------------------------------------------- */

/* mkdir -p: an existing folder is fine, anything else in the way is an error. */
static bool make_dirs(const char *path, char *err, size_t err_size)
{
    char *p = strdup(path);
    if (!p) return fail_to(err, err_size, "out of memory");
    bool ok = true;
    for (char *s = p + 1; ok; s++) {
        if (*s != '/' && *s != '\0') continue;
        char saved = *s;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            ok = fail_to(err, err_size, "%s: cannot create the output folder: %s", path,
                         strerror(errno));
        *s = saved;
        if (!saved) break;
    }
    free(p);
    struct stat st;
    if (ok && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)))
        ok = fail_to(err, err_size, "%s: the output folder is not a folder", path);
    return ok;
}

/* Refuses an output folder that is the case folder itself, however it is spelled ("case/.",
 * a link): the run would overwrite the reference files. Compared by device and inode. */
static bool not_the_case_folder(const char *case_dir, const char *out_dir, char *err,
                                size_t err_size)
{
    struct stat a, b;
    if (stat(case_dir, &a) == 0 && stat(out_dir, &b) == 0 && a.st_dev == b.st_dev &&
        a.st_ino == b.st_ino)
        return fail_to(err, err_size,
                       "%s: the output folder is the case folder %s (its reference files would "
                       "be overwritten)",
                       out_dir, case_dir);
    return true;
}

/* One file of a run's output set. A run first writes every new file under a temporary name
 * (temp), then swaps them in: each earlier file is moved aside (aside) and the new one
 * renamed onto its name. Any failure undoes what was done, so the folder holds either the
 * complete new set or exactly what it held before, never a mix of two runs. */
typedef struct staged_file {
    char *target; /* OUT_DIR/<name>.npy */
    char *temp;   /* the new content; NULL for an earlier file that is only withdrawn */
    char *aside;  /* the earlier file while the swap is under way; NULL when there was none */
    bool swapped;
} staged_file;

/* A folder in the way cannot be renamed over: found before anything is touched. */
static bool target_free(const char *target, char *err, size_t err_size)
{
    struct stat st;
    if (lstat(target, &st) == 0 && S_ISDIR(st.st_mode))
        return fail_to(err, err_size, "%s: cannot write: a folder is in the way", target);
    return true;
}

static bool swap_in(staged_file *f, char *err, size_t err_size)
{
    struct stat st;
    if (lstat(f->target, &st) == 0) {
        int fd = hidden_sibling(f->target, &f->aside);
        if (fd >= 0) close(fd);
        if (fd < 0 || rename(f->target, f->aside) != 0) {
            fail_to(err, err_size, "%s: cannot replace it: %s", f->target, strerror(errno));
            if (fd >= 0) unlink(f->aside);
            free(f->aside);
            f->aside = NULL;
            return false;
        }
    }
    f->swapped = true;
    if (f->temp && rename(f->temp, f->target) != 0)
        return fail_to(err, err_size, "%s: cannot write: %s", f->target, strerror(errno));
    return true;
}

/* Commits (keep the new files, drop the earlier ones) or undoes (the reverse), then frees. */
static void finish_staged(staged_file *files, int n, bool commit)
{
    for (int i = n - 1; i >= 0; i--) {
        staged_file *f = &files[i];
        if (!commit && f->swapped) {
            if (f->temp) rename(f->target, f->temp); /* the new file goes back to its temp */
            if (f->aside) rename(f->aside, f->target);
        } else if (commit && f->aside) {
            unlink(f->aside);
        }
        if (!commit && f->temp) unlink(f->temp);
        free(f->target);
        free(f->temp);
        free(f->aside);
    }
}

/* Stages the new file for tensor T, or (T NULL) the withdrawal of an earlier NAME.npy. */
static bool stage(staged_file *f, const char *out_dir, const char *name, const case_tensor *t,
                  char *err, size_t err_size)
{
    memset(f, 0, sizeof *f);
    if (!(f->target = case_path(out_dir, name, ".npy")))
        return fail_to(err, err_size, "out of memory");
    if (!target_free(f->target, err, err_size)) return false;
    if (t && !(f->temp = npy_write_f32_temp(f->target, t->arr.data, t->arr.ndim, t->arr.shape, err,
                                            err_size)))
        return false;
    return true;
}

bool case_write_outputs(const ls_case *c, const case_result *r, const char *out_dir, char *err,
                        size_t err_size)
{
    staged_file files[2 * CASE_MAX_TENSORS];
    int n = 0;
    bool ok =
        not_the_case_folder(c->dir, out_dir, err, err_size) && make_dirs(out_dir, err, err_size);
    for (int i = 0; ok && i < c->n_outputs + r->n_grads; i++) {
        const case_tensor *t =
            i < c->n_outputs ? case_output_tensor(c, r, i) : &r->g[i - c->n_outputs];
        ok = stage(&files[n++], out_dir, t->name, t, err, err_size);
    }
    /* Without gradients (--fwd-only) an earlier run's gradients would sit beside the new
     * outputs: they are withdrawn with the rest of the earlier set. */
    for (int i = 0; ok && r->n_grads == 0 && i < c->n_grads; i++)
        ok = stage(&files[n++], out_dir, c->computable[c->grads[i]].name, NULL, err, err_size);
    /* Until here a signal removes the temporary files (npy.h); the swap and its commit or
     * undo are quick and run to their end, the signal acted on after them. */
    npy_temps_defer(true);
    for (int i = 0; ok && i < n; i++) ok = swap_in(&files[i], err, err_size);
    finish_staged(files, n, ok);
    npy_temps_forget_all();
    npy_temps_defer(false);
    return ok;
}

/* linseq run of one case folder. */
static int run_case(const char *case_dir, const char *out_dir, const linseq_exec *exec,
                    bool fwd_only)
{
    ls_case c;
    case_result r;
    char err[2048];
    /* before the work, not only before the writing */
    if (!not_the_case_folder(case_dir, out_dir, err, sizeof err)) {
        fprintf(stderr, "linseq run: %s\n", err);
        return LS_EXIT_ERROR;
    }
    if (!case_load(case_dir, &c, err, sizeof err)) {
        fprintf(stderr, "linseq run: %s\n", err);
        return LS_EXIT_ERROR;
    }
    const char *failed = "forward";
    int rc = case_run(&c, exec, &r, err, sizeof err);
    if (rc == LS_EXIT_OK && !fwd_only) {
        failed = "backward";
        rc = case_run_backward(&c, exec, &r, err, sizeof err);
    }
    if (rc != LS_EXIT_OK) {
        fprintf(stderr, "linseq run: %s: %s: %s\n", c.dir, failed, err);
        case_result_free(&r);
        case_free(&c);
        return LS_EXIT_ERROR;
    }
    if (!case_write_outputs(&c, &r, out_dir, err, sizeof err)) {
        fprintf(stderr, "linseq run: %s\n", err);
        rc = LS_EXIT_ERROR;
    } else {
        char how[96];
        case_exec_text(exec, case_has_mode(&c), how, sizeof how);
        printf("%s: %s (%s): wrote", c.name, c.op_name, how);
        for (int i = 0; i < c.n_outputs; i++)
            printf(" %s.npy", case_output_tensor(&c, &r, i)->name);
        for (int i = 0; i < r.n_grads; i++) printf(" %s.npy", r.g[i].name);
        printf(" to %s", out_dir);
        if (fwd_only && c.n_grads)
            printf("; %d gradient file%s skipped (--fwd-only)", c.n_grads,
                   c.n_grads == 1 ? "" : "s");
        printf("\n");
    }
    case_result_free(&r);
    case_free(&c);
    return rc;
}

static bool holds_meta(const char *dir)
{
    char *meta = case_path(dir, "meta", ".json");
    struct stat st;
    bool yes = meta && stat(meta, &st) == 0 && S_ISREG(st.st_mode);
    free(meta);
    return yes;
}

static int name_order(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* linseq run of a folder of case folders (what `linseq check` also accepts): each case
 * DIR/<name> into OUT_DIR/<name>, in name order. A case that fails is reported and the
 * others still run; the exit status is then LS_EXIT_ERROR. Returns -1 when DIR holds no
 * case folder, so the caller reports DIR as a single case. */
static int run_folder(const char *dir, const char *out_dir, const linseq_exec *exec, bool fwd_only)
{
    struct dirent **entries;
    int n = scandir(dir, &entries, NULL, name_order);
    if (n < 0) return -1;
    int n_cases = 0, n_failed = 0;
    for (int i = 0; i < n; i++) {
        const char *name = entries[i]->d_name;
        char *sub = strcmp(name, ".") && strcmp(name, "..") ? case_path(dir, name, "") : NULL;
        if (sub && holds_meta(sub)) {
            char *out = case_path(out_dir, name, "");
            n_cases++;
            if (!out || run_case(sub, out, exec, fwd_only) != LS_EXIT_OK) n_failed++;
            if (!out) fprintf(stderr, "linseq run: %s: out of memory\n", sub);
            free(out);
        }
        free(sub);
        free(entries[i]);
    }
    free(entries);
    if (n_cases == 0) return -1;
    if (n_failed)
        fprintf(stderr, "linseq run: %d of the %d cases in %s failed\n", n_failed, n_cases, dir);
    return n_failed ? LS_EXIT_ERROR : LS_EXIT_OK;
}

int cmd_run(const char *case_dir, const char *out_dir, const linseq_exec *exec, bool fwd_only)
{
    if (!holds_meta(case_dir)) {
        int rc = run_folder(case_dir, out_dir, exec, fwd_only);
        if (rc >= 0) return rc;
    }
    return run_case(case_dir, out_dir, exec, fwd_only);
}
