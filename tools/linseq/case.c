/* Loading a case folder into its op's problem struct, running it, writing its outputs.
 *
 * Each op has a setup function that reads its sizes and options from meta.json, loads the
 * inputs whose shapes those sizes imply, and declares the outputs and the gradients it can
 * produce; the op table at the bottom ties a name in meta.json to that setup, to the forward
 * call and to the backward call. The upstream gradients are the same for every op ("d_" and
 * the name of an output, with its shape), so the loader reads them after the setup. */
#include "case.h"
#include "case_device.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"

/* Far above any real meta.json; stops a wrong path (a huge file) from being slurped. */
#define META_MAX_BYTES (16L << 20)
/* Sizes must be exact in a double, where cJSON keeps every number. */
#define META_MAX_SIZE 9007199254740992.0

/* The name lists of meta.json whose files are read (the others are written or compared). */
enum { LIST_INPUTS, LIST_UPSTREAM, N_READ_LISTS };
static const char *const list_key[N_READ_LISTS] = {"inputs", "upstream_grads"};

typedef struct loader {
    ls_case *c;
    const cJSON *read[N_READ_LISTS];                /* "inputs", "upstream_grads"   */
    const cJSON *outputs, *grads;
    bool used[N_READ_LISTS][CASE_MAX_TENSORS];      /* entry i of a list was loaded  */
    char *err;
    size_t err_size;
} loader;

typedef struct op_entry {
    const char *name;
    case_op op;
    bool (*setup)(loader *L);
    /* out[i] is produced[i], allocated with its declared shape. */
    linseq_status (*forward)(const ls_case *c, const linseq_exec *exec, float *const *out);
    /* grad[slot] is the computable gradient with that slot, or NULL when not requested. */
    linseq_status (*backward)(const ls_case *c, const linseq_exec *exec, float *const *grad);
} op_entry;

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

