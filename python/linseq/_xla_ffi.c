/*
 * linseq's XLA FFI handlers: the JAX front end (linseq/jax.py) runs the library's entry points
 * as XLA custom calls on the CPU, reading and writing XLA's buffers where they lie.
 *
 * This file is built apart from liblinseq, which never sees an XLA header: by
 * scripts/build-xla-ffi.sh, against the C header jax ships (jax.ffi.include_dir()). It does not
 * link liblinseq either: linseq/jax.py hands it the addresses of the entry points of the copy
 * of liblinseq the package already loaded (linseq_xla_ffi_bind), so one library, with its one
 * thread setting, serves the NumPy, PyTorch and JAX paths.
 *
 * There are three handlers, one per call kind (linseq_xla_forward, _backward, _decode), and
 * each serves every op of the library's table through linseq_op_forward, _backward and
 * _decode: a new op of the table needs no line here. What one call computes is described by
 * Python at trace time, from the table and the code that validates the NumPy calls
 * (linseq.ops), so that nothing about shapes or options is decided twice:
 *   "op":              the op's table name (a string);
 *   "problem", "exec": the op's problem struct and the linseq_exec as bytes (int64 words),
 *                      every pointer zero;
 *   "fields", "kinds": per operand, the byte offset of the problem field it fills and how
 *                      (a float32 array's pointer, a float32 scalar's value, integer offsets
 *                      as an int64 array), or that it is an argument of the entry point
 *                      itself (upstream gradients, the decode pool and its rows);
 *   "outputs":         forward and decode: per output tensor of the table, the result that
 *                      holds it, or -1 (a decode's state output: the new pool, last result);
 *   "upstream", "grads": backward: per upstream tensor of the table, the entry argument that
 *                      holds it or -1; per result, the offset of its pointer in the grads
 *                      struct.
 * The handler checks every offset and index against the sizes it was given and its own
 * buffers, points the problem at the operands, runs the call (which validates everything
 * against the table again, the struct sizes included by Python before the call is made) and
 * turns a status other than LINSEQ_OK into an XLA error carrying linseq_last_error()'s
 * message. It keeps no state between calls (the bound entry points are written once, before
 * any handler is registered), so concurrent calls are as safe as the library's entry points.
 */
#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "linseq.h"
#include "xla/ffi/api/c_api.h"

#define LX_API __attribute__((visibility("default")))

/* ------------------------------------------------------------------------------------ */
/* The library's entry points, bound by Python                                          */
/* ------------------------------------------------------------------------------------ */

/* The table's calls by op name (linseq.h): one handler per call kind serves every op. */
static struct {
    linseq_status (*op_forward)(const char *, const void *, const linseq_exec *, float *const *);
    linseq_status (*op_decode)(const char *, const void *, const linseq_exec *, float *, int64_t,
                               const int64_t *, float *const *);
    linseq_status (*op_backward)(const char *, const void *, const linseq_exec *,
                                 const float *const *, const void *);
    const char *(*last_error)(void);
} entry;

/* Each slot is a function pointer; the address Python passes is copied into it bytewise. */
static const struct {
    const char *name;
    void *slot;
    size_t size;
} entry_slots[] = {
    {"op_forward", &entry.op_forward, sizeof entry.op_forward},
    {"op_decode", &entry.op_decode, sizeof entry.op_decode},
    {"op_backward", &entry.op_backward, sizeof entry.op_backward},
    {"last_error", &entry.last_error, sizeof entry.last_error},
};
#define LX_N_ENTRIES (sizeof entry_slots / sizeof entry_slots[0])

/* Binds the entry point `name` (linseq_NAME without the prefix) to `address`: 0 when the
 * name is known, -1 otherwise. Called from one thread before any handler is registered. */
LX_API int linseq_xla_ffi_bind(const char *name, void *address);
int linseq_xla_ffi_bind(const char *name, void *address)
{
    for (size_t i = 0; i < LX_N_ENTRIES; i++) {
        if (strcmp(entry_slots[i].name, name) == 0 && entry_slots[i].size == sizeof address) {
            memcpy(entry_slots[i].slot, &address, sizeof address);
            return 0;
        }
    }
    return -1;
}

