/* Argument validation shared by every entry point: names the argument at fault. */
#include "core/validate.h"

#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"

ls_tensor *ls_arg(ls_args *a, const char *name, const char *dims, const void *ptr, bool required,
                  ls_role role, size_t elem_size, int ndim, ...)
{
    /* The table size is a compile-time property of each entry point: overflowing it is a
     * programming error, which ls_args_validate reports on every call (so any test finds it)
     * instead of checking fewer arguments. */
    static _Thread_local ls_tensor spill;
    ls_tensor *t = a->n < LS_MAX_ARGS ? &a->t[a->n++] : &spill;
    if (t == &spill) a->overflow = true;
    memset(t, 0, sizeof *t);
    t->name = name;
    t->dims = dims;
    t->ptr = ptr;
    t->required = required;
    t->role = role;
    t->elem_size = elem_size;
    t->align = elem_size;
    t->ndim = ndim;
    va_list ap;
    va_start(ap, ndim);
    for (int i = 0; i < ndim && i < LS_MAX_DIMS; i++) t->shape[i] = va_arg(ap, int64_t);
    va_end(ap);
    return t;
}

void ls_shape_text(const ls_tensor *t, char *buf, size_t n)
{
    /* the op table writes dims with their brackets ("[B,T,D]"), an entry point's own rows
     * without ("B,T,D") */
    int w = snprintf(buf, n, t->dims[0] == '[' ? "%s = [" : "[%s] = [", t->dims);
    for (int i = 0; i < t->ndim && w > 0 && (size_t)w < n; i++)
        w += snprintf(buf + w, n - (size_t)w, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    if (w > 0 && (size_t)w < n) snprintf(buf + w, n - (size_t)w, "]");
}

bool ls_mul_ok(int64_t *out, int n, ...)
{
    va_list ap;
    va_start(ap, n);
    int64_t acc = 1;
    bool ok = true;
    for (int i = 0; i < n; i++) {
        int64_t v = va_arg(ap, int64_t);
        if (v < 0 || __builtin_mul_overflow(acc, v, &acc) || acc > (int64_t)PTRDIFF_MAX) ok = false;
    }
    va_end(ap);
    *out = ok ? acc : 0;
    return ok;
}

int64_t ls_mul_sat(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static bool tensor_bytes(ls_tensor *t)
{
    int64_t acc = (int64_t)t->elem_size;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || __builtin_mul_overflow(acc, t->shape[i], &acc) ||
            acc > (int64_t)PTRDIFF_MAX)
            return false;
    }
    t->bytes = (size_t)acc;
    return true;
}

static bool overlap(const ls_tensor *x, const ls_tensor *y)
{
    if (!x->ptr || !y->ptr || !x->bytes || !y->bytes) return false;
    uintptr_t a0 = (uintptr_t)x->ptr, a1 = a0 + x->bytes;
    uintptr_t b0 = (uintptr_t)y->ptr, b1 = b0 + y->bytes;
    return a0 < b1 && b0 < a1;
}

/* acc += (n - 1) * stride, false on overflow past PTRDIFF_MAX elements. */
static bool add_reach(int64_t *acc, int64_t n, int64_t stride)
{
    int64_t step;
    if (__builtin_mul_overflow(n - 1, stride, &step) || __builtin_add_overflow(*acc, step, acc))
        return false;
    return *acc <= (int64_t)PTRDIFF_MAX;
}

