/* libFuzzer target: the CLI's reference-case loader (tools/linseq/case.c) and what `linseq
 * run` does with a case it accepts.
 *
 * Input: one options byte, then records, each a tag byte, a 16-bit little-endian length and
 * that many payload bytes (the last record may be cut short by the end of the input):
 *   tag & 0x7f  the file: 0 is meta.json, the others the tensor names of the ops with
 *               ".npy" (case_files.h: the fixed list, then every other file a case of the
 *               op table can read, from the table)
 *   tag & 0x80  0: the payload is the file's content, as is;
 *               1: a well-formed .npy file is made from it: payload[0] bit 0 picks int64
 *                  (else float32), payload[1] % 9 the rank, the next bytes the dimensions;
 *                  float data is pseudo-random in [-1, 1], int64 data non-decreasing offsets
 *                  from 0 in steps of 0..3 (mostly valid cu_seqlens)
 * The files go to a private folder (mkdtemp in TMPDIR, removed after each input). When
 * case_load accepts the folder, the case runs forward and backward through the library (with
 * the mode, chunk size and threads of the options byte) as `linseq run` would, and the outputs
 * are written with case_write_outputs and read back bit for bit. Cases whose outputs or work
 * are too large to run fast are skipped after loading.
 *
 * An input of 2 or 3 bytes (too short for a record: before, an empty folder; no input of
 * fuzz/corpus/case had that size) is the options byte, then an op of ls_ops() by its index
 * (the byte modulo the op count) and a seed byte (0 when absent): the folder is that op's
 * case made from the table (table_case.h), which must load. So every op of the table is one byte away
 * whatever the corpus holds, and each start of the target runs every op's table-made case
 * once (LLVMFuzzerInitialize) before any input: every run, `scripts/fuzz.sh 0` included,
 * reaches every op with no seed written per op. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "case.h"
#include "case_files.h"
#include "optable/optable.h"
#include "table_case.h"
#include "commands.h"
#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Outputs and gradients in floats, and the op's work, above which a loaded case is not run. */
#define CASE_MAX_FLOATS (1 << 21)
#define CASE_MAX_WORK 1.6e7

__attribute__((noreturn)) static void die(const char *what, const char *detail)
{
    fprintf(stderr, "FUZZ CHECK FAILED (case): %s: %s\n", what, detail);
    abort();
}

static void put_u16(unsigned char *p, size_t v)
{
    p[0] = (unsigned char)(v & 0xff);
    p[1] = (unsigned char)(v >> 8);
}

