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
 * What one call computes is described by Python at trace time, by the code that validates the
 * NumPy calls (linseq.ops), so that nothing about shapes or options is decided twice:
 *   "problem", "exec": the op's problem struct and the linseq_exec as bytes (int64 words),
 *                      every pointer zero;
 *   "fields", "kinds": per operand, the byte offset of the problem field it fills and how
 *                      (a float32 array's pointer, a float32 scalar's value, integer offsets
 *                      as an int64 array), or that it is an argument of the entry point
 *                      itself (upstream gradients, the decode pool and its rows);
 *   "grads":           backward only: per result, the offset of its pointer in the grads
 *                      struct.
 * The handler checks every size and offset against linseq.h, points the problem at the
 * buffers, runs the entry point (which validates everything again) and turns a status other
 * than LINSEQ_OK into an XLA error carrying linseq_last_error()'s message. It keeps no state
 * between calls (the bound entry points are written once, before any handler is registered),
 * so concurrent calls are as safe as the library's entry points are.
 */
#include <stdalign.h>
#include <stdbool.h>
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

static struct {
    linseq_status (*kda_forward)(const linseq_kda_problem *, const linseq_exec *, float *, float *);
    linseq_status (*ssm1_forward)(const linseq_ssm1_problem *, const linseq_exec *, float *,
                                  float *);
    linseq_status (*conv1d_forward)(const linseq_conv1d_problem *, const linseq_exec *, float *,
                                    float *);
    linseq_status (*kda_gate_forward)(const linseq_kda_gate_problem *, const linseq_exec *,
                                      float *);
    linseq_status (*kda_backward)(const linseq_kda_problem *, const linseq_exec *, const float *,
                                  const float *, const linseq_kda_grads *);
    linseq_status (*ssm1_backward)(const linseq_ssm1_problem *, const linseq_exec *, const float *,
                                   const float *, const linseq_ssm1_grads *);
    linseq_status (*conv1d_backward)(const linseq_conv1d_problem *, const linseq_exec *,
                                     const float *, const float *, const linseq_conv1d_grads *);
    linseq_status (*kda_gate_backward)(const linseq_kda_gate_problem *, const linseq_exec *,
                                       const float *, const linseq_kda_gate_grads *);
    linseq_status (*kda_decode)(const linseq_kda_problem *, const linseq_exec *, float *, int64_t,
                                const int64_t *, float *);
    const char *(*last_error)(void);
} entry;

