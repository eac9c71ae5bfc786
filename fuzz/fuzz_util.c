/* Decision stream, buffers and the per-call contract checks shared by the fuzz targets. */
#include "fuzz_util.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* scripts/fuzz.sh compiles the targets with -Iinclude only: the op table by its path. */
#include "optable/optable.h"

/* ---------------------------------------------------------------------------------- */
/* Decisions                                                                          */
/* ---------------------------------------------------------------------------------- */

void fz_init(fz_in *in, const uint8_t *data, size_t size)
{
    in->p = data;
    in->n = size;
    in->weird = false;
    /* FNV-1a of the whole input: the data generator differs for every input. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 0x100000001b3ull;
    in->rng = h | 1;
}

uint8_t fz_u8(fz_in *in)
{
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

uint32_t fz_u32(fz_in *in)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)fz_u8(in) << (8 * i);
    return v;
}

bool fz_bit(fz_in *in) { return fz_u8(in) & 1; }

unsigned fz_pick(fz_in *in, unsigned n) { return n ? fz_u8(in) % n : 0; }

int64_t fz_size(fz_in *in, int64_t cap)
{
    /* Rare enough that most inputs describe a problem that runs. */
    static const int64_t special[] = {0,
                                      -1,
                                      INT64_MIN,
                                      INT64_MAX,
                                      (int64_t)1 << 62,
                                      -((int64_t)1 << 40),
                                      (int64_t)1 << 61,
                                      (int64_t)1 << 32 | 1,
                                      INT64_MAX / 2,
                                      0,
                                      2,
                                      3};
    const uint8_t b = fz_u8(in);
    if (b < 256 - sizeof special / sizeof special[0]) return 1 + b % cap;
    return special[b - (256 - sizeof special / sizeof special[0])];
}

bool fz_is_huge(int64_t v) { return v >= ((int64_t)1 << 31); }

static uint64_t next_rng(fz_in *in)
{
    /* xorshift64* */
    uint64_t x = in->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    in->rng = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* [0, 1] from the next input byte, or from the generator once the bytes are used up. */
static float next_unit(fz_in *in, unsigned *raw)
{
    if (in->n) {
        *raw = fz_u8(in);
        return (float)*raw / 255.0f;
    }
    uint64_t r = next_rng(in);
    *raw = (unsigned)(r >> 56);
    return (float)((r >> 40) & 0xffffff) / (float)0xffffff;
}

void fz_fill(fz_in *in, float *x, size_t n, fz_range r, bool *nice)
{
    static const float odd[] = {NAN,   INFINITY, -INFINITY, 1e30f, -1e30f, 1e-40f,
                                -0.0f, FLT_MAX,  -FLT_MAX,  0.0f,  1e-30f, -3e38f};
    for (size_t i = 0; i < n; i++) {
        unsigned raw;
        const float u = next_unit(in, &raw);
        /* one value in 16 is odd in a weird input */
        if (in->weird && (raw & 15) == 7) {
            x[i] = odd[(raw >> 4) % (sizeof odd / sizeof odd[0])];
            if (!isfinite(x[i]) || fabsf(x[i]) > 8.0f) *nice = false;
            continue;
        }
        switch (r) {
        case FZ_SIGNED: x[i] = -4.0f + 8.0f * u; break;
        case FZ_NONPOS: x[i] = -8.0f * u; break;
        case FZ_UNIT: x[i] = u; break;
        case FZ_NONNEG: x[i] = 4.0f * u; break;
        case FZ_SMALL: x[i] = -1.0f + 2.0f * u; break;
        }
    }
}

bool fz_count(int64_t *out, int n, ...)
{
    va_list ap;
    va_start(ap, n);
    int64_t acc = 1;
    bool ok = true;
    for (int i = 0; i < n; i++) {
        const int64_t v = va_arg(ap, int64_t);
        if (v < 0 || __builtin_mul_overflow(acc, v, &acc)) ok = false;
    }
    va_end(ap);
    *out = ok ? acc : -1;
    return ok;
}

/* ---------------------------------------------------------------------------------- */
/* Buffers                                                                            */
/* ---------------------------------------------------------------------------------- */

static void **allocs;
static size_t n_allocs, cap_allocs;

void *fz_alloc_bytes(size_t n)
{
    /* malloc(0) under AddressSanitizer is a unique pointer to no usable byte. */
    void *p = malloc(n);
    if (!p) p = malloc(1);
    if (!p) fz_die("out of memory allocating %zu bytes", n);
    if (n_allocs == cap_allocs) {
        cap_allocs = cap_allocs ? 2 * cap_allocs : 64;
        allocs = realloc(allocs, cap_allocs * sizeof *allocs);
        if (!allocs) fz_die("out of memory");
    }
    allocs[n_allocs++] = p;
    return p;
}

float *fz_alloc(size_t n) { return fz_alloc_bytes(n * sizeof(float)); }

float *fz_dup(const float *x, size_t n)
{
    float *d = fz_alloc(n);
    if (n) memcpy(d, x, n * sizeof(float));
    return d;
}

void fz_free_all(void)
{
    for (size_t i = 0; i < n_allocs; i++) free(allocs[i]);
    n_allocs = 0;
}

/* ---------------------------------------------------------------------------------- */
/* One call                                                                            */
/* ---------------------------------------------------------------------------------- */

enum { ROLE_IN, ROLE_OUT, ROLE_INOUT, ROLE_OUT_RAW };

typedef struct {
    void *p;
    size_t bytes;
    int role;
    unsigned char *snap;
} fz_arg;

#define FZ_MAX_CALL_ARGS 48
static fz_arg args[FZ_MAX_CALL_ARGS];
static int n_args;
static const char *call_what = "";

void fz_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FUZZ CHECK FAILED in %s: ", call_what);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(last error: \"%s\")\n", linseq_last_error());
    abort();
}

