/* libFuzzer target: the CLI's .npy reader (tools/linseq/npy.c) on arbitrary bytes.
 *
 * The bytes go to npy_parse (the in-memory entry) and, written to a file, to npy_read: both
 * must agree on success and on the message. An accepted array must be self-consistent
 * (count = product of the shape, data of exactly count elements, which AddressSanitizer checks
 * by reading all of it); a float32 array must survive npy_write_f32 and npy_read bit for bit. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

__attribute__((noreturn)) static void die(const char *what, const char *detail)
{
    fprintf(stderr, "FUZZ CHECK FAILED (npy): %s: %s\n", what, detail);
    abort();
}

static char dir[4096];

static void remove_dir(void)
{
    if (dir[0]) rmdir(dir);
}

/* One private folder for the process (TMPDIR or /tmp), emptied after every input. */
static const char *work_dir(void)
{
    if (!dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/fuzz_npy.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) die("mkdtemp", dir);
        atexit(remove_dir);
    }
    return dir;
}

static void check_array(const npy_array *a)
{
    size_t count;
    if (a->ndim < 0 || a->ndim > NPY_MAX_DIMS) die("ndim out of range", "");
    if (!npy_shape_count(a->ndim, a->shape, &count) || count != a->count)
        die("count is not the product of the shape", "");
    if (a->dtype != NPY_F32 && a->dtype != NPY_I64) die("unknown dtype", "");
    if (!a->data) die("no data", "");
    /* touch every byte the shape promises */
    const size_t bytes = count * (a->dtype == NPY_I64 ? 8 : 4);
    unsigned sum = 0;
    for (size_t i = 0; i < bytes; i++) sum += ((const unsigned char *)a->data)[i];
    char text[200];
    npy_shape_text(a->ndim, a->shape, text, sizeof text);
    if (sum == 0xffffffffu || text[0] != '[') die("shape text", text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    npy_array a, b;
    char err_mem[512] = "", err_file[512] = "";
    const char *d = work_dir();
    char path[4200], out[4200];
    snprintf(path, sizeof path, "%s/in.npy", d);
    snprintf(out, sizeof out, "%s/out.npy", d);

    const bool ok_mem = npy_parse(data, size, path, &a, err_mem, sizeof err_mem);
    if (!ok_mem && (a.data || a.count)) die("a failed parse left data", err_mem);
    if (!ok_mem && !err_mem[0]) die("a failed parse gave no message", "");
    if (ok_mem) check_array(&a);

    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) die("cannot write", path);
    const bool ok_file = npy_read(path, &b, err_file, sizeof err_file);
    unlink(path);
    if (ok_file != ok_mem) die("npy_read and npy_parse disagree", ok_mem ? err_file : err_mem);
    if (!ok_file && strcmp(err_mem, err_file) != 0) die(err_mem, err_file);
    if (ok_file) {
        check_array(&b);
        if (a.dtype != b.dtype || a.ndim != b.ndim || a.count != b.count ||
            memcmp(a.shape, b.shape, (size_t)a.ndim * sizeof a.shape[0]) != 0 ||
            memcmp(a.data, b.data, a.count * (a.dtype == NPY_I64 ? 8 : 4)) != 0)
            die("npy_read and npy_parse give different arrays", path);
    }

    /* float32 round trip through the writer */
    if (ok_mem && a.dtype == NPY_F32) {
        char err[512];
        npy_array c;
        if (!npy_write_f32(out, a.data, a.ndim, a.shape, err, sizeof err)) die("write", err);
        if (!npy_read(out, &c, err, sizeof err)) die("read back", err);
        unlink(out);
        if (c.ndim != a.ndim || c.count != a.count ||
            memcmp(c.shape, a.shape, (size_t)a.ndim * sizeof a.shape[0]) != 0 ||
            memcmp(c.data, a.data, a.count * 4) != 0)
            die("round trip changed the array", out);
        npy_free(&c);
    }
    npy_free(&a);
    npy_free(&b);
    return 0;
}
