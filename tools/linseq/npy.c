/* .npy reader and writer: a strict parser of the header dict and exact data-length checks,
 * so that a damaged or foreign file is rejected with a reason instead of being misread. */
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* numpy refuses headers above 10000 bytes by default; a little more slack costs nothing and
 * still stops a hostile length field from driving a huge allocation. */
#define NPY_MAX_HEADER 65536
#define NPY_ALIGN 64

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

__attribute__((format(printf, 3, 4))) static bool fail(char *err, size_t err_size, const char *fmt,
                                                       ...)
{
    if (err && err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return false;
}

const char *npy_dtype_name(npy_dtype dtype) { return dtype == NPY_I64 ? "int64" : "float32"; }

static size_t dtype_size(npy_dtype dtype) { return dtype == NPY_I64 ? 8 : 4; }

bool npy_shape_count(int ndim, const int64_t *shape, size_t *count)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (uint64_t)shape[i] > SIZE_MAX) return false;
        if (__builtin_mul_overflow(n, (size_t)shape[i], &n)) return false;
    }
    *count = n;
    return true;
}

void npy_shape_text(int ndim, const int64_t *shape, char *buf, size_t n)
{
    size_t used = 0;
    if (!n) return;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && used < n; i++)
        used +=
            (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
}

/* The data is stored little-endian; only a big-endian host has anything to do. */
static void swap_to_host(void *data, size_t count, size_t elem)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    unsigned char *p = data;
    for (size_t i = 0; i < count; i++, p += elem)
        for (size_t a = 0, b = elem - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
#else
    (void)data;
    (void)count;
    (void)elem;
#endif
}

/* ---------------------------------------------------------------------------------- */
/* Header dict: "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"         */
/* ---------------------------------------------------------------------------------- */

static void skip_ws(const char **p)
{
    while (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r') (*p)++;
}

static bool parse_string(const char **p, char *out, size_t n)
{
    char quote = **p;
    if (quote != '\'' && quote != '"') return false;
    const char *s = *p + 1;
    size_t len = 0;
    for (; *s && *s != quote; s++) {
        /* Escapes never occur in a valid descr or key; refusing them keeps this simple. */
        if (*s == '\\' || *s == '\n' || len + 1 >= n) return false;
        out[len++] = *s;
    }
    if (*s != quote) return false;
    out[len] = '\0';
    *p = s + 1;
    return true;
}

static bool parse_bool(const char **p, bool *out)
{
    if (strncmp(*p, "True", 4) == 0) {
        *out = true;
        *p += 4;
    } else if (strncmp(*p, "False", 5) == 0) {
        *out = false;
        *p += 5;
    } else {
        return false;
    }
    /* "Truex" is a different identifier, not True followed by junk we could ignore. */
    char c = **p;
    return !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '_');
}

static bool parse_dim(const char **p, int64_t *out)
{
    const char *s = *p;
    int64_t v = 0;
    if (*s < '0' || *s > '9') return false;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (__builtin_mul_overflow(v, (int64_t)10, &v) ||
            __builtin_add_overflow(v, (int64_t)(*s - '0'), &v))
            return false;
    }
    *p = s;
    *out = v;
    return true;
}

/* A Python tuple of non-negative ints; a single element needs its trailing comma, since
 * "(3)" is the int 3 and numpy rejects it. */
static bool parse_shape(const char **p, int *ndim, int64_t *shape, char *why, size_t why_n)
{
    const char *s = *p;
    int n = 0;
    bool comma_after_last = false;
    if (*s != '(') return fail(why, why_n, "shape is not a tuple");
    s++;
    skip_ws(&s);
    while (*s != ')') {
        if (n == NPY_MAX_DIMS)
            return fail(why, why_n, "shape has more than %d dimensions", NPY_MAX_DIMS);
        if (*s == '-') return fail(why, why_n, "shape has a negative dimension");
        if (!parse_dim(&s, &shape[n]))
            return fail(why, why_n, "shape entry is not an integer within int64");
        n++;
        skip_ws(&s);
        comma_after_last = false;
        if (*s == ',') {
            s++;
            skip_ws(&s);
            comma_after_last = true;
        } else if (*s != ')') {
            return fail(why, why_n, "shape tuple is malformed");
        }
    }
    if (n == 1 && !comma_after_last) return fail(why, why_n, "shape \"(N)\" is not a tuple");
    *p = s + 1;
    *ndim = n;
    return true;
}

typedef struct header_info {
    char descr[32];
    bool fortran_order;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
} header_info;