static int writes_ok_status = -1; /* fz_call_may_write_on_failure's status, or -1 */

void fz_call_begin(const char *what)
{
    for (int i = 0; i < n_args; i++) free(args[i].snap);
    n_args = 0;
    call_what = what;
    writes_ok_status = -1;
}

void fz_call_may_write_on_failure(linseq_status st) { writes_ok_status = (int)st; }

static void snapshot(fz_arg *a)
{
    free(a->snap);
    a->snap = malloc(a->bytes ? a->bytes : 1);
    if (!a->snap) fz_die("harness: out of memory");
    memcpy(a->snap, a->p, a->bytes);
}

/* The snapshot is taken now: every argument is registered right before its call. */
static void add_arg(const void *p, size_t bytes, int role)
{
    if (!p) return;
    for (int i = 0; i < n_args; i++)
        if (args[i].p == p) {
            /* the same buffer as an input and an output: an in-place argument */
            if (role != ROLE_IN) args[i].role = role;
            if (bytes > args[i].bytes) args[i].bytes = bytes;
            snapshot(&args[i]);
            return;
        }
    if (n_args == FZ_MAX_CALL_ARGS) fz_die("harness: too many arguments");
    args[n_args] = (fz_arg){.p = (void *)p, .bytes = bytes, .role = role};
    snapshot(&args[n_args++]);
}

void fz_arg_in(const void *p, size_t bytes) { add_arg(p, bytes, ROLE_IN); }

void fz_arg_out(void *p, size_t bytes)
{
    if (p) memset(p, 0xff, bytes);
    add_arg(p, bytes, ROLE_OUT);
}

void fz_arg_inout(void *p, size_t bytes) { add_arg(p, bytes, ROLE_INOUT); }

void fz_arg_out_raw(void *p, size_t bytes)
{
    if (p) memset(p, 0xff, bytes);
    add_arg(p, bytes, ROLE_OUT_RAW);
}