linseq_status ls_arg_strided(ls_args *a, const char *name, const char *strides_name,
                             const void *ptr, bool required, linseq_strides s, size_t elem,
                             int n_axes, const int64_t *sizes)
{
    if (s.batch < 0 || s.token < 0 || s.channel < 0 || s.state < 0)
        return ls_fail(a->fn, LINSEQ_ERR_INVALID_VALUE,
                       "%s = {batch %lld, token %lld, channel %lld, state %lld}; expected "
                       "strides >= 0 (in elements; 0 repeats the same elements)",
                       strides_name, (long long)s.batch, (long long)s.token, (long long)s.channel,
                       (long long)s.state);
    if (n_axes < 4 && s.state)
        return ls_fail(a->fn, LINSEQ_ERR_INVALID_VALUE,
                       "%s.state = %lld; expected 0 ('%s' has no state axis)", strides_name,
                       (long long)s.state, name);
    /* The last element any index reaches, plus one: the span the caller's memory must hold. */
    const int64_t stride[4] = {s.batch, s.token, s.channel, s.state};
    int64_t span = 1;
    bool ok = true;
    for (int i = 0; i < n_axes && ok; i++) ok = add_reach(&span, sizes[i], stride[i]);
    if (!ok || span > (int64_t)(PTRDIFF_MAX / (int64_t)elem))
        return ls_fail(a->fn, LINSEQ_ERR_SIZE_OVERFLOW,
                       "%s = {batch %lld, token %lld, channel %lld, state %lld} reach past "
                       "PTRDIFF_MAX bytes from '%s'; expected strides whose span (B-1)*batch + "
                       "(T-1)*token + ... fits in memory",
                       strides_name, (long long)s.batch, (long long)s.token, (long long)s.channel,
                       (long long)s.state, name);
    ls_arg(a, name, strides_name, ptr, required, LS_IN, elem, 1, span);
    return LINSEQ_OK;
}

void ls_arg_structs(ls_args *a, const void *problem, size_t problem_bytes, const void *grads,
                    size_t grads_bytes, const linseq_exec *exec)
{
    ls_arg(a, "problem struct", "bytes", problem, false, LS_IN, 1, 1, (int64_t)problem_bytes);
    if (grads) ls_arg(a, "grads struct", "bytes", grads, false, LS_IN, 1, 1, (int64_t)grads_bytes);
    if (exec) ls_arg(a, "exec struct", "bytes", exec, false, LS_IN, 1, 1, (int64_t)sizeof *exec);
}

/* The element type of a tensor by its size, for messages (a byte buffer holds floats). */
static const char *elem_name(const ls_tensor *t)
{
    return t->elem_size == 8 ? "int64" : t->elem_size == 2 ? "bfloat16" : "float32";
}

linseq_status ls_args_validate(ls_args *a)
{
    char shape[160];
    if (a->overflow)
        return ls_fail(a->fn, LINSEQ_ERR_UNSUPPORTED,
                       "internal error: more than %d tensor arguments", LS_MAX_ARGS);
    for (int i = 0; i < a->n; i++) {
        ls_tensor *t = &a->t[i];
        if (t->required && !t->ptr) {
            ls_shape_text(t, shape, sizeof shape);
            return ls_fail(a->fn, LINSEQ_ERR_NULL_POINTER,
                           "%s '%s' is NULL; expected a %s tensor %s",
                           t->role == LS_OUT ? "output" : "argument", t->name, elem_name(t), shape);
        }
    }
    /* A misaligned float pointer is undefined behaviour in every kernel (and void *saved
     * does not say what it needs), so it is an argument error rather than a crash later. */
    for (int i = 0; i < a->n; i++) {
        const ls_tensor *t = &a->t[i];
        if (t->ptr && t->align > 1 && (uintptr_t)t->ptr % t->align != 0)
            return ls_fail(a->fn, LINSEQ_ERR_INVALID_VALUE,
                           "'%s' = %p is not aligned to %zu bytes (the alignment of a %s)", t->name,
                           t->ptr, t->align, elem_name(t));
    }
    for (int i = 0; i < a->n; i++) {
        ls_tensor *t = &a->t[i];
        if (t->ptr && !tensor_bytes(t)) { /* an absent optional tensor has no size to check */
            ls_shape_text(t, shape, sizeof shape);
            return ls_fail(a->fn, LINSEQ_ERR_SIZE_OVERFLOW,
                           "'%s' %s has a byte size that does not fit in ptrdiff_t", t->name,
                           shape);
        }
    }
    for (int i = 0; i < a->n; i++) {
        const ls_tensor *o = &a->t[i];
        if (o->role != LS_OUT || !o->ptr) continue;
        for (int j = 0; j < a->n; j++) {
            const ls_tensor *x = &a->t[j];
            if (j == i || (x->role == LS_OUT && j < i) || !overlap(o, x)) continue;
            bool allowed = x->role == LS_IN && o->may_alias && o->may_alias == x->ptr &&
                           o->ptr == x->ptr && o->bytes == x->bytes;
            if (!allowed)
                return ls_fail(a->fn, LINSEQ_ERR_ALIASING, "output '%s' overlaps %s '%s'%s",
                               o->name, x->role == LS_OUT ? "output" : "input", x->name,
                               o->may_alias && x->ptr == o->may_alias
                                   ? " (it may only be exactly the same buffer)"
                                   : "");
        }
    }
    return LINSEQ_OK;
}