/* The name of entry point `index` for linseq_xla_ffi_bind; NULL past the last. */
LX_API const char *linseq_xla_ffi_entry_name(int index);
const char *linseq_xla_ffi_entry_name(int index)
{
    return index >= 0 && (size_t)index < LX_N_ENTRIES ? entry_slots[index].name : NULL;
}

/* The largest problem or grads struct (bytes) a call can carry; Python checks the table's
 * sizes against it before it describes a call. */
#define LX_STRUCT_BYTES 1024
LX_API int64_t linseq_xla_ffi_struct_capacity(void);
int64_t linseq_xla_ffi_struct_capacity(void) { return LX_STRUCT_BYTES; }

/* ------------------------------------------------------------------------------------ */
/* One call: the frame, the problem and exec it describes, and what it allocated         */
/* ------------------------------------------------------------------------------------ */

enum bind_kind {
    BIND_F32_POINTER = 0, /* a float32 array: its pointer goes to the field */
    BIND_F32_VALUE = 1,   /* a float32 scalar: its value goes to the field (scale ...) */
    BIND_I64_POINTER = 2, /* integer offsets: as int64, their pointer goes to the field */
    BIND_ENTRY_ARG = 3    /* not in the problem: the entry point's own argument, in order */
};

#define LX_MAX_ENTRY_ARGS 8 /* upstream gradients; the decode's pool and rows */
#define LX_MAX_ROLE 16      /* tensors of one role (outputs, upstream) an op may have */
#define LX_MAX_OWNED 4
#define LX_MAX_NAME 64

typedef struct call {
    XLA_FFI_CallFrame *frame;
    char op[LX_MAX_NAME]; /* the op's table name */
    const char *kind;     /* "forward", "backward", "decode": for messages */
    alignas(max_align_t) unsigned char problem[LX_STRUCT_BYTES];
    size_t problem_size; /* the bytes the description gave (the rest stays zero) */
    linseq_exec exec;
    XLA_FFI_Buffer *entry_args[LX_MAX_ENTRY_ARGS];
    int n_entry_args;
    int64_t *owned[LX_MAX_OWNED]; /* int64 copies of integer operands, freed by finish() */
    int n_owned;
    const char *mismatch; /* set when the description does not fit: no library call made */
} call;

static XLA_FFI_Error *error(const call *c, XLA_FFI_Error_Code code, const char *what)
{
    char message[1024];
    snprintf(message, sizeof message, "linseq %s of op '%s': %s", c->kind, c->op[0] ? c->op : "?",
             what);
    XLA_FFI_Error_Create_Args args;
    memset(&args, 0, sizeof args);
    args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    args.message = message; /* XLA keeps its own copy */
    args.errc = code;
    return c->frame->api->XLA_FFI_Error_Create(&args);
}

/* XLA asks each handler, before any call, which FFI version it was built against. */
static bool answered_metadata(XLA_FFI_CallFrame *frame)
{
    XLA_FFI_Extension_Base *ext = frame->extension_start;
    if (ext == NULL || ext->type != XLA_FFI_Extension_Metadata) return false;
    XLA_FFI_Metadata *metadata = ((XLA_FFI_Metadata_Extension *)ext)->metadata;
    metadata->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    metadata->api_version.extension_start = NULL;
    metadata->api_version.major_version = XLA_FFI_API_MAJOR;
    metadata->api_version.minor_version = XLA_FFI_API_MINOR;
    metadata->traits = 0;
    return true;
}

/* The attribute `name` of `type`, or NULL. */
static void *attr(const call *c, const char *name, XLA_FFI_AttrType type)
{
    const XLA_FFI_Attrs *attrs = &c->frame->attrs;
    size_t len = strlen(name);
    for (int64_t i = 0; i < attrs->size; i++) {
        const XLA_FFI_ByteSpan *key = attrs->names[i];
        if (key->len == len && memcmp(key->ptr, name, len) == 0)
            return attrs->types[i] == type ? attrs->attrs[i] : NULL;
    }
    return NULL;
}

/* An int64 array attribute, or NULL. */
static const XLA_FFI_Array *array_attr(const call *c, const char *name)
{
    const XLA_FFI_Array *arr = attr(c, name, XLA_FFI_AttrType_ARRAY);
    return arr != NULL && arr->dtype == XLA_FFI_DataType_S64 ? arr : NULL;
}