static bool parse_header(const char *text, header_info *h, char *why, size_t why_n)
{
    bool have_descr = false, have_fortran = false, have_shape = false;
    const char *p = text;
    skip_ws(&p);
    if (*p != '{') return fail(why, why_n, "header is not a dict");
    p++;
    for (;;) {
        char key[32];
        skip_ws(&p);
        if (*p == '}') break;
        if (!parse_string(&p, key, sizeof key)) return fail(why, why_n, "expected a quoted key");
        skip_ws(&p);
        if (*p != ':') return fail(why, why_n, "expected ':' after key '%s'", key);
        p++;
        skip_ws(&p);
        bool *seen;
        if (strcmp(key, "descr") == 0) {
            seen = &have_descr;
            if (!parse_string(&p, h->descr, sizeof h->descr))
                return fail(why, why_n, "descr is not a short string");
        } else if (strcmp(key, "fortran_order") == 0) {
            seen = &have_fortran;
            if (!parse_bool(&p, &h->fortran_order))
                return fail(why, why_n, "fortran_order is not True or False");
        } else if (strcmp(key, "shape") == 0) {
            seen = &have_shape;
            if (!parse_shape(&p, &h->ndim, h->shape, why, why_n)) return false;
        } else {
            return fail(why, why_n, "unexpected key '%s'", key);
        }
        if (*seen) return fail(why, why_n, "key '%s' appears twice", key);
        *seen = true;
        skip_ws(&p);
        if (*p == ',') {
            p++;
        } else if (*p != '}') {
            return fail(why, why_n, "expected ',' or '}' after key '%s'", key);
        }
    }
    p++;
    skip_ws(&p);
    if (*p) return fail(why, why_n, "text after the closing '}'");
    if (!have_descr) return fail(why, why_n, "key 'descr' is missing");
    if (!have_fortran) return fail(why, why_n, "key 'fortran_order' is missing");
    if (!have_shape) return fail(why, why_n, "key 'shape' is missing");
    return true;
}

/* ---------------------------------------------------------------------------------- */
/* Reading                                                                            */
/* ---------------------------------------------------------------------------------- */

/* The prefix (magic, version, header length) and the header dict come first; numpy writes at
 * most 12 + NPY_MAX_HEADER bytes of them, so that much of a file decides its layout. */
#define NPY_PREAMBLE_MAX (12 + NPY_MAX_HEADER)

/* Where the data of an image lies and what it holds, once its preamble has been checked. */
typedef struct npy_layout {
    npy_dtype dtype;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    size_t count, offset, bytes; /* elements; data offset and byte size in the image */
} npy_layout;

/* The one parser of the format, for files and memory alike: checks the preamble of an image
 * of TOTAL bytes whose first HAVE bytes are in buf (have == total, or have >=
 * NPY_PREAMBLE_MAX), and that the data after it is exactly what the shape needs. Knowing the
 * total first avoids allocating what a lying header asks for. */