int64_t ls_longest_sequence(const int64_t *cu_seqlens, int64_t n_seqs, int64_t T)
{
    if (!cu_seqlens) return T;
    int64_t longest = 0;
    for (int64_t n = 0; n < n_seqs; n++)
        if (cu_seqlens[n + 1] - cu_seqlens[n] > longest)
            longest = cu_seqlens[n + 1] - cu_seqlens[n];
    return longest;
}

uint64_t ls_seqlens_fingerprint(const int64_t *cu_seqlens, int64_t n_seqs, int64_t B, int64_t T)
{
    const int64_t count = cu_seqlens ? n_seqs : B;
    uint64_t h = 0xcbf29ce484222325u ^ (uint64_t)count; /* FNV-1a over the lengths' bytes */
    for (int64_t n = 0; n < count; n++) {
        uint64_t len = (uint64_t)(cu_seqlens ? cu_seqlens[n + 1] - cu_seqlens[n] : T);
        for (int byte = 0; byte < 8; byte++, len >>= 8) h = (h ^ (len & 0xff)) * 0x100000001b3u;
    }
    return h;
}

linseq_status ls_check_min(const char *fn, const char *name, int64_t value, int64_t min)
{
    if (value < min)
        return ls_fail(fn, LINSEQ_ERR_INVALID_SIZE, "size %s = %lld; expected %s >= %lld", name,
                       (long long)value, name, (long long)min);
    return LINSEQ_OK;
}

linseq_status ls_check_cu_seqlens(const char *fn, const int64_t *cu, int64_t n_seqs, int64_t B,
                                  int64_t T)
{
    if (B != 1)
        return ls_fail(fn, LINSEQ_ERR_SHAPE_MISMATCH,
                       "cu_seqlens is given, so B must be 1 (sequences are packed along T); "
                       "got B = %lld",
                       (long long)B);
    if (n_seqs < 1)
        return ls_fail(fn, LINSEQ_ERR_INVALID_SIZE,
                       "n_seqs = %lld; expected n_seqs >= 1 (cu_seqlens has n_seqs + 1 entries)",
                       (long long)n_seqs);
    if (cu[0] != 0)
        return ls_fail(fn, LINSEQ_ERR_INVALID_CU_SEQLENS, "cu_seqlens[0] = %lld; expected 0",
                       (long long)cu[0]);
    for (int64_t i = 1; i <= n_seqs; i++) {
        if (cu[i] < cu[i - 1])
            return ls_fail(fn, LINSEQ_ERR_INVALID_CU_SEQLENS,
                           "cu_seqlens decreases at index %lld (%lld < %lld); expected "
                           "non-decreasing offsets",
                           (long long)i, (long long)cu[i], (long long)cu[i - 1]);
    }
    if (cu[n_seqs] != T)
        return ls_fail(fn, LINSEQ_ERR_INVALID_CU_SEQLENS,
                       "cu_seqlens[n_seqs = %lld] = %lld; expected T = %lld", (long long)n_seqs,
                       (long long)cu[n_seqs], (long long)T);
    return LINSEQ_OK;
}