/* The op's name (a string attribute) into c->op; false when absent or too long. */
static bool read_op_name(call *c)
{
    const XLA_FFI_ByteSpan *name = attr(c, "op", XLA_FFI_AttrType_STRING);
    if (name == NULL || name->len == 0 || name->len >= sizeof c->op) return false;
    memcpy(c->op, name->ptr, name->len);
    c->op[name->len] = '\0';
    return true;
}

static int64_t element_count(const XLA_FFI_Buffer *buf)
{
    int64_t n = 1;
    for (int64_t i = 0; i < buf->rank; i++) n *= buf->dims[i];
    return n;
}

/* Copies the int64 words the attribute holds into `out` (capacity bytes, zeroed first);
 * the bytes given, or 0 when absent or too large. */
static size_t read_struct(const call *c, const char *name, void *out, size_t capacity)
{
    const XLA_FFI_Array *arr = array_attr(c, name);
    if (arr == NULL || arr->size == 0 || arr->size > capacity / 8) return 0;
    memset(out, 0, capacity);
    memcpy(out, arr->data, arr->size * 8);
    return arr->size * 8;
}

static void release(call *c)
{
    for (int i = 0; i < c->n_owned; i++) free(c->owned[i]);
    c->n_owned = 0;
}

/* An integer buffer (int32 or int64) as a new int64 array the call owns; NULL on failure. */
static const int64_t *as_int64(call *c, const XLA_FFI_Buffer *buf)
{
    int64_t n = element_count(buf);
    if (c->n_owned == LX_MAX_OWNED || n < 0) return NULL;
    if (buf->dtype != XLA_FFI_DataType_S64 && buf->dtype != XLA_FFI_DataType_S32) return NULL;
    int64_t *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    if (out == NULL) return NULL;
    c->owned[c->n_owned++] = out;
    if (buf->dtype == XLA_FFI_DataType_S64) {
        memcpy(out, buf->data, (size_t)n * sizeof *out);
    } else {
        const int32_t *in = buf->data;
        for (int64_t i = 0; i < n; i++) out[i] = in[i];
    }
    return out;
}

static bool fits(int64_t offset, size_t size, size_t align, size_t limit)
{
    return offset >= 0 && (uint64_t)offset % align == 0 && (uint64_t)offset + size <= limit;
}

/* One operand into the problem (or the entry point's arguments); false when the description
 * does not fit the problem's size or the buffer's type. */
static bool bind_operand(call *c, XLA_FFI_Buffer *buf, int64_t kind, int64_t offset)
{
    if (kind == BIND_ENTRY_ARG) {
        if (c->n_entry_args == LX_MAX_ENTRY_ARGS) return false;
        c->entry_args[c->n_entry_args++] = buf;
        return true;
    }
    if (kind == BIND_F32_VALUE) {
        if (!fits(offset, sizeof(float), alignof(float), c->problem_size) ||
            buf->dtype != XLA_FFI_DataType_F32 || element_count(buf) != 1)
            return false;
        memcpy(c->problem + offset, buf->data, sizeof(float));
        return true;
    }
    const void *pointer = buf->data;
    if (kind == BIND_I64_POINTER)
        pointer = as_int64(c, buf);
    else if (kind != BIND_F32_POINTER || buf->dtype != XLA_FFI_DataType_F32)
        return false;
    if (pointer == NULL || !fits(offset, sizeof(void *), alignof(void *), c->problem_size))
        return false;
    memcpy(c->problem + offset, &pointer, sizeof pointer);
    return true;
}

/* Reads the call's description and binds its operands; NULL or the XLA error to return. */
static XLA_FFI_Error *start(call *c, XLA_FFI_CallFrame *frame, const char *kind, bool bound)
{
    memset(c, 0, sizeof *c);
    c->frame = frame;
    c->kind = kind;
    if (!bound || entry.last_error == NULL)
        return error(c, XLA_FFI_Error_Code_FAILED_PRECONDITION,
                     "the linseq entry points were not bound (load through linseq.jax)");
    if (frame->struct_size < XLA_FFI_CallFrame_STRUCT_SIZE)
        return error(c, XLA_FFI_Error_Code_FAILED_PRECONDITION, "an older XLA call frame");
    const XLA_FFI_Array *fields = array_attr(c, "fields"), *kinds = array_attr(c, "kinds");
    c->problem_size = read_struct(c, "problem", c->problem, sizeof c->problem);
    if (!read_op_name(c) || c->problem_size == 0 ||
        read_struct(c, "exec", &c->exec, sizeof c->exec) != (sizeof c->exec + 7) / 8 * 8 ||
        fields == NULL || kinds == NULL || fields->size != (size_t)frame->args.size ||
        kinds->size != fields->size)
        return error(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                     "the call's description does not match linseq.h (op, problem, exec, "
                     "fields, kinds)");
    const int64_t *offset = fields->data, *how = kinds->data;
    for (int64_t i = 0; i < frame->args.size; i++) {
        if (frame->args.types[i] != XLA_FFI_ArgType_BUFFER ||
            !bind_operand(c, frame->args.args[i], how[i], offset[i])) {
            char what[96];
            snprintf(what, sizeof what, "operand %lld does not fit its description", (long long)i);
            release(c);
            return error(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, what);
        }
    }
    return NULL;
}