static bool parse_preamble(const unsigned char *buf, size_t have, uint64_t total, const char *path,
                           npy_layout *l, char *err, size_t err_size)
{
    if (have < 8)
        return fail(err, err_size, "%s: not a .npy file (shorter than its magic string)", path);
    if (memcmp(buf, npy_magic, sizeof npy_magic) != 0)
        return fail(err, err_size, "%s: not a .npy file (bad magic string)", path);
    int major = buf[6], minor = buf[7];
    if ((major != 1 && major != 2 && major != 3) || minor != 0)
        return fail(err, err_size,
                    "%s: unsupported .npy format version %d.%d (need 1.0, 2.0 or 3.0)", path, major,
                    minor);
    size_t header_len, offset;
    if (major == 1) {
        if (have < 10) return fail(err, err_size, "%s: truncated header length", path);
        header_len = (size_t)buf[8] | (size_t)buf[9] << 8;
        offset = 10;
    } else {
        if (have < 12) return fail(err, err_size, "%s: truncated header length", path);
        uint32_t len32 = (uint32_t)buf[8] | (uint32_t)buf[9] << 8 | (uint32_t)buf[10] << 16 |
                         (uint32_t)buf[11] << 24;
        if (len32 > NPY_MAX_HEADER)
            return fail(err, err_size, "%s: header length %lu exceeds %d bytes", path,
                        (unsigned long)len32, NPY_MAX_HEADER);
        header_len = len32;
        offset = 12;
    }
    if (have - offset < header_len)
        return fail(err, err_size, "%s: truncated header (file ends inside it)", path);

    /* The dict parser reads a NUL-terminated string. */
    char *text = malloc(header_len + 1);
    if (!text) return fail(err, err_size, "%s: out of memory reading the header", path);
    memcpy(text, buf + offset, header_len);
    text[header_len] = '\0';
    offset += header_len;
    header_info h = {0}; /* its shape beyond ndim is copied out too */
    char why[128];
    bool ok = strlen(text) == header_len;
    if (!ok) snprintf(why, sizeof why, "NUL byte inside the header");
    if (ok) ok = parse_header(text, &h, why, sizeof why);
    free(text);
    if (!ok) return fail(err, err_size, "%s: malformed header: %s", path, why);

    npy_dtype dtype;
    if (strcmp(h.descr, "<f4") == 0) {
        dtype = NPY_F32;
    } else if (strcmp(h.descr, "<i8") == 0) {
        dtype = NPY_I64;
    } else {
        return fail(err, err_size, "%s: unsupported dtype '%s' (need '<f4' float32 or '<i8' int64)",
                    path, h.descr);
    }
    if (h.fortran_order && h.ndim > 1)
        return fail(err, err_size, "%s: fortran_order True is not supported (need C order)", path);

    char shape_text[160];
    npy_shape_text(h.ndim, h.shape, shape_text, sizeof shape_text);
    size_t count, bytes;
    if (!npy_shape_count(h.ndim, h.shape, &count))
        return fail(err, err_size, "%s: shape %s: element count overflows", path, shape_text);
    if (__builtin_mul_overflow(count, dtype_size(dtype), &bytes))
        return fail(err, err_size, "%s: shape %s: byte size overflows", path, shape_text);
    uint64_t data_have = total - offset;
    if (data_have < bytes)
        return fail(err, err_size,
                    "%s: truncated data: shape %s needs %zu bytes, the file has %llu", path,
                    shape_text, bytes, (unsigned long long)data_have);
    if (data_have > bytes)
        return fail(err, err_size, "%s: %llu bytes of trailing garbage after the data of shape %s",
                    path, (unsigned long long)(data_have - bytes), shape_text);
    l->dtype = dtype;
    l->ndim = h.ndim;
    memcpy(l->shape, h.shape, sizeof h.shape);
    l->count = count;
    l->offset = offset;
    l->bytes = bytes;
    return true;
}

/* Hands a checked layout and its data (malloc'd, owned from now on) to *out. */
static void take_data(npy_array *out, const npy_layout *l, void *data)
{
    swap_to_host(data, l->count, dtype_size(l->dtype));
    out->dtype = l->dtype;
    out->ndim = l->ndim;
    memcpy(out->shape, l->shape, sizeof l->shape);
    out->count = l->count;
    out->data = data;
}

bool npy_parse(const void *buf, size_t n, const char *name, npy_array *out, char *err,
               size_t err_size)
{
    memset(out, 0, sizeof *out);
    npy_layout l;
    if (!parse_preamble(buf, n, n, name, &l, err, err_size)) return false;
    void *data = malloc(l.bytes ? l.bytes : 1);
    if (!data) return fail(err, err_size, "%s: out of memory (%zu bytes)", name, l.bytes);
    memcpy(data, (const unsigned char *)buf + l.offset, l.bytes);
    take_data(out, &l, data);
    return true;
}

/* Up to n bytes; fewer only at the end of the file or on an error (ferror tells). */
static size_t read_some(FILE *f, void *buf, size_t n) { return fread(buf, 1, n, f); }

/* A regular file: its preamble (at most NPY_PREAMBLE_MAX bytes) is parsed against the file's
 * size, then only the data the header implies is read, straight into the array. */
static bool read_sized(FILE *f, uint64_t size, const char *path, npy_array *out, char *err,
                       size_t err_size)
{
    size_t have = size < NPY_PREAMBLE_MAX ? (size_t)size : NPY_PREAMBLE_MAX;
    unsigned char *pre = malloc(have ? have : 1);
    if (!pre) return fail(err, err_size, "%s: out of memory reading the header", path);
    npy_layout l;
    bool ok = read_some(f, pre, have) == have
                  ? parse_preamble(pre, have, size, path, &l, err, err_size)
                  : fail(err, err_size, "%s: read error (the file shrank while being read)", path);
    free(pre);
    if (!ok) return false;
    void *data = malloc(l.bytes ? l.bytes : 1);
    if (!data) return fail(err, err_size, "%s: out of memory (%zu bytes)", path, l.bytes);
    char shape_text[160];
    npy_shape_text(l.ndim, l.shape, shape_text, sizeof shape_text);
    if (fseek(f, (long)l.offset, SEEK_SET) != 0 || read_some(f, data, l.bytes) != l.bytes)
        ok = fail(err, err_size, "%s: truncated data: shape %s needs %zu bytes", path, shape_text,
                  l.bytes);
    else if (fgetc(f) != EOF) /* the file grew after fstat */
        ok = fail(err, err_size, "%s: trailing garbage after the data of shape %s", path,
                  shape_text);
    if (!ok) {
        free(data);
        return false;
    }
    take_data(out, &l, data);
    return true;
}