/* A version 1.0 .npy image of the shape and dtype the payload describes. */
static unsigned char *synth_npy(const uint8_t *pl, size_t n, size_t *out_len)
{
    const bool i64 = n > 0 && (pl[0] & 1);
    const int ndim = n > 1 ? pl[1] % 9 : 1;
    int64_t shape[8];
    size_t count = 1;
    size_t at = 2;
    for (int i = 0; i < ndim; i++) {
        shape[i] = at < n ? pl[at++] : 1;
        count *= (size_t)shape[i]; /* at most 255^8: fits, but checked below */
        if (count > (1u << 20)) count = (size_t)1 << 21; /* too big: capped and rejected */
    }
    if (count > (1u << 20)) return NULL;
    char head[256];
    int len = snprintf(head, sizeof head, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                       i64 ? "<i8" : "<f4");
    for (int i = 0; i < ndim; i++)
        len += snprintf(head + len, sizeof head - (size_t)len, "%s%lld", i ? ", " : "",
                        (long long)shape[i]);
    len += snprintf(head + len, sizeof head - (size_t)len, "%s), }\n", ndim == 1 ? "," : "");
    const size_t elem = i64 ? 8 : 4, total = 10 + (size_t)len + count * elem;
    unsigned char *img = malloc(total);
    if (!img) die("out of memory", "");
    memcpy(img, "\x93NUMPY\x01\x00", 8);
    put_u16(img + 8, (size_t)len);
    memcpy(img + 10, head, (size_t)len);
    unsigned char *d = img + 10 + len;
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ n;
    int64_t off = 0;
    for (size_t i = 0; i < count; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if (i64) {
            const unsigned step = at < n ? pl[at++] % 4 : (unsigned)(rng % 4);
            if (i) off += step;
            memcpy(d + i * 8, &off, 8);
        } else {
            const float f = (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
            memcpy(d + i * 4, &f, 4);
        }
    }
    *out_len = total;
    return img;
}

static void write_file(const char *dir, const char *name, const void *p, size_t n)
{
    char *path = strcmp(name, "meta.json") == 0 ? case_path(dir, "meta", ".json")
                                                : case_path(dir, name, ".npy");
    FILE *f = path ? fopen(path, "wb") : NULL;
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) die("cannot write", path ? path : dir);
    free(path);
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char *p = case_path(dir, e->d_name, "");
            if (!p) die("out of memory", "");
            if (unlink(p) != 0) remove_tree(p); /* the output folder */
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* The FLOPs of the forward: how long a case would run, to skip the slow ones. */
static double work_of(const ls_case *c) { return c->op->flops(c->problem, NULL); }

static double floats_of(const case_output *o, int n)
{
    double total = 0;
    for (int i = 0; i < n; i++) {
        double k = 1;
        for (int d = 0; d < o[i].ndim; d++) k *= (double)o[i].shape[d];
        total += k;
    }
    return total;
}

/* What `linseq run` does after loading, plus a read-back of every file it writes. */
static void run_case(const ls_case *c, const char *dir, uint8_t opts)
{
    if (work_of(c) > CASE_MAX_WORK ||
        floats_of(c->produced, c->n_produced) + floats_of(c->computable, c->n_computable) >
            CASE_MAX_FLOATS)
        return;
    static const int chunks[4] = {0, 16, 32, 128};
    const linseq_exec ex = {.mode = (linseq_mode)(opts & 3) % 3,
                            .chunk_size = chunks[opts >> 2 & 3],
                            .threads = opts >> 4 & 1 ? 2 : 1};
    case_result r;
    char err[2048];
    const int rc = case_run(c, &ex, &r, err, sizeof err);
    if (getenv("FUZZ_TRACE")) fprintf(stderr, "case_run: %d %s\n", rc, rc ? err : "");
    if (rc != LS_EXIT_OK) return;
    if (r.n != c->n_produced) die("case_run produced a different count", c->dir);
    const int rb = case_run_backward(c, &ex, &r, err, sizeof err);
    if (getenv("FUZZ_TRACE")) fprintf(stderr, "case_run_backward: %d %s\n", rb, rb ? err : "");
    if (rb != LS_EXIT_OK) {
        case_result_free(&r);
        return;
    }
    if (r.n_grads != c->n_grads) die("case_run_backward produced a different count", c->dir);
    if (opts >> 5 & 1) {
        char *out = case_path(dir, "out", "");
        if (!out) die("out of memory", "");
        if (!case_write_outputs(c, &r, out, err, sizeof err)) die("case_write_outputs", err);
        for (int i = 0; i < c->n_outputs + r.n_grads; i++) {
            const case_tensor *t =
                i < c->n_outputs ? case_output_tensor(c, &r, i) : &r.g[i - c->n_outputs];
            char *path = case_path(out, t->name, ".npy");
            npy_array a;
            if (!path || !npy_read(path, &a, err, sizeof err)) die("read back", err);
            if (a.dtype != NPY_F32 || a.ndim != t->arr.ndim || a.count != t->arr.count ||
                memcmp(a.data, t->arr.data, a.count * sizeof(float)) != 0)
                die("a written output reads back differently", path);
            npy_free(&a);
            free(path);
        }
        free(out);
    }
    case_result_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fuzz_case.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) die("mkdtemp", dir);

    const uint8_t opts = data[0];
    const ls_op *table_op = NULL;
    if (size == 2 || size == 3) {
        int n_ops;
        const ls_op *const *ops = ls_ops(&n_ops);
        table_op = ops[data[1] % n_ops];
        char werr[512];
        if (!fz_table_case_write(table_op, dir, size == 3 ? data[2] : 0, werr, sizeof werr))
            die("cannot write a table-made case", werr);
    }
    size_t at = 1;
    while (!table_op && at + 3 <= size) {
        const uint8_t tag = data[at];
        size_t len = (size_t)data[at + 1] | (size_t)data[at + 2] << 8;
        at += 3;
        if (len > size - at) len = size - at;
        const char *name = fz_case_file(tag);
        if (tag & 0x80 && strcmp(name, "meta.json") != 0) {
            size_t n;
            unsigned char *img = synth_npy(data + at, len, &n);
            if (img) write_file(dir, name, img, n);
            free(img);
        } else {
            write_file(dir, name, data + at, len);
        }
        at += len;
    }

    ls_case c;
    char err[2048] = "";
    const bool loaded = case_load(dir, &c, err, sizeof err);
    if (getenv("FUZZ_TRACE")) /* what an input decodes to */
        fprintf(stderr, "case_load: %s\n", loaded ? c.op_name : err);
    if (table_op && !loaded) { /* the case table_case.h makes of an op must load */
        char what[256];
        snprintf(what, sizeof what, "the table-made case of op %s does not load", table_op->name);
        die(what, err);
    }
    if (loaded) {
        if (c.n_inputs < 1 || c.n_inputs > CASE_MAX_TENSORS || c.n_outputs > c.n_produced ||
            c.n_grads > c.n_computable)
            die("inconsistent case", dir);
        run_case(&c, dir, opts);
        case_free(&c);
    } else {
        if (!err[0]) die("case_load failed without a message", dir);
        if (c.meta || c.n_inputs || c.dir) die("a failed case_load left state", err);
    }
    remove_tree(dir);
    return 0;
}

/* Every op of the table once, from its table-made case, before the first input. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    int n_ops;
    ls_ops(&n_ops);
    for (int i = 0; i < n_ops; i++) {
        const uint8_t input[2] = {0x31, (uint8_t)i};
        LLVMFuzzerTestOneInput(input, sizeof input);
    }
    return 0;
}