void case_exec_text(const linseq_exec *exec, bool with_mode, char *buf, size_t n)
{
    linseq_exec ex = exec ? *exec : (linseq_exec){0};
    int threads = ex.threads > 0 ? ex.threads : linseq_get_num_threads();
    char mode[48] = "";
    if (with_mode && ex.mode == LINSEQ_MODE_RECURRENT)
        snprintf(mode, sizeof mode, "recurrent, ");
    else if (with_mode)
        snprintf(mode, sizeof mode, "chunked, chunk %d, ", ex.chunk_size ? ex.chunk_size : 64);
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

static bool parse_decay(loader *L, const char *key, bool none_allowed, linseq_decay *out)
{
    const char *s;
    if (!meta_string(L, key, &s)) return false;
    if (s && strcmp(s, "per_channel") == 0) {
        *out = LINSEQ_DECAY_PER_CHANNEL;
    } else if (s && strcmp(s, "per_head") == 0) {
        *out = LINSEQ_DECAY_PER_HEAD;
    } else if (none_allowed && (!s || strcmp(s, "none") == 0)) {
        *out = LINSEQ_DECAY_NONE;
    } else {
        return meta_fail(L, "\"%s\" is %s%s%s (expected \"per_channel\" or \"per_head\"%s)", key,
                         s ? "\"" : "", s ? s : "missing", s ? "\"" : "",
                         none_allowed ? " or \"none\"" : "");
    }
    return true;
}

/* null keeps the op's default (identity for conv, silu for the SSM1 gate). */
static bool parse_activation(loader *L, const char *key, linseq_activation *out)
{
    static const struct {
        const char *name;
        linseq_activation act;
    } acts[] = {{"silu", LINSEQ_ACT_SILU},           {"sigmoid", LINSEQ_ACT_SIGMOID},
                {"gelu_tanh", LINSEQ_ACT_GELU_TANH}, {"relu", LINSEQ_ACT_RELU},
                {"identity", LINSEQ_ACT_IDENTITY},   {"none", LINSEQ_ACT_IDENTITY}};
    const char *s;
    if (!meta_string(L, key, &s)) return false;
    if (!s) return true;
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        if (strcmp(s, acts[i].name) == 0) {
            *out = acts[i].act;
            return true;
        }
    return meta_fail(L,
                     "\"%s\" is \"%s\" (expected null, \"silu\", \"sigmoid\", \"gelu_tanh\", "
                     "\"relu\" or \"identity\")",
                     key, s);
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
            return meta_fail(L, "\"%s\" holds an entry that is not a name of 1 to %d letters, "
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

static bool mul_size(loader *L, int64_t a, int64_t b, const char *what, int64_t *out)
{
    if (__builtin_mul_overflow(a, b, out)) return meta_fail(L, "%s overflows", what);
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
        return required ? meta_fail(L, "\"%s\" lacks \"%s\", which op %s requires",
                                    list_key[list], name, c->op_name)
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
                       "%s/%s.npy: shape %s, but meta.json's sizes give %s = %s", L->c->dir,
                       name, got, dims, want);
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

static bool declare(loader *L, case_output *o, const char *kind, const char *name,
                    const char *dims, int ndim, const int64_t *shape)
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

/* After the op's setup: the upstream gradients, "d_" and an output's name with its shape.
 * The backward cannot run without the first output's, so it is required with "grads". */
static bool load_upstream(loader *L)
{
    ls_case *c = L->c;
    bool need = L->grads && cJSON_GetArraySize(L->grads) > 0;
    for (int i = 0; i < c->n_produced && i < 2; i++) {
        const case_output *o = &c->produced[i];
        char name[CASE_NAME_LEN + 2], dims[64];
        snprintf(name, sizeof name, "d_%s", o->name);
        if (i == 0 && need && list_index(L->read[LIST_UPSTREAM], name) < 0)
            return meta_fail(L, "\"grads\" is not empty but \"upstream_grads\" lacks \"%s\", "
                                "the gradient of %s that the backward needs",
                             name, o->name);
        snprintf(dims, sizeof dims, "%s's shape %s", o->name, o->dims);
        if (!listed_f32(L, LIST_UPSTREAM, name, false, dims, o->ndim, o->shape, &c->upstream[i]))
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
            if (!L->used[list][i++])
                return meta_fail(L, "\"%s\" lists \"%s\", which op %s does not take with these "
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
        if (k == c->n_computable)
            return meta_fail(L, "\"grads\" lists \"%s\", which op %s does not compute with "
                                "these options",
                             a->valuestring, c->op_name);
        c->grads[c->n_grads++] = k;
    }
    return true;
}

/* ---------------------------------------------------------------------------------- */
/* The ops                                                                            */
/* ---------------------------------------------------------------------------------- */

/* Gradient slots, one per field of the op's grads struct. */
enum { KDA_DQ, KDA_DK, KDA_DV, KDA_DBETA, KDA_DG, KDA_DH0, KDA_DA_LOG, KDA_DDT_BIAS };
enum { GATE_DG_RAW, GATE_DA_LOG, GATE_DDT_BIAS };
enum {
    SSM1_DX, SSM1_DDT, SSM1_DA, SSM1_DB, SSM1_DC, SSM1_DD, SSM1_DGATE, SSM1_DH0, SSM1_DDT_BIAS
};
enum { CONV_DX, CONV_DWEIGHT, CONV_DBIAS, CONV_DSTATE };

static bool setup_kda(loader *L)
{
    linseq_kda_problem *p = &L->c->p.kda;
    int64_t B, T, H, HV, K, V, N, HVK;
    bool state_v_first, gate_in_kernel;
    if (!meta_size(L, "B", true, &B) || !meta_size(L, "T", true, &T) ||
        !meta_size(L, "H", true, &H) || !meta_size(L, "HV", false, &HV) ||
        !meta_size(L, "K", true, &K) || !meta_size(L, "V", true, &V) ||
        !meta_size(L, "N", false, &N) || !parse_decay(L, "decay", true, &p->decay) ||
        !meta_bool(L, "use_qk_l2norm", &p->qk_l2norm) ||
        !meta_bool(L, "beta_is_logit", &p->beta_is_logit) ||
        !meta_bool(L, "state_v_first", &state_v_first) ||
        !meta_bool(L, "gate_in_kernel", &gate_in_kernel) || !meta_float(L, "scale", &p->scale) ||
        !meta_float(L, "lower_bound", &p->lower_bound) ||
        !check_flag(L, LIST_INPUTS, "varlen", "cu_seqlens") ||
        !check_flag(L, LIST_INPUTS, "has_h0", "h0") ||
        !check_flag(L, LIST_UPSTREAM, "has_dht", "d_ht"))
        return false;
    if (!HV) HV = H;
    if (!mul_size(L, HV, K, "HV*K", &HVK)) return false;
    p->B = B;
    p->T = T;
    p->H = H;
    p->HV = HV;
    p->K = K;
    p->V = V;
    p->state_v_first = state_v_first;
    p->gate_in_kernel = gate_in_kernel;

    if (!input_cu_seqlens(L, N, &p->cu_seqlens, &p->n_seqs)) return false;
    int64_t rows = p->cu_seqlens ? p->n_seqs : B;
    if (N && N != rows)
        return meta_fail(L, "\"N\" is %lld but the state has %lld rows (B without cu_seqlens)",
                         (long long)N, (long long)rows);
    const int64_t state[4] = {rows, HV, state_v_first ? V : K, state_v_first ? K : V};
    const int64_t qk[4] = {B, T, H, K}, btv[4] = {B, T, HV, V}, bth[3] = {B, T, HV};
    const int64_t g_shape[4] = {B, T, HV, K}, bias_shape[1] = {HVK};
    const char *state_dims = state_v_first ? "[N,HV,V,K]" : "[N,HV,K,V]";
    bool per_channel = p->decay == LINSEQ_DECAY_PER_CHANNEL;
    const char *g_dims = per_channel ? "[B,T,HV,K]" : "[B,T,HV]";
    const char *bias_dims = per_channel ? "[HV*K]" : "[HV]";
    int g_ndim = per_channel ? 4 : 3;
    const int64_t *bias = per_channel ? bias_shape : &HV;

    if (!input_f32(L, "q", true, "[B,T,H,K]", 4, qk, &p->q) ||
        !input_f32(L, "k", true, "[B,T,H,K]", 4, qk, &p->k) ||
        !input_f32(L, "v", true, "[B,T,HV,V]", 4, btv, &p->v) ||
        !input_f32(L, "beta", true, "[B,T,HV]", 3, bth, &p->beta) ||
        !input_f32(L, "h0", false, state_dims, 4, state, &p->h0))
        return false;
    if (p->decay != LINSEQ_DECAY_NONE &&
        (!input_f32(L, "g", true, g_dims, g_ndim, g_shape, &p->g) ||
         !declare_grad(L, KDA_DG, "dg", g_dims, g_ndim, g_shape)))
        return false;
    if (gate_in_kernel &&
        (!input_f32(L, "A_log", false, "[HV]", 1, &HV, &p->A_log) ||
         !input_f32(L, "dt_bias", false, bias_dims, 1, bias, &p->dt_bias) ||
         !declare_grad(L, KDA_DA_LOG, "dA_log", "[HV]", 1, &HV) ||
         !declare_grad(L, KDA_DDT_BIAS, "ddt_bias", bias_dims, 1, bias)))
        return false;
    return declare_output(L, "o", "[B,T,HV,V]", 4, btv) &&
           declare_output(L, "ht", state_dims, 4, state) &&
           declare_grad(L, KDA_DQ, "dq", "[B,T,H,K]", 4, qk) &&
           declare_grad(L, KDA_DK, "dk", "[B,T,H,K]", 4, qk) &&
           declare_grad(L, KDA_DV, "dv", "[B,T,HV,V]", 4, btv) &&
           declare_grad(L, KDA_DBETA, "dbeta", "[B,T,HV]", 3, bth) &&
           declare_grad(L, KDA_DH0, "dh0", state_dims, 4, state);
}

static linseq_status forward_kda(const ls_case *c, const linseq_exec *exec, float *const *out)
{
    return linseq_kda_forward(&c->p.kda, exec, out[0], out[1]);
}

static linseq_status backward_kda(const ls_case *c, const linseq_exec *exec, float *const *d)
{
    const linseq_kda_grads g = {.dq = d[KDA_DQ],
                                .dk = d[KDA_DK],
                                .dv = d[KDA_DV],
                                .dbeta = d[KDA_DBETA],
                                .dg = d[KDA_DG],
                                .dh0 = d[KDA_DH0],
                                .dA_log = d[KDA_DA_LOG],
                                .ddt_bias = d[KDA_DDT_BIAS]};
    return linseq_kda_backward(&c->p.kda, exec, c->upstream[0], c->upstream[1], &g);
}

static bool setup_kda_gate(loader *L)
{
    linseq_kda_gate_problem *p = &L->c->p.gate;
    int64_t B, T, H, K = 0, HK = 0;
    if (!meta_size(L, "B", true, &B) || !meta_size(L, "T", true, &T) ||
        !meta_size(L, "H", true, &H) || !parse_decay(L, "decay", false, &p->decay) ||
        !meta_float(L, "lower_bound", &p->lower_bound))
        return false;
    bool per_channel = p->decay == LINSEQ_DECAY_PER_CHANNEL;
    /* Per head, the reference data writes "K": null and the library ignores K. */
    if (per_channel && (!meta_size(L, "K", true, &K) || !mul_size(L, H, K, "H*K", &HK)))
        return false;
    p->B = B;
    p->T = T;
    p->H = H;
    p->K = K;
    const int64_t g_shape[4] = {B, T, H, K}, bias[1] = {per_channel ? HK : H};
    const char *g_dims = per_channel ? "[B,T,H,K]" : "[B,T,H]";
    const char *bias_dims = per_channel ? "[H*K]" : "[H]";
    int g_ndim = per_channel ? 4 : 3;
    /* dA_log and ddt_bias exist without A_log and dt_bias: the gradient at zeros. */
    return input_f32(L, "g_raw", true, g_dims, g_ndim, g_shape, &p->g_raw) &&
           input_f32(L, "A_log", false, "[H]", 1, &H, &p->A_log) &&
           input_f32(L, "dt_bias", false, bias_dims, 1, bias, &p->dt_bias) &&
           declare_output(L, "g", g_dims, g_ndim, g_shape) &&
           declare_grad(L, GATE_DG_RAW, "dg_raw", g_dims, g_ndim, g_shape) &&
           declare_grad(L, GATE_DA_LOG, "dA_log", "[H]", 1, &H) &&
           declare_grad(L, GATE_DDT_BIAS, "ddt_bias", bias_dims, 1, bias);
}

static linseq_status forward_kda_gate(const ls_case *c, const linseq_exec *exec,
                                      float *const *out)
{
    return linseq_kda_gate_forward(&c->p.gate, exec, out[0]);
}

static linseq_status backward_kda_gate(const ls_case *c, const linseq_exec *exec,
                                       float *const *d)
{
    const linseq_kda_gate_grads g = {
        .dg_raw = d[GATE_DG_RAW], .dA_log = d[GATE_DA_LOG], .ddt_bias = d[GATE_DDT_BIAS]};
    return linseq_kda_gate_backward(&c->p.gate, exec, c->upstream[0], &g);
}

static bool setup_ssm1(loader *L)
{
    linseq_ssm1_problem *p = &L->c->p.ssm1;
    int64_t B, T, D, N, G;
    /* "activation" is how the reference data names the gate's; "gate_activation" wins. */
    if (!meta_size(L, "B", true, &B) || !meta_size(L, "T", true, &T) ||
        !meta_size(L, "D", true, &D) || !meta_size(L, "N", true, &N) ||
        !meta_size(L, "G", false, &G) || !meta_bool(L, "dt_softplus", &p->dt_softplus) ||
        !parse_activation(L, "activation", &p->gate_activation) ||
        !parse_activation(L, "gate_activation", &p->gate_activation) ||
        !check_flag(L, LIST_INPUTS, "varlen", "cu_seqlens") ||
        !check_flag(L, LIST_INPUTS, "has_h0", "h0") ||
        !check_flag(L, LIST_INPUTS, "has_gate", "gate") ||
        !check_flag(L, LIST_UPSTREAM, "has_dhT", "d_hT"))
        return false;
    p->B = B;
    p->T = T;
    p->D = D;
    p->N = N;
    p->G = G;
    if (!input_cu_seqlens(L, 0, &p->cu_seqlens, &p->n_seqs)) return false;
    int64_t rows = p->cu_seqlens ? p->n_seqs : B;
    const int64_t btd[3] = {B, T, D}, state[3] = {rows, D, N}, dn[2] = {D, N};
    /* Without "G" the projections are [B,T,N] as in the reference data. */
    const int64_t bc[4] = {B, T, G ? G : N, N};
    const char *bc_dims = G ? "[B,T,G,N]" : "[B,T,N]";
    int bc_ndim = G ? 4 : 3;
    if (!input_f32(L, "x", true, "[B,T,D]", 3, btd, &p->x) ||
        !input_f32(L, "dt", true, "[B,T,D]", 3, btd, &p->dt) ||
        !input_f32(L, "A", true, "[D,N]", 2, dn, &p->A) ||
        !input_f32(L, "B", true, bc_dims, bc_ndim, bc, &p->B_proj) ||
        !input_f32(L, "C", true, bc_dims, bc_ndim, bc, &p->C_proj) ||
        !input_f32(L, "D", false, "[D]", 1, &D, &p->D_skip) ||
        !input_f32(L, "gate", false, "[B,T,D]", 3, btd, &p->gate) ||
        !input_f32(L, "h0", false, "[N_seq,D,N]", 3, state, &p->h0))
        return false;
    if (p->dt_softplus && !input_f32(L, "dt_bias", false, "[D]", 1, &D, &p->dt_bias))
        return false;
    /* The file names follow the inputs (dB, dC, dD), not the grads struct's fields. */
    return declare_output(L, "y", "[B,T,D]", 3, btd) &&
           declare_output(L, "hT", "[N_seq,D,N]", 3, state) &&
           declare_grad(L, SSM1_DX, "dx", "[B,T,D]", 3, btd) &&
           declare_grad(L, SSM1_DDT, "ddt", "[B,T,D]", 3, btd) &&
           declare_grad(L, SSM1_DA, "dA", "[D,N]", 2, dn) &&
           declare_grad(L, SSM1_DB, "dB", bc_dims, bc_ndim, bc) &&
           declare_grad(L, SSM1_DC, "dC", bc_dims, bc_ndim, bc) &&
           (!p->D_skip || declare_grad(L, SSM1_DD, "dD", "[D]", 1, &D)) &&
           (!p->gate || declare_grad(L, SSM1_DGATE, "dgate", "[B,T,D]", 3, btd)) &&
           declare_grad(L, SSM1_DH0, "dh0", "[N_seq,D,N]", 3, state) &&
           (!p->dt_softplus || declare_grad(L, SSM1_DDT_BIAS, "ddt_bias", "[D]", 1, &D));
}

static linseq_status forward_ssm1(const ls_case *c, const linseq_exec *exec, float *const *out)
{
    return linseq_ssm1_forward(&c->p.ssm1, exec, out[0], out[1]);
}

static linseq_status backward_ssm1(const ls_case *c, const linseq_exec *exec, float *const *d)
{
    const linseq_ssm1_grads g = {.dx = d[SSM1_DX],
                                 .ddt = d[SSM1_DDT],
                                 .dA = d[SSM1_DA],
                                 .dB_proj = d[SSM1_DB],
                                 .dC_proj = d[SSM1_DC],
                                 .dD_skip = d[SSM1_DD],
                                 .dgate = d[SSM1_DGATE],
                                 .dh0 = d[SSM1_DH0],
                                 .ddt_bias = d[SSM1_DDT_BIAS]};
    return linseq_ssm1_backward(&c->p.ssm1, exec, c->upstream[0], c->upstream[1], &g);
}

static bool setup_conv1d(loader *L)
{
    linseq_conv1d_problem *p = &L->c->p.conv;
    int64_t B, T, D, W;
    p->activation = LINSEQ_ACT_IDENTITY; /* "activation": null means none */
    if (!meta_size(L, "B", true, &B) || !meta_size(L, "T", true, &T) ||
        !meta_size(L, "D", true, &D) || !meta_size(L, "W", true, &W) ||
        !parse_activation(L, "activation", &p->activation) ||
        !check_flag(L, LIST_INPUTS, "varlen", "cu_seqlens") ||
        !check_flag(L, LIST_INPUTS, "has_bias", "bias") ||
        !check_flag(L, LIST_INPUTS, "has_state", "conv_state"))
        return false;
    p->B = B;
    p->T = T;
    p->D = D;
    p->W = W;
    if (!input_cu_seqlens(L, 0, &p->cu_seqlens, &p->n_seqs)) return false;
    int64_t rows = p->cu_seqlens ? p->n_seqs : B;
    const int64_t btd[3] = {B, T, D}, dw[2] = {D, W}, state[3] = {rows, D, W - 1};
    return input_f32(L, "x", true, "[B,T,D]", 3, btd, &p->x) &&
           input_f32(L, "weight", true, "[D,W]", 2, dw, &p->weight) &&
           input_f32(L, "bias", false, "[D]", 1, &D, &p->bias) &&
           input_f32(L, "conv_state", false, "[N_seq,D,W-1]", 3, state, &p->conv_state) &&
           declare_output(L, "y", "[B,T,D]", 3, btd) &&
           declare_output(L, "conv_state_out", "[N_seq,D,W-1]", 3, state) &&
           declare_grad(L, CONV_DX, "dx", "[B,T,D]", 3, btd) &&
           declare_grad(L, CONV_DWEIGHT, "dweight", "[D,W]", 2, dw) &&
           (!p->bias || declare_grad(L, CONV_DBIAS, "dbias", "[D]", 1, &D)) &&
           declare_grad(L, CONV_DSTATE, "dconv_state", "[N_seq,D,W-1]", 3, state);
}

static linseq_status forward_conv1d(const ls_case *c, const linseq_exec *exec,
                                    float *const *out)
{
    return linseq_conv1d_forward(&c->p.conv, exec, out[0], out[1]);
}

static linseq_status backward_conv1d(const ls_case *c, const linseq_exec *exec,
                                     float *const *d)
{
    const linseq_conv1d_grads g = {.dx = d[CONV_DX],
                                   .dweight = d[CONV_DWEIGHT],
                                   .dbias = d[CONV_DBIAS],
                                   .dconv_state = d[CONV_DSTATE]};
    return linseq_conv1d_backward(&c->p.conv, exec, c->upstream[0], c->upstream[1], &g);
}

static const op_entry ops[] = {
    {"kda", CASE_OP_KDA, setup_kda, forward_kda, backward_kda},
    {"kda_gate", CASE_OP_KDA_GATE, setup_kda_gate, forward_kda_gate, backward_kda_gate},
    {"ssm1", CASE_OP_SSM1, setup_ssm1, forward_ssm1, backward_ssm1},
    {"causal_conv1d", CASE_OP_CONV1D, setup_conv1d, forward_conv1d, backward_conv1d},
};

static const op_entry *op_find(const char *name)
{
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(ops[i].name, name) == 0) return &ops[i];
    return NULL;
}

static const op_entry *op_of(case_op op)
{
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (ops[i].op == op) return &ops[i];
    return NULL;
}

/* ---------------------------------------------------------------------------------- */
/* Loading                                                                            */
/* ---------------------------------------------------------------------------------- */

static char *read_text(const char *path, size_t *len, char *err, size_t err_size)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fail_to(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1) break;
        if ((long)cap > META_MAX_BYTES) {
            fail_to(err, err_size, "%s: larger than %ld bytes", path, META_MAX_BYTES);
            free(buf);
            fclose(f);
            return NULL;
        }
        char *bigger = realloc(buf, cap * 2);
        if (!bigger) free(buf);
        buf = bigger;
        cap *= 2;
    }
    bool bad = ferror(f);
    fclose(f);
    /* the loop stops growing at twice the limit; the limit itself holds exactly */
    if (buf && n > (size_t)META_MAX_BYTES) {
        fail_to(err, err_size, "%s: larger than %ld bytes", path, META_MAX_BYTES);
        free(buf);
        return NULL;
    }
    if (!buf) {
        fail_to(err, err_size, "%s: out of memory", path);
        return NULL;
    }
    if (bad) {
        fail_to(err, err_size, "%s: read error", path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
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
    const op_entry *op = ok ? op_find(op_name) : NULL;
    if (ok && !op)
        ok = meta_fail(&L, "unknown op \"%s\" (expected kda, kda_gate, ssm1 or causal_conv1d)",
                       op_name);
    if (ok) {
        c->op = op->op;
        c->op_name = op->name;
        ok = name_list(&L, "inputs", true, &L.read[LIST_INPUTS]) &&
             name_list(&L, "upstream_grads", false, &L.read[LIST_UPSTREAM]) &&
             name_list(&L, "outputs", true, &L.outputs) &&
             name_list(&L, "grads", false, &L.grads) && op->setup(&L) && load_upstream(&L) &&
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
    memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------------------------- */
/* Running                                                                            */
/* ---------------------------------------------------------------------------------- */

/* The other ops have one algorithm; a KDA mode or chunk size means nothing to them. */
static linseq_exec op_exec(const ls_case *c, const linseq_exec *exec)
{
    linseq_exec ex = exec ? *exec : (linseq_exec){0};
    if (c->op != CASE_OP_KDA) {
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

int case_run(const ls_case *c, const linseq_exec *exec, case_result *r, char *err,
             size_t err_size)
{
    const op_entry *op = op_of(c->op);
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
        st = case_call_on_device(c, op->forward, &ex, out, counts, r->n, err, err_size);
    } else {
        st = op->forward(c, &ex, out);
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
    const op_entry *op = op_of(c->op);
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
        st = case_call_on_device(c, op->backward, &ex, grad, counts, CASE_MAX_TENSORS, err,
                                 err_size);
    } else {
        st = op->backward(c, &ex, grad);
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

bool case_write_outputs(const ls_case *c, const case_result *r, const char *out_dir,
                        char *err, size_t err_size)
{
    char *written[2 * CASE_MAX_TENSORS];
    int n_written = 0;
    bool ok = make_dirs(out_dir, err, err_size);
    for (int i = 0; ok && i < c->n_outputs + r->n_grads; i++) {
        const case_tensor *t = i < c->n_outputs ? case_output_tensor(c, r, i)
                                                : &r->g[i - c->n_outputs];
        char *path = case_path(out_dir, t->name, ".npy");
        if (!path) {
            ok = fail_to(err, err_size, "out of memory");
        } else if (!npy_write_f32(path, t->arr.data, t->arr.ndim, t->arr.shape, err,
                                  err_size)) {
            ok = false;
            free(path);
        } else {
            written[n_written++] = path;
        }
    }
    for (int i = 0; i < n_written; i++) {
        if (!ok) unlink(written[i]);
        free(written[i]);
    }
    return ok;
}

int cmd_run(const char *case_dir, const char *out_dir, const linseq_exec *exec, bool fwd_only)
{
    ls_case c;
    case_result r;
    char err[2048];
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
        case_exec_text(exec, c.op == CASE_OP_KDA, how, sizeof how);
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