/* Each slot is a function pointer; the address Python passes is copied into it bytewise. */
static const struct {
    const char *name;
    void *slot;
    size_t size;
} entry_slots[] = {
    {"kda_forward", &entry.kda_forward, sizeof entry.kda_forward},
    {"ssm1_forward", &entry.ssm1_forward, sizeof entry.ssm1_forward},
    {"conv1d_forward", &entry.conv1d_forward, sizeof entry.conv1d_forward},
    {"kda_gate_forward", &entry.kda_gate_forward, sizeof entry.kda_gate_forward},
    {"kda_backward", &entry.kda_backward, sizeof entry.kda_backward},
    {"ssm1_backward", &entry.ssm1_backward, sizeof entry.ssm1_backward},
    {"conv1d_backward", &entry.conv1d_backward, sizeof entry.conv1d_backward},
    {"kda_gate_backward", &entry.kda_gate_backward, sizeof entry.kda_gate_backward},
    {"kda_decode", &entry.kda_decode, sizeof entry.kda_decode},
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

/* ------------------------------------------------------------------------------------ */
/* One call: the frame, the problem and exec it describes, and what it allocated         */
/* ------------------------------------------------------------------------------------ */

enum bind_kind {
    BIND_F32_POINTER = 0, /* a float32 array: its pointer goes to the field */
    BIND_F32_VALUE = 1,   /* a float32 scalar: its value goes to the field (scale ...) */
    BIND_I64_POINTER = 2, /* integer offsets: as int64, their pointer goes to the field */
    BIND_ENTRY_ARG = 3    /* not in the problem: the entry point's own argument, in order */
};

#define LX_MAX_ENTRY_ARGS 2
#define LX_MAX_OWNED 4

typedef struct call {
    XLA_FFI_CallFrame *frame;
    const char *name; /* the entry point, for messages */
    union {
        linseq_kda_problem kda;
        linseq_kda_gate_problem gate;
        linseq_ssm1_problem ssm1;
        linseq_conv1d_problem conv;
    } problem;
    size_t problem_size;
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
    snprintf(message, sizeof message, "%s: %s", c->name, what);
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

static const XLA_FFI_Array *array_attr(const call *c, const char *name)
{
    const XLA_FFI_Attrs *attrs = &c->frame->attrs;
    size_t len = strlen(name);
    for (int64_t i = 0; i < attrs->size; i++) {
        const XLA_FFI_ByteSpan *key = attrs->names[i];
        if (key->len == len && memcmp(key->ptr, name, len) == 0) {
            const XLA_FFI_Array *arr = attrs->attrs[i];
            return attrs->types[i] == XLA_FFI_AttrType_ARRAY && arr->dtype == XLA_FFI_DataType_S64
                       ? arr
                       : NULL;
        }
    }
    return NULL;
}

static int64_t element_count(const XLA_FFI_Buffer *buf)
{
    int64_t n = 1;
    for (int64_t i = 0; i < buf->rank; i++) n *= buf->dims[i];
    return n;
}

/* Copies the struct of `size` bytes the attribute holds (int64 words) into `out`. */
static bool read_struct(const call *c, const char *name, void *out, size_t size)
{
    const XLA_FFI_Array *arr = array_attr(c, name);
    if (arr == NULL || arr->size != (size + 7) / 8) return false;
    memcpy(out, arr->data, size);
    return true;
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
    int64_t *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    if (out == NULL) return NULL;
    c->owned[c->n_owned++] = out;
    if (buf->dtype == XLA_FFI_DataType_S64) {
        memcpy(out, buf->data, (size_t)n * sizeof *out);
    } else if (buf->dtype == XLA_FFI_DataType_S32) {
        const int32_t *in = buf->data;
        for (int64_t i = 0; i < n; i++) out[i] = in[i];
    } else {
        return NULL;
    }
    return out;
}

static bool fits(const call *c, int64_t offset, size_t size, size_t align)
{
    return offset >= 0 && (uint64_t)offset % align == 0 &&
           (uint64_t)offset + size <= c->problem_size;
}

/* One operand into the problem (or the entry point's arguments); false when the description
 * does not fit linseq.h or the buffer's type. */
static bool bind_operand(call *c, XLA_FFI_Buffer *buf, int64_t kind, int64_t offset)
{
    char *problem = (char *)&c->problem;
    if (kind == BIND_ENTRY_ARG) {
        if (c->n_entry_args == LX_MAX_ENTRY_ARGS) return false;
        c->entry_args[c->n_entry_args++] = buf;
        return true;
    }
    if (kind == BIND_F32_VALUE) {
        if (!fits(c, offset, sizeof(float), alignof(float)) || buf->dtype != XLA_FFI_DataType_F32 ||
            element_count(buf) != 1)
            return false;
        memcpy(problem + offset, buf->data, sizeof(float));
        return true;
    }
    const void *pointer = buf->data;
    if (kind == BIND_I64_POINTER)
        pointer = as_int64(c, buf);
    else if (kind != BIND_F32_POINTER || buf->dtype != XLA_FFI_DataType_F32)
        return false;
    if (pointer == NULL || !fits(c, offset, sizeof(void *), alignof(void *))) return false;
    memcpy(problem + offset, &pointer, sizeof pointer);
    return true;
}

/* Reads the call's description and binds its operands; NULL or the XLA error to return. */
static XLA_FFI_Error *start(call *c, XLA_FFI_CallFrame *frame, const char *name,
                            size_t problem_size, bool bound)
{
    memset(c, 0, sizeof *c);
    c->frame = frame;
    c->name = name;
    c->problem_size = problem_size;
    if (!bound)
        return error(c, XLA_FFI_Error_Code_FAILED_PRECONDITION,
                     "the linseq entry points were not bound (load through linseq.jax)");
    if (frame->struct_size < XLA_FFI_CallFrame_STRUCT_SIZE)
        return error(c, XLA_FFI_Error_Code_FAILED_PRECONDITION, "an older XLA call frame");
    const XLA_FFI_Array *fields = array_attr(c, "fields"), *kinds = array_attr(c, "kinds");
    if (!read_struct(c, "problem", &c->problem, problem_size) ||
        !read_struct(c, "exec", &c->exec, sizeof c->exec) || fields == NULL || kinds == NULL ||
        fields->size != (size_t)frame->args.size || kinds->size != fields->size)
        return error(c, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                     "the call's description does not match linseq.h (problem, exec, fields, "
                     "kinds)");
    const int64_t *offset = fields->data, *kind = kinds->data;
    for (int64_t i = 0; i < frame->args.size; i++) {
        if (frame->args.types[i] != XLA_FFI_ArgType_BUFFER ||
            !bind_operand(c, frame->args.args[i], kind[i], offset[i])) {
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

static const float *entry_arg(const call *c, int i)
{
    return i < c->n_entry_args ? c->entry_args[i]->data : NULL;
}

/* Points the grads struct (`size` bytes, zeroed) at the results, each at the offset the
 * attribute "grads" gives it. */
static bool bind_grads(call *c, void *grads, size_t size)
{
    const XLA_FFI_Array *offsets = array_attr(c, "grads");
    if (offsets == NULL || offsets->size != (size_t)c->frame->rets.size) return false;
    memset(grads, 0, size);
    for (int64_t i = 0; i < c->frame->rets.size; i++) {
        int64_t at = ((const int64_t *)offsets->data)[i];
        float *pointer = result(c, i);
        if (at < 0 || at % (int64_t)alignof(float *) || (uint64_t)at + sizeof pointer > size)
            return false;
        memcpy((char *)grads + at, &pointer, sizeof pointer);
    }
    return true;
}

/* ------------------------------------------------------------------------------------ */
/* The handlers                                                                          */
/* ------------------------------------------------------------------------------------ */

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

/* Each runs the entry point over a started call; a description that does not fit sets
 * c->mismatch and returns without calling the library. */
typedef linseq_status (*runner)(call *c);

#define LX_ANY (-1) /* a backward's results: the gradients of the inputs given */

/* n_results: exactly that many, or LX_ANY; n_entry_args: at least that many (the decode's
 * rows are optional), and the runner reads only those it expects. */
static XLA_FFI_Error *handle(XLA_FFI_CallFrame *frame, const char *name, size_t problem_size,
                             bool bound, int64_t n_results, int n_entry_args, runner run)
{
    if (answered_metadata(frame)) return NULL;
    call c;
    XLA_FFI_Error *err = start(&c, frame, name, problem_size, bound);
    if (err != NULL) return err;
    if ((n_results != LX_ANY && frame->rets.size != n_results) || c.n_entry_args < n_entry_args)
        c.mismatch = "the number of operands or results does not match the entry point";
    if (c.mismatch != NULL) return finish(&c, LINSEQ_OK);
    fp_mode saved = default_fp_mode();
    linseq_status status = run(&c);
    restore_fp_mode(saved);
    return finish(&c, status);
}

static linseq_status kda_forward(call *c)
{
    return entry.kda_forward(&c->problem.kda, &c->exec, result(c, 0), result(c, 1));
}
static linseq_status ssm1_forward(call *c)
{
    return entry.ssm1_forward(&c->problem.ssm1, &c->exec, result(c, 0), result(c, 1));
}
static linseq_status conv1d_forward(call *c)
{
    return entry.conv1d_forward(&c->problem.conv, &c->exec, result(c, 0), result(c, 1));
}
static linseq_status kda_gate_forward(call *c)
{
    return entry.kda_gate_forward(&c->problem.gate, &c->exec, result(c, 0));
}

/* The backward entries: operands (inputs..., upstream gradients), results the gradients. */
#define LX_GRADS_MISMATCH "the gradients' description does not match linseq.h"

static linseq_status kda_backward(call *c)
{
    linseq_kda_grads grads;
    if (!bind_grads(c, &grads, sizeof grads)) return c->mismatch = LX_GRADS_MISMATCH, LINSEQ_OK;
    return entry.kda_backward(&c->problem.kda, &c->exec, entry_arg(c, 0), entry_arg(c, 1), &grads);
}
static linseq_status ssm1_backward(call *c)
{
    linseq_ssm1_grads grads;
    if (!bind_grads(c, &grads, sizeof grads)) return c->mismatch = LX_GRADS_MISMATCH, LINSEQ_OK;
    return entry.ssm1_backward(&c->problem.ssm1, &c->exec, entry_arg(c, 0), entry_arg(c, 1),
                               &grads);
}
static linseq_status conv1d_backward(call *c)
{
    linseq_conv1d_grads grads;
    if (!bind_grads(c, &grads, sizeof grads)) return c->mismatch = LX_GRADS_MISMATCH, LINSEQ_OK;
    return entry.conv1d_backward(&c->problem.conv, &c->exec, entry_arg(c, 0), entry_arg(c, 1),
                                 &grads);
}
static linseq_status kda_gate_backward(call *c)
{
    linseq_kda_gate_grads grads;
    if (!bind_grads(c, &grads, sizeof grads)) return c->mismatch = LX_GRADS_MISMATCH, LINSEQ_OK;
    return entry.kda_gate_backward(&c->problem.gate, &c->exec, entry_arg(c, 0), &grads);
}

/* decode: operands (inputs..., pool[, rows]); results (o, the new pool). The new pool is
 * the old one's buffer when XLA aliases them (input_output_aliases), else a copy of it,
 * updated where it lies. */
static linseq_status kda_decode(call *c)
{
    const XLA_FFI_Buffer *pool = c->entry_args[0];
    const int64_t *rows = NULL;
    if (pool->dtype != XLA_FFI_DataType_F32 || pool->rank < 1 ||
        (c->n_entry_args == 2 && (rows = as_int64(c, c->entry_args[1])) == NULL)) {
        c->mismatch = "expected a float32 pool and integer rows";
        return LINSEQ_OK;
    }
    float *new_pool = result(c, 1);
    if (new_pool != pool->data)
        memcpy(new_pool, pool->data, (size_t)element_count(pool) * sizeof(float));
    return entry.kda_decode(&c->problem.kda, &c->exec, new_pool, pool->dims[0], rows, result(c, 0));
}

/* linseq_xla_OP: the handler XLA calls for the custom call target linseq_OP. */
#define LX_HANDLER(op, problem_type, n_results, n_entry_args)                                      \
    LX_API XLA_FFI_Error *linseq_xla_##op(XLA_FFI_CallFrame *frame);                               \
    XLA_FFI_Error *linseq_xla_##op(XLA_FFI_CallFrame *frame)                                       \
    {                                                                                              \
        return handle(frame, "linseq_" #op, sizeof(problem_type), entry.op != NULL, n_results,     \
                      n_entry_args, op);                                                           \
    }

LX_HANDLER(kda_forward, linseq_kda_problem, 2, 0)
LX_HANDLER(ssm1_forward, linseq_ssm1_problem, 2, 0)
LX_HANDLER(conv1d_forward, linseq_conv1d_problem, 2, 0)
LX_HANDLER(kda_gate_forward, linseq_kda_gate_problem, 1, 0)
/* The backward's results are the gradients of the inputs given: any number. */
LX_HANDLER(kda_backward, linseq_kda_problem, LX_ANY, 2)
LX_HANDLER(ssm1_backward, linseq_ssm1_problem, LX_ANY, 2)
LX_HANDLER(conv1d_backward, linseq_conv1d_problem, LX_ANY, 2)
LX_HANDLER(kda_gate_backward, linseq_kda_gate_problem, LX_ANY, 1)
LX_HANDLER(kda_decode, linseq_kda_problem, 2, 1) /* the pool, and optional rows */