/* Frees what the call allocated; the mismatch or the library's status as an XLA error (NULL
 * when the call ran and returned LINSEQ_OK). */
static XLA_FFI_Error *finish(call *c, linseq_status status)
{
    release(c);
    if (c->mismatch != NULL) return error(c, XLA_FFI_Error_Code_INVALID_ARGUMENT, c->mismatch);
    if (status == LINSEQ_OK) return NULL;
    const char *message = entry.last_error();
    return error(c,
                 status == LINSEQ_ERR_OUT_OF_MEMORY ? XLA_FFI_Error_Code_RESOURCE_EXHAUSTED
                                                    : XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 message && *message ? message : "failed");
}

static float *result(const call *c, int64_t i)
{
    return ((XLA_FFI_Buffer *)c->frame->rets.rets[i])->data;
}

/* The tensors of one role in the table's order, from the attribute `name`: per tensor, the
 * index of the result (or entry argument) that holds it, or -1 for none (NULL). `n_from`
 * bounds the indices; the count is written to *n. */
static bool read_role(call *c, const char *name, int64_t n_from, bool from_results, float **out,
                      int *n)
{
    const XLA_FFI_Array *map = array_attr(c, name);
    if (map == NULL || map->size > LX_MAX_ROLE) return false;
    const int64_t *index = map->data;
    for (size_t i = 0; i < map->size; i++) {
        if (index[i] < -1 || index[i] >= n_from) return false;
        out[i] = index[i] < 0   ? NULL
                 : from_results ? result(c, index[i])
                                : c->entry_args[index[i]]->data;
    }
    *n = (int)map->size;
    return true;
}

/* XLA runs its CPU code with denormals flushed to zero (MXCSR FTZ and DAZ on x86, FPCR FZ on
 * Arm). The library's results are defined, and tested, under the default floating-point
 * environment, where the NumPy and PyTorch paths call it; flushing would change the bits of any
 * result with a denormal on its way. So each call runs under the default environment, and
 * XLA's is put back before the handler returns. */
#if defined(__x86_64__) || defined(__i386__)
#define LX_FLUSH_BITS 0x8040u /* FTZ (bit 15) | DAZ (bit 6) */
typedef unsigned int fp_mode;
static fp_mode default_fp_mode(void)
{
    fp_mode saved = _mm_getcsr();
    _mm_setcsr(saved & ~LX_FLUSH_BITS);
    return saved;
}
static void restore_fp_mode(fp_mode saved) { _mm_setcsr(saved); }
#elif defined(__aarch64__)
typedef uint64_t fp_mode;
static fp_mode default_fp_mode(void)
{
    fp_mode saved = __builtin_aarch64_get_fpcr64();
    __builtin_aarch64_set_fpcr64(saved & ~(UINT64_C(1) << 24)); /* FZ */
    return saved;
}
static void restore_fp_mode(fp_mode saved) { __builtin_aarch64_set_fpcr64(saved); }
#else
typedef int fp_mode;
static fp_mode default_fp_mode(void) { return 0; }
static void restore_fp_mode(fp_mode saved) { (void)saved; }
#endif

/* What one call kind does over a started call; a description that does not fit sets
 * c->mismatch and returns without calling the library. */
typedef linseq_status (*runner)(call *c);