linseq_status fz_call_end(linseq_status st, bool nice, bool must_fail)
{
    /* FUZZ_TRACE=1: one line per call, to see what a seed or a crash input decodes to */
    static int trace = -1;
    if (trace < 0) trace = getenv("FUZZ_TRACE") != NULL;
    if (trace)
        fprintf(stderr, "%s: status %d%s%s %s\n", call_what, (int)st, nice ? " nice" : "",
                must_fail ? " must_fail" : "", linseq_last_error());
    if ((unsigned)st > (unsigned)LINSEQ_ERR_OUT_OF_MEMORY) fz_die("unknown status %d", (int)st);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY) fz_die("out of memory on a small problem");
    if (must_fail && st == LINSEQ_OK)
        fz_die("arguments that break a documented rule were accepted");
    const char *msg = linseq_last_error();
    if (st != LINSEQ_OK && !*msg) fz_die("status %d without a message", (int)st);
    if (st == LINSEQ_OK && *msg) fz_die("success left the message \"%s\"", msg);
    for (int i = 0; i < n_args; i++) {
        const fz_arg *a = &args[i];
        const bool same = memcmp(a->p, a->snap, a->bytes) == 0;
        if (a->role == ROLE_IN && !same) fz_die("input %d (%zu bytes) was modified", i, a->bytes);
        if (st != LINSEQ_OK && a->role != ROLE_IN && !same && (int)st != writes_ok_status)
            fz_die("a failed call (status %d) wrote output %d", (int)st, i);
        if (st == LINSEQ_OK && nice && (a->role == ROLE_OUT || a->role == ROLE_INOUT)) {
            const float *f = a->p;
            for (size_t k = 0; k < a->bytes / sizeof(float); k++)
                if (!isfinite(f[k]))
                    fz_die("output %d holds %g at %zu of %zu after a successful call on "
                           "finite inputs",
                           i, (double)f[k], k, a->bytes / sizeof(float));
        }
    }
    return st;
}

bool fz_same(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i])) continue;
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
    }
    return true;
}

void fz_expect_same(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i])) continue;
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fz_die("%s differ at %zu of %zu: %.9g vs %.9g", what, i, n, (double)a[i], (double)b[i]);
    }
}

/* ---------------------------------------------------------------------------------- */
/* Shared argument decoders                                                           */
/* ---------------------------------------------------------------------------------- */

static int cmp_i64(const void *x, const void *y)
{
    const int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

bool fz_cu_seqlens(fz_in *in, int64_t *cu, int64_t n, int64_t T, unsigned corrupt)
{
    cu[0] = 0;
    cu[n] = T;
    for (int64_t i = 1; i < n; i++) cu[i] = (int64_t)(fz_u32(in) % (uint64_t)(T + 1));
    qsort(cu + 1, (size_t)(n - 1), sizeof *cu, cmp_i64);
    const int64_t at = 1 + (int64_t)(fz_u8(in) % (unsigned)n); /* 1 .. n */
    switch (corrupt) {
    case 0: return false;
    case 1: cu[0] = fz_bit(in) ? 1 : -1; break;
    case 2: cu[n] = T + 1; break;
    case 3: cu[at] = cu[at - 1] - 1; break; /* decreasing */
    case 4: cu[at] = INT64_MIN; break;
    default:
        cu[at - 1] = INT64_MAX;
        if (at - 1 == 0) cu[0] = 1;
        break;
    }
    return true;
}

const linseq_exec *fz_exec(fz_in *in, linseq_exec *ex, bool *bad)
{
    static const int chunks[] = {0, 16, 32, 64, 128, 16, 32, 0, 8, 100, -16, 256};
    static const int threads[] = {0, 1, 2, 0, 1, 2, 3, -1};
    const unsigned m = fz_pick(in, 17), c = fz_pick(in, 12), t = fz_pick(in, 8);
    if (m == 16) return NULL;
    memset(ex, 0, sizeof *ex);
    ex->mode = m < 15 ? (linseq_mode)(m % 3) : (linseq_mode)(m == 15 ? 3 : -1);
    ex->chunk_size = chunks[c];
    ex->threads = threads[t];
    if (m >= 15 || c >= 8 || t == 7) *bad = true;
    return ex;
}

int64_t fz_tensor_count(const char *op_name, const char *name, const void *p)
{
    const ls_op *op = ls_op_find(op_name);
    if (!op) fz_die("no op '%s' in the op table", op_name);
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        if (t->role == LS_ROLE_GRAD || strcmp(t->name, name) != 0) continue;
        int64_t n;
        return ls_tensor_count(t, p, &n) ? n : -1;
    }
    fz_die("no tensor '%s' in the op table's %s", name, op_name);
}