/* Every op validates the whole exec: an unknown mode is an error even where it is unused. */
static linseq_status check_exec(const char *fn, const linseq_exec *ex, bool cpu_bf16)
{
    if (!ex) return LINSEQ_OK;
    if ((unsigned)ex->mode > (unsigned)LINSEQ_MODE_CHUNKED)
        return ls_fail(fn, LINSEQ_ERR_INVALID_ENUM,
                       "exec->mode = %d; expected LINSEQ_MODE_DEFAULT, _RECURRENT or _CHUNKED",
                       (int)ex->mode);
    if (ex->chunk_size != 0 && ex->chunk_size != 16 && ex->chunk_size != 32 &&
        ex->chunk_size != 64 && ex->chunk_size != 128)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "exec->chunk_size = %d; expected 16, 32, 64 or 128 (0 = 64)",
                       ex->chunk_size);
    if (ex->threads < 0)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "exec->threads = %d; expected >= 0 (0 = the global setting)", ex->threads);
    if ((unsigned)ex->device > (unsigned)LINSEQ_DEVICE_CUDA)
        return ls_fail(fn, LINSEQ_ERR_INVALID_ENUM,
                       "exec->device = %d; expected LINSEQ_DEVICE_CPU or LINSEQ_DEVICE_CUDA",
                       (int)ex->device);
    if ((unsigned)ex->dtype > (unsigned)LINSEQ_DTYPE_BF16)
        return ls_fail(fn, LINSEQ_ERR_INVALID_ENUM,
                       "exec->dtype = %d; expected LINSEQ_DTYPE_F32 or LINSEQ_DTYPE_BF16",
                       (int)ex->dtype);
    if ((unsigned)ex->products > (unsigned)LINSEQ_PRODUCTS_BF16)
        return ls_fail(fn, LINSEQ_ERR_INVALID_ENUM,
                       "exec->products = %d; expected LINSEQ_PRODUCTS_F32 or LINSEQ_PRODUCTS_BF16",
                       (int)ex->products);
#ifndef LINSEQ_WITH_CUDA
    if (ex->device == LINSEQ_DEVICE_CUDA)
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "exec->device = LINSEQ_DEVICE_CUDA, but this build of linseq has no CUDA "
                       "support (build it with make CUDA=1)");
#endif
    if (ex->device == LINSEQ_DEVICE_CUDA && ex->device_index < 0)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "exec->device_index = %d; expected a CUDA device ordinal >= 0",
                       ex->device_index);
    if (ex->dtype == LINSEQ_DTYPE_BF16 && ex->device != LINSEQ_DEVICE_CUDA && !cpu_bf16)
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "exec->dtype = LINSEQ_DTYPE_BF16, but on LINSEQ_DEVICE_CPU this call "
                       "takes float32 tensors (bf16 on the CPU: linseq_kda_forward, "
                       "linseq_kda_decode and linseq_conv1d_forward; every op on "
                       "LINSEQ_DEVICE_CUDA)");
    return LINSEQ_OK;
}

linseq_status ls_check_exec(const char *fn, const linseq_exec *ex)
{
    return check_exec(fn, ex, false);
}

linseq_status ls_check_exec_bf16(const char *fn, const linseq_exec *ex)
{
    return check_exec(fn, ex, true);
}

static int compare_i64(const void *x, const void *y)
{
    const int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

linseq_status ls_check_state_rows(const char *fn, const int64_t *rows, int64_t B,
                                  int64_t n_state_rows)
{
    for (int64_t b = 0; b < B; b++)
        if (rows[b] >= n_state_rows)
            return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                           "state_rows[%lld] = %lld; expected < n_state_rows = %lld "
                           "(negative = padding request)",
                           (long long)b, (long long)rows[b], (long long)n_state_rows);
    int64_t *sorted = malloc((size_t)B * sizeof *sorted);
    if (!sorted) return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "cannot check state_rows");
    memcpy(sorted, rows, (size_t)B * sizeof *sorted);
    qsort(sorted, (size_t)B, sizeof *sorted, compare_i64);
    linseq_status st = LINSEQ_OK;
    for (int64_t b = 1; b < B && !st; b++)
        if (sorted[b] >= 0 && sorted[b] == sorted[b - 1])
            st = ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                         "state_rows names row %lld twice; each request needs its own row",
                         (long long)sorted[b]);
    free(sorted);
    return st;
}