static XLA_FFI_Error *handle(XLA_FFI_CallFrame *frame, const char *kind, bool bound, runner run)
{
    if (answered_metadata(frame)) return NULL;
    call c;
    XLA_FFI_Error *err = start(&c, frame, kind, bound);
    if (err != NULL) return err;
    fp_mode saved = default_fp_mode();
    linseq_status status = run(&c);
    restore_fp_mode(saved);
    return finish(&c, status);
}

#define LX_ROLE_MISMATCH "the tensors' description does not match the op's table entry"

/* forward: operands the inputs; results the outputs, placed by the attribute "outputs". */
static linseq_status run_forward(call *c)
{
    float *outputs[LX_MAX_ROLE];
    int n;
    if (!read_role(c, "outputs", c->frame->rets.size, true, outputs, &n))
        return c->mismatch = LX_ROLE_MISMATCH, LINSEQ_OK;
    return entry.op_forward(c->op, c->problem, &c->exec, outputs);
}

/* backward: operands (inputs..., upstream gradients as entry arguments, placed by the
 * attribute "upstream"); results the gradients, each at the offset in the grads struct the
 * attribute "grads" gives it. */
static linseq_status run_backward(call *c)
{
    float *upstream[LX_MAX_ROLE];
    int n;
    alignas(max_align_t) unsigned char grads[LX_STRUCT_BYTES];
    memset(grads, 0, sizeof grads);
    const XLA_FFI_Array *offsets = array_attr(c, "grads");
    if (!read_role(c, "upstream", c->n_entry_args, false, upstream, &n) || offsets == NULL ||
        offsets->size != (size_t)c->frame->rets.size)
        return c->mismatch = LX_ROLE_MISMATCH, LINSEQ_OK;
    for (int64_t i = 0; i < c->frame->rets.size; i++) {
        int64_t at = ((const int64_t *)offsets->data)[i];
        float *pointer = result(c, i);
        if (!fits(at, sizeof pointer, alignof(float *), sizeof grads))
            return c->mismatch = LX_ROLE_MISMATCH, LINSEQ_OK;
        memcpy(grads + at, &pointer, sizeof pointer);
    }
    return entry.op_backward(c->op, c->problem, &c->exec, (const float *const *)upstream, grads);
}

/* decode: operands (inputs..., pool[, rows]); results (the outputs placed by "outputs", then
 * the new pool last). The new pool is the old one's buffer when XLA aliases them
 * (input_output_aliases), else a copy of it, updated where it lies. */
static linseq_status run_decode(call *c)
{
    float *outputs[LX_MAX_ROLE];
    int n;
    int64_t n_rets = c->frame->rets.size;
    const int64_t *rows = NULL;
    if (c->n_entry_args < 1 || c->n_entry_args > 2 || n_rets < 1 ||
        !read_role(c, "outputs", n_rets - 1, true, outputs, &n))
        return c->mismatch = LX_ROLE_MISMATCH, LINSEQ_OK;
    const XLA_FFI_Buffer *pool = c->entry_args[0];
    const XLA_FFI_Buffer *new_pool_buf = c->frame->rets.rets[n_rets - 1];
    if (pool->dtype != XLA_FFI_DataType_F32 || pool->rank < 1 ||
        new_pool_buf->dtype != XLA_FFI_DataType_F32 ||
        element_count(new_pool_buf) != element_count(pool) ||
        (c->n_entry_args == 2 && (rows = as_int64(c, c->entry_args[1])) == NULL)) {
        c->mismatch = "expected a float32 pool, a new pool of its size and integer rows";
        return LINSEQ_OK;
    }
    float *new_pool = new_pool_buf->data;
    if (new_pool != pool->data)
        memcpy(new_pool, pool->data, (size_t)element_count(pool) * sizeof(float));
    return entry.op_decode(c->op, c->problem, &c->exec, new_pool, pool->dims[0], rows, outputs);
}

/* linseq_xla_KIND: the handler XLA calls for the custom call target linseq_KIND, for every
 * op of the table (the attribute "op" names it). */
#define LX_HANDLER(kind)                                                                           \
    LX_API XLA_FFI_Error *linseq_xla_##kind(XLA_FFI_CallFrame *frame);                             \
    XLA_FFI_Error *linseq_xla_##kind(XLA_FFI_CallFrame *frame)                                     \
    {                                                                                              \
        return handle(frame, #kind, entry.op_##kind != NULL, run_##kind);                          \
    }

LX_HANDLER(forward)
LX_HANDLER(backward)
LX_HANDLER(decode)