static const char *file_kind(mode_t mode)
{
    return S_ISDIR(mode)    ? "a folder"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISSOCK(mode) ? "a socket"
                            : "not a plain file";
}

FILE *open_regular_file(const char *path, uint64_t *size, char *err, size_t err_size)
{
    /* stat first: a device is refused without being opened at all */
    struct stat st;
    if (stat(path, &st) != 0) {
        fail(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        fail(err, err_size, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
        return NULL;
    }
    /* Checked again on what was opened, in case the name was replaced meanwhile; O_NONBLOCK
     * keeps that open from waiting for a writer if it is a FIFO now. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fail(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    int flags = fcntl(fd, F_GETFL);
    FILE *f = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        fail(err, err_size, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
    else if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0 || !(f = fdopen(fd, "rb")))
        fail(err, err_size, "%s: cannot open: %s", path, strerror(errno));
    if (!f) {
        close(fd);
        return NULL;
    }
    *size = (uint64_t)st.st_size;
    return f;
}

bool npy_read(const char *path, npy_array *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    uint64_t size;
    FILE *f = open_regular_file(path, &size, err, err_size);
    if (!f) return false;
    bool ok = read_sized(f, size, path, out, err, err_size);
    if (ferror(f) && ok) {
        npy_free(out);
        ok = fail(err, err_size, "%s: read error", path);
    }
    fclose(f);
    return ok;
}

bool npy_alloc_f32(npy_array *out, int ndim, const int64_t *shape, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    size_t count, bytes;
    if (ndim < 0 || ndim > NPY_MAX_DIMS)
        return fail(err, err_size, "array has %d dimensions (at most %d)", ndim, NPY_MAX_DIMS);
    if (!npy_shape_count(ndim, shape, &count) ||
        __builtin_mul_overflow(count, sizeof(float), &bytes)) {
        char s[160];
        npy_shape_text(ndim, shape, s, sizeof s);
        return fail(err, err_size, "array of shape %s is too large", s);
    }
    out->data = calloc(count ? count : 1, sizeof(float));
    if (!out->data) return fail(err, err_size, "out of memory (%zu bytes)", bytes);
    out->dtype = NPY_F32;
    out->ndim = ndim;
    memcpy(out->shape, shape, (size_t)ndim * sizeof *shape);
    out->count = count;
    return true;
}

void npy_free(npy_array *a)
{
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* ---------------------------------------------------------------------------------- */
/* Writing                                                                            */
/* ---------------------------------------------------------------------------------- */

static bool write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static bool write_data(int fd, const float *data, size_t count)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    float chunk[4096];
    for (size_t i = 0; i < count; i += 4096) {
        size_t n = count - i < 4096 ? count - i : 4096;
        memcpy(chunk, data + i, n * sizeof(float));
        swap_to_host(chunk, n, sizeof(float));
        if (!write_all(fd, chunk, n * sizeof(float))) return false;
    }
    return true;
#else
    return write_all(fd, data, count * sizeof(float));
#endif
}

/* "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" padded with spaces and a
 * final '\n' so the data starts at a multiple of 64 bytes, exactly as numpy writes it. */
static size_t format_header(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t len = (size_t)snprintf(buf, n, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    for (int i = 0; i < ndim; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    len += (size_t)snprintf(buf + len, n - len, "%s), }", ndim == 1 ? "," : "");
    size_t total = 10 + len + 1;
    size_t padded = (total + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    memset(buf + len, ' ', padded - total);
    len += padded - total;
    buf[len++] = '\n';
    return len;
}

/* The hidden files that exist now, for SIGINT and SIGTERM to remove: a fixed table of
 * lock-free atomics, as a signal handler may touch nothing else. While `deferring` is set the
 * handler only records the signal; npy_temps_defer(false) then acts on it. */
static _Atomic(char *) temp_names[NPY_TEMP_SLOTS];
static atomic_int deferring, pending_signal;
static atomic_flag handlers_installed = ATOMIC_FLAG_INIT;

static void remove_temps_and_die(int sig)
{
    for (int i = 0; i < NPY_TEMP_SLOTS; i++) {
        char *name = atomic_exchange(&temp_names[i], NULL);
        if (name) unlink(name);
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig); /* delivered when the handler returns (its signal is blocked until then) */
}

static void on_signal(int sig)
{
    const int e = errno;
    if (atomic_load(&deferring))
        atomic_store(&pending_signal, sig);
    else
        remove_temps_and_die(sig);
    errno = e;
}

/* Catches SIGINT and SIGTERM where they would end the process (not where they are ignored). */
static void install_handlers(void)
{
    if (atomic_flag_test_and_set(&handlers_installed)) return;
    static const int sigs[] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++) {
        struct sigaction old, act;
        if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL) continue;
        memset(&act, 0, sizeof act);
        act.sa_handler = on_signal;
        sigemptyset(&act.sa_mask);
        sigaction(sigs[i], &act, NULL);
    }
}

void npy_temps_defer(bool on)
{
    if (on) {
        atomic_store(&deferring, 1);
        return;
    }
    atomic_store(&deferring, 0);
    const int sig = atomic_exchange(&pending_signal, 0);
    if (sig) remove_temps_and_die(sig);
}

void npy_temps_forget(const char *name)
{
    for (int i = 0; name && i < NPY_TEMP_SLOTS; i++) {
        char *expected = (char *)name;
        if (atomic_compare_exchange_strong(&temp_names[i], &expected, NULL)) return;
    }
}

void npy_temps_forget_all(void)
{
    for (int i = 0; i < NPY_TEMP_SLOTS; i++) atomic_store(&temp_names[i], NULL);
}

int npy_temps_count(void)
{
    int n = 0;
    for (int i = 0; i < NPY_TEMP_SLOTS; i++) n += atomic_load(&temp_names[i]) != NULL;
    return n;
}

int hidden_sibling(const char *path, char **name)
{
    /* In PATH's own folder: rename() is atomic only within one file system. */
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        errno = ENOMEM;
        return -1;
    }
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    snprintf(tmp, plen + 16, "%.*s.%s.XXXXXX", (int)dir_len, path, path + dir_len);
    install_handlers();
    /* created and listed as one step: a signal in between would leave it unlisted */
    const bool was_deferring = atomic_exchange(&deferring, 1);
    int fd = mkstemp(tmp);
    const int e = errno;
    for (int i = 0; fd >= 0 && i < NPY_TEMP_SLOTS; i++) {
        char *expected = NULL;
        if (atomic_compare_exchange_strong(&temp_names[i], &expected, tmp)) break;
    }
    if (!was_deferring) npy_temps_defer(false);
    if (fd < 0) {
        free(tmp);
        errno = e;
        return -1;
    }
    *name = tmp;
    return fd;
}

char *npy_write_f32_temp(const char *path, const float *data, int ndim, const int64_t *shape,
                         char *err, size_t err_size)
{
    size_t count;
    if (ndim < 0 || ndim > NPY_MAX_DIMS || !npy_shape_count(ndim, shape, &count) ||
        count > SIZE_MAX / sizeof(float)) {
        fail(err, err_size, "%s: invalid shape for writing", path);
        return NULL;
    }
    /* 8 dims of at most 20 digits fit easily; the header is far below the 1.0 limit. */
    unsigned char head[512];
    memcpy(head, npy_magic, sizeof npy_magic);
    head[6] = 1;
    head[7] = 0;
    size_t hlen = format_header((char *)head + 10, sizeof head - 10, ndim, shape);
    head[8] = (unsigned char)(hlen & 0xff);
    head[9] = (unsigned char)(hlen >> 8);

    char *tmp;
    int fd = hidden_sibling(path, &tmp);
    if (fd < 0) {
        fail(err, err_size, "%s: cannot create a file in its folder: %s", path, strerror(errno));
        return NULL;
    }
    /* mkstemp creates 0600; outputs should get the usual permissions. */
    mode_t mask = umask(0);
    umask(mask);
    bool ok = fchmod(fd, 0666 & ~mask) == 0 && write_all(fd, head, 10 + hlen) &&
              write_data(fd, data, count) && fsync(fd) == 0;
    int e = errno;
    if (close(fd) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        npy_temps_forget(tmp);
        unlink(tmp);
        free(tmp);
        fail(err, err_size, "%s: cannot write: %s", path, strerror(e));
        return NULL;
    }
    return tmp;
}

bool npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, char *err,
                   size_t err_size)
{
    char *tmp = npy_write_f32_temp(path, data, ndim, shape, err, err_size);
    if (!tmp) return false;
    npy_temps_defer(true);
    bool ok = rename(tmp, path) == 0;
    if (!ok) {
        fail(err, err_size, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
    }
    npy_temps_forget(tmp);
    npy_temps_defer(false);
    free(tmp);
    return ok;
}
