/* The CLI's file handling: .npy round trips and every rejection the reader promises (each
 * with a message naming the file and the fault; devices and FIFOs refused unread), the case
 * loader's refusal of broken case folders (inputs, upstream gradients and gradient names,
 * meta.json or an input that is a FIFO or a device), the gradients of a conv case
 * checked against values worked out by hand, `run` writing outputs and gradients or no
 * partial set at all (an earlier set left whole on failure, never a mix of two runs, never
 * into the case folder), `check` with and without --fwd-only, the comparison rule's edge
 * cases, and a signal during the writes removing the temporary files. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tools/linseq/case.h"
#include "../tools/linseq/commands.h"
#include "../tools/linseq/compare.h"
#include "../tools/linseq/npy.h"
#include "optable/optable.h"
#include "testutil.h"

static char root[256];

static char *path_in(const char *dir, const char *name)
{
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(f);
}

static void write_text(const char *path, const char *text)
{
    write_bytes(path, text, strlen(text));
}

/* A .npy file with a hand-written header (padded to 64 bytes) and `data_bytes` of data. */
static void write_npy_raw(const char *path, int major, int minor, const char *header,
                          const void *data, size_t data_bytes)
{
    unsigned char buf[1024];
    size_t pre = major == 1 ? 10 : 12, hl = strlen(header);
    size_t total = (pre + hl + 1 + 63) / 64 * 64, hlen = total - pre;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = (unsigned char)minor;
    buf[8] = (unsigned char)(hlen & 0xff);
    buf[9] = (unsigned char)(hlen >> 8);
    if (major != 1) buf[10] = buf[11] = 0;
    memcpy(buf + pre, header, hl);
    memset(buf + pre + hl, ' ', hlen - hl - 1);
    buf[total - 1] = '\n';
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, total, f) != total ||
        (data_bytes && fwrite(data, 1, data_bytes, f) != data_bytes)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(f);
}

static void write_f32(const char *path, int ndim, const int64_t *shape, const float *data)
{
    char err[512];
    if (!npy_write_f32(path, data, ndim, shape, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        exit(2);
    }
}

static bool has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static void remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            for (struct dirent *e; (e = readdir(d));) {
                if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
                char sub[1024];
                snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
                remove_tree(sub);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* The returned path stays valid for the whole run (path_in's buffers are reused). */
static char *make_dir(const char *name)
{
    static char dirs[64][512];
    static int next;
    char *p = dirs[next++ % 64];
    snprintf(p, sizeof dirs[0], "%s/%s", root, name);
    if (mkdir(p, 0777) != 0) {
        fprintf(stderr, "cannot create %s\n", p);
        exit(2);
    }
    return p;
}

/* ---------------------------------------------------------------------------------- */

static void test_round_trip(void)
{
    char *dir = make_dir("roundtrip"), err[512];
    const int64_t shapes[][3] = {{0}, {5}, {2, 3, 4}, {0, 3}};
    const int ndims[] = {0, 1, 3, 2};
    float data[24];
    for (int i = 0; i < 24; i++) data[i] = (float)i * 0.37f - 3.0f;
    data[1] = -0.0f;
    data[2] = INFINITY;
    data[3] = NAN;
    for (int s = 0; s < 4; s++) {
        char name[32];
        snprintf(name, sizeof name, "a%d.npy", s);
        char *path = path_in(dir, name);
        CHECK(npy_write_f32(path, data, ndims[s], shapes[s], err, sizeof err), "write: %s", err);
        npy_array a;
        bool ok = npy_read(path, &a, err, sizeof err);
        CHECK(ok, "read back %s: %s", path, err);
        if (!ok) continue;
        size_t count = 1;
        for (int d = 0; d < ndims[s]; d++) count *= (size_t)shapes[s][d];
        CHECK(a.dtype == NPY_F32 && a.ndim == ndims[s] && a.count == count, "shape %d", s);
        for (int d = 0; d < a.ndim && d < ndims[s]; d++)
            CHECK(a.shape[d] == shapes[s][d], "dim %d of shape %d", d, s);
        CHECK(count == 0 || memcmp(a.data, data, count * sizeof(float)) == 0,
              "data of shape %d differs bitwise", s);
        npy_free(&a);

        /* version 1.0, data 64-byte aligned, header ending in '\n' */
        unsigned char head[16];
        FILE *f = fopen(path, "rb");
        struct stat st;
        CHECK(f && fread(head, 1, 10, f) == 10 && stat(path, &st) == 0, "reopen %s", path);
        if (f) fclose(f);
        size_t hlen = (size_t)head[8] | (size_t)head[9] << 8;
        CHECK(memcmp(head, "\x93NUMPY\x01\x00", 8) == 0, "magic/version");
        CHECK((10 + hlen) % 64 == 0, "data offset %zu not a multiple of 64", 10 + hlen);
        CHECK((size_t)st.st_size == 10 + hlen + count * 4, "file size");
        f = fopen(path, "rb");
        if (f) {
            fseek(f, (long)(10 + hlen - 1), SEEK_SET);
            CHECK(fgetc(f) == '\n', "header does not end in a newline");
            fclose(f);
        }
    }
    /* overwriting is atomic: no temporary file is left next to the outputs */
    CHECK(npy_write_f32(path_in(dir, "a1.npy"), data, 1, shapes[1], err, sizeof err), "%s", err);
    CHECK(count_entries(dir) == 4, "stray files in %s: %d entries", dir, count_entries(dir));
}

static void test_accepted_variants(void)
{
    char *dir = make_dir("variants"), err[512];
    const float f[3] = {1.5f, -2.0f, 3.25f};
    const int64_t iv[4] = {0, 17, 64, 130};
    npy_array a;
    const struct {
        int major;
        const char *header;
    } ok_f32[] = {
        {2, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"},
        {3, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"},
        {1, "{\"shape\": (3,), \"fortran_order\": True, \"descr\": \"<f4\"}"},
        {1, "{ 'descr' : '<f4' ,\n 'fortran_order' : False , 'shape' : ( 1 , 3 ) }"},
    };
    for (size_t i = 0; i < sizeof ok_f32 / sizeof ok_f32[0]; i++) {
        char *p = path_in(dir, "v.npy");
        write_npy_raw(p, ok_f32[i].major, 0, ok_f32[i].header, f, sizeof f);
        bool ok = npy_read(p, &a, err, sizeof err);
        CHECK(ok && a.dtype == NPY_F32 && a.count == 3 && ((float *)a.data)[2] == 3.25f,
              "variant %zu rejected: %s", i, err);
        npy_free(&a);
    }
    char *p = path_in(dir, "cu.npy");
    write_npy_raw(p, 1, 0, "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", iv,
                  sizeof iv);
    bool ok = npy_read(p, &a, err, sizeof err);
    CHECK(ok && a.dtype == NPY_I64 && a.ndim == 1 && a.shape[0] == 4 &&
              ((int64_t *)a.data)[3] == 130,
          "int64 rejected: %s", err);
    npy_free(&a);
}

/* The file is rejected, and the message names it and contains `why`. */
static void expect_reject(const char *path, const char *why, const char *label)
{
    npy_array a;
    char err[512] = "";
    bool ok = npy_read(path, &a, err, sizeof err);
    CHECK(!ok, "%s: accepted", label);
    CHECK(!ok && has(err, path) && has(err, why), "%s: message \"%s\" lacks \"%s\"", label, err,
          why);
    CHECK(a.data == NULL && a.count == 0, "%s: output not left empty", label);
}

static void test_rejections(void)
{
    char *dir = make_dir("reject");
    const float f[6] = {0};
    char *p = path_in(dir, "bad.npy");
    const char *hdr6 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

    expect_reject(path_in(dir, "missing.npy"), "cannot open", "missing file");
    write_bytes(p, "\x93NUM", 4);
    expect_reject(p, "shorter than its magic", "4-byte file");
    const char zip[] = "PK\x03\x04zip file, not npy";
    write_bytes(p, zip, sizeof zip - 1);
    expect_reject(p, "bad magic", "bad magic");
    write_npy_raw(p, 4, 0, hdr6, f, sizeof f);
    expect_reject(p, "unsupported .npy format version 4.0", "version 4.0");
    write_npy_raw(p, 1, 1, hdr6, f, sizeof f);
    expect_reject(p, "unsupported .npy format version 1.1", "version 1.1");

    const struct {
        const char *header, *why, *label;
    } bad[] = {
        {"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", "unsupported dtype '<f8'",
         "float64"},
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", "unsupported dtype '>f4'",
         "big-endian float32"},
        {"{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", "unsupported dtype '<i4'",
         "int32"},
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", "fortran_order True",
         "Fortran order"},
        {"['descr', '<f4']", "not a dict", "list header"},
        {"{'descr': '<f4', 'shape': (2, 3), }", "'fortran_order' is missing", "missing key"},
        {"{'descr': '<f4', 'fortran_order': False, }", "'shape' is missing", "no shape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", "not a tuple", "(6)"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", "negative",
         "negative dim"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", "unexpected key 'x'",
         "extra key"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}",
         "appears twice", "duplicate key"},
        {"{'descr': '<f4', 'fortran_order': Nope, 'shape': (2, 3), }", "True or False", "bad bool"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} x", "after the closing",
         "text after dict"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", "expected ',' or '}'",
         "unclosed dict"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }",
         "more than 8 dimensions", "9 dims"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
         "within int64", "dim beyond int64"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }",
         "element count overflows", "count overflow"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }",
         "byte size overflows", "byte overflow"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_npy_raw(p, 1, 0, bad[i].header, f, sizeof f);
        expect_reject(p, bad[i].why, bad[i].label);
    }

    write_npy_raw(p, 1, 0, hdr6, f, sizeof f - 4);
    expect_reject(p, "truncated data", "short data");
    write_npy_raw(p, 2, 0, hdr6, f, sizeof f - 1);
    expect_reject(p, "truncated data", "short data, version 2.0");
    float more[7] = {0};
    write_npy_raw(p, 1, 0, hdr6, more, sizeof more);
    expect_reject(p, "trailing garbage", "long data");

    /* a header length pointing past the end of the file */
    unsigned char cut[10 + 20];
    memcpy(cut, "\x93NUMPY\x01\x00\x76\x00{'descr': '<f4', 'f", 30);
    write_bytes(p, cut, sizeof cut);
    expect_reject(p, "truncated header", "cut header");
    /* a NUL inside the header cannot be part of a dict literal */
    write_npy_raw(p, 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", f,
                  sizeof f);
    unsigned char buf[256];
    FILE *fp = fopen(p, "rb");
    size_t got = fp ? fread(buf, 1, sizeof buf, fp) : 0;
    if (fp) fclose(fp);
    buf[13] = '\0';
    write_bytes(p, buf, got);
    expect_reject(p, "NUL byte", "NUL in header");
}

/* A device or a pipe has no size to check a header against, and may never end (/dev/zero)
 * or never be written (a FIFO nobody opens): each is refused at once, by name, without
 * reading it. The alarm turns a regression (a read without end, an open that waits for a
 * writer) into a failing test instead of a hang. */
static void test_not_regular_files(void)
{
    char *dir = make_dir("not_regular");
    char *fifo = path_in(dir, "fifo.npy");
    CHECK(mkfifo(fifo, 0666) == 0, "mkfifo %s", fifo);
    const char *devices[] = {"/dev/zero", "/dev/urandom", "/dev/null"};
    alarm(10);
    expect_reject(fifo, "not a regular file", "a FIFO");
    expect_reject(dir, "not a regular file", "a folder");
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
        struct stat st;
        if (stat(devices[i], &st) != 0) continue;
        expect_reject(devices[i], "not a regular file", devices[i]);
        /* through a link, as a case folder would hold it */
        char *link = path_in(dir, "link.npy");
        unlink(link);
        CHECK(symlink(devices[i], link) == 0, "symlink to %s", devices[i]);
        expect_reject(link, "not a regular file", "a link to a device");
    }
    alarm(0);
}

static void test_write_failure(void)
{
    char err[512] = "";
    const float f[2] = {1, 2};
    const int64_t shape[1] = {2};
    char *p = path_in(root, "no/such/folder/x.npy");
    CHECK(!npy_write_f32(p, f, 1, shape, err, sizeof err), "write into a missing folder");
    CHECK(has(err, p) && has(err, "cannot create"), "message: %s", err);
}

/* ---------------------------------------------------------------------------------- */
/* Case folders                                                                       */
/* ---------------------------------------------------------------------------------- */

static const char conv_meta[] =
    "{\"op\": \"causal_conv1d\", \"B\": 1, \"T\": 3, \"D\": 2, \"W\": 4, \"activation\": null,\n"
    " \"has_bias\": true, \"has_state\": false,\n"
    " \"inputs\": [\"x\", \"weight\", \"bias\"], \"outputs\": [\"y\", \"conv_state_out\"],\n"
    " \"upstream_grads\": [\"d_y\"], \"grads\": [\"dx\", \"dweight\", \"dbias\"]}\n";

static const float conv_x[6] = {1, -2, 0.5f, 3, -1, 0.25f};
static const float conv_w[8] = {0.1f, 0.2f, 0.3f, 0.4f, -1, 0.5f, 2, 1};
static const float conv_b[2] = {0.5f, -0.25f};
static const float conv_dy[6] = {1, 2, -1, 0.5f, 0.25f, -3};

/* A valid causal_conv1d case; the tests then break one thing at a time. */
static char *make_conv_case(const char *name)
{
    char *dir = make_dir(name);
    write_text(path_in(dir, "meta.json"), conv_meta);
    write_f32(path_in(dir, "x.npy"), 3, (const int64_t[]){1, 3, 2}, conv_x);
    write_f32(path_in(dir, "weight.npy"), 2, (const int64_t[]){2, 4}, conv_w);
    write_f32(path_in(dir, "bias.npy"), 1, (const int64_t[]){2}, conv_b);
    write_f32(path_in(dir, "d_y.npy"), 3, (const int64_t[]){1, 3, 2}, conv_dy);
    return dir;
}

static void expect_load_fail(const char *dir, const char *want1, const char *want2,
                             const char *label)
{
    ls_case c;
    char err[1024] = "";
    bool ok = case_load(dir, &c, err, sizeof err);
    CHECK(!ok, "%s: loaded", label);
    CHECK(!ok && has(err, want1) && (!want2 || has(err, want2)),
          "%s: message \"%s\" lacks \"%s\"%s%s", label, err, want1, want2 ? " / " : "",
          want2 ? want2 : "");
    if (ok) case_free(&c);
}

static void test_case_valid(void)
{
    char *dir = make_conv_case("case_ok"), err[1024] = "";
    ls_case c;
    bool ok = case_load(dir, &c, err, sizeof err);
    CHECK(ok, "valid case rejected: %s", err);
    if (!ok) return;
    CHECK(c.op == ls_op_find("causal_conv1d") && c.n_outputs == 2 && c.n_grads == 3 &&
              c.n_inputs == 4 && c.upstream[0] != NULL && c.upstream[1] == NULL,
          "parsed op/lists");
    CHECK(strcmp(c.name, "case_ok") == 0, "name %s", c.name);
    case_result r;
    int rc = case_run(&c, NULL, &r, err, sizeof err);
    CHECK(rc == LS_EXIT_OK, "case_run: %s", err);
    if (rc == LS_EXIT_OK) {
        /* y[t,d] = bias[d] + sum_j w[d,j] xs[d,t+j] over a zero-padded window */
        const case_tensor *y = case_output_tensor(&c, &r, 0);
        double worst = 0;
        for (int t = 0; t < 3; t++)
            for (int d = 0; d < 2; d++) {
                double acc = conv_b[d];
                for (int j = 0; j < 4; j++) {
                    int src = t + j - 3;
                    if (src >= 0) acc += (double)conv_w[d * 4 + j] * conv_x[src * 2 + d];
                }
                worst = fmax(worst, fabs(acc - ((float *)y->arr.data)[t * 2 + d]));
            }
        CHECK(strcmp(y->name, "y") == 0 && worst < 1e-6, "conv output wrong by %g", worst);
        const case_tensor *st = case_output_tensor(&c, &r, 1);
        CHECK(st->arr.ndim == 3 && st->arr.shape[0] == 1 && st->arr.shape[1] == 2 &&
                  st->arr.shape[2] == 3,
              "conv_state_out shape");
        case_result_free(&r);
    }
    case_free(&c);
}

/* The conv case's gradients, worked out by hand from
 *     y[t,d] = bias[d] + sum_j w[d,j] xs[t+j],  xs = (0, 0, 0, x_0, x_1, x_2)
 * with the loss sum(y * d_y):
 *     dx[s,d]     = sum_{t >= s} d_y[t,d] w[d, 3 - (t - s)]
 *     dweight[d,j] = sum_t d_y[t,d] xs[t+j]
 *     dbias[d]    = sum_t d_y[t,d]
 * Channel 0: w = (0.1, 0.2, 0.3, 0.4), x = (1, 0.5, -1), d_y = (1, -1, 0.25):
 *     dx = (0.4 - 0.3 + 0.05, -0.4 + 0.075, 0.1), dweight = (0, 0.25, -1 + 0.125,
 *     1 - 0.5 - 0.25), dbias = 0.25.
 * Channel 1: w = (-1, 0.5, 2, 1), x = (-2, 3, 0.25), d_y = (2, 0.5, -3):
 *     dx = (2 + 1 - 1.5, 0.5 - 6, -3), dweight = (0, 6, -1 - 9, -4 + 1.5 - 0.75),
 *     dbias = -0.5. */
static void test_case_grads_by_hand(void)
{
    static const float want_dx[6] = {0.15f, 1.5f, -0.325f, -5.5f, 0.1f, -3};
    static const float want_dw[8] = {0, 0.25f, -0.875f, 0.25f, 0, 6, -10, -3.25f};
    static const float want_db[2] = {0.25f, -0.5f};
    static const struct {
        const char *name;
        const float *want;
        int ndim;
        int64_t shape[3];
    } grads[3] = {
        {"dx", want_dx, 3, {1, 3, 2}}, {"dweight", want_dw, 2, {2, 4}}, {"dbias", want_db, 1, {2}}};
    char *dir = make_conv_case("case_grads"), err[1024] = "";
    ls_case c;
    bool ok = case_load(dir, &c, err, sizeof err);
    CHECK(ok, "valid case rejected: %s", err);
    if (!ok) return;
    case_result r = {0};
    int rc = case_run_backward(&c, NULL, &r, err, sizeof err);
    CHECK(rc == LS_EXIT_OK && r.n_grads == 3, "case_run_backward: %s", err);
    for (int i = 0; rc == LS_EXIT_OK && i < r.n_grads && i < 3; i++) {
        const npy_array *a = &r.g[i].arr;
        bool shape_ok = strcmp(r.g[i].name, grads[i].name) == 0 && a->ndim == grads[i].ndim;
        for (int d = 0; shape_ok && d < a->ndim; d++) shape_ok = a->shape[d] == grads[i].shape[d];
        CHECK(shape_ok, "gradient %d is %s with the wrong shape", i, r.g[i].name);
        if (!shape_ok) continue;
        double worst = 0;
        for (size_t k = 0; k < a->count; k++)
            worst = fmax(worst, fabs((double)((float *)a->data)[k] - grads[i].want[k]));
        CHECK(worst < 1e-6, "%s wrong by %g", grads[i].name, worst);
    }
    case_result_free(&r);
    case_free(&c);
}

static void test_case_rejections(void)
{
    char *dir = make_conv_case("case_missing");
    unlink(path_in(dir, "bias.npy"));
    expect_load_fail(dir, "bias.npy", "cannot open", "missing input file");

    /* meta.json as a FIFO or a device: refused without waiting for a writer or reading */
    alarm(10);
    dir = make_conv_case("case_meta_fifo");
    unlink(path_in(dir, "meta.json"));
    CHECK(mkfifo(path_in(dir, "meta.json"), 0666) == 0, "mkfifo meta.json");
    expect_load_fail(dir, "meta.json", "not a regular file", "meta.json a FIFO");
    dir = make_conv_case("case_meta_dev");
    unlink(path_in(dir, "meta.json"));
    CHECK(symlink("/dev/zero", path_in(dir, "meta.json")) == 0, "symlink meta.json");
    expect_load_fail(dir, "meta.json", "not a regular file", "meta.json linked to /dev/zero");
    dir = make_conv_case("case_input_fifo");
    unlink(path_in(dir, "x.npy"));
    CHECK(mkfifo(path_in(dir, "x.npy"), 0666) == 0, "mkfifo x.npy");
    expect_load_fail(dir, "x.npy", "not a regular file", "input a FIFO");
    alarm(0);

    dir = make_conv_case("case_shape");
    write_f32(path_in(dir, "weight.npy"), 2, (const int64_t[]){2, 3}, conv_w);
    expect_load_fail(dir, "weight.npy: shape [2, 3]", "[D,W] = [2, 4]", "wrong-shape input");

    dir = make_conv_case("case_rank");
    write_f32(path_in(dir, "x.npy"), 2, (const int64_t[]){3, 2}, conv_x);
    expect_load_fail(dir, "x.npy: shape [3, 2]", "[1, 3, 2]", "input missing a dimension");

    dir = make_conv_case("case_dtype");
    const int64_t ib[2] = {1, 2};
    write_npy_raw(path_in(dir, "bias.npy"), 1, 0,
                  "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", ib, sizeof ib);
    expect_load_fail(dir, "bias.npy: dtype int64", "expected float32", "int64 input");

    dir = make_conv_case("case_f64");
    const double db[2] = {1, 2};
    write_npy_raw(path_in(dir, "bias.npy"), 1, 0,
                  "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", db, sizeof db);
    expect_load_fail(dir, "bias.npy", "unsupported dtype '<f8'", "float64 input");

    /* upstream gradients are checked like inputs, and named in the message */
    dir = make_conv_case("case_dy_shape");
    write_f32(path_in(dir, "d_y.npy"), 3, (const int64_t[]){1, 2, 3}, conv_dy);
    expect_load_fail(dir, "d_y.npy: shape [1, 2, 3]", "y's shape [B,T,D] = [1, 3, 2]",
                     "wrong-shape upstream gradient");

    dir = make_conv_case("case_dy_dtype");
    const int64_t idy[6] = {0};
    write_npy_raw(path_in(dir, "d_y.npy"), 1, 0,
                  "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 3, 2), }", idy,
                  sizeof idy);
    expect_load_fail(dir, "d_y.npy: dtype int64", "expected float32", "int64 upstream gradient");

    dir = make_conv_case("case_dy_missing");
    unlink(path_in(dir, "d_y.npy"));
    expect_load_fail(dir, "d_y.npy", "cannot open", "missing upstream gradient file");

    /* a gradient this op cannot produce without a bias */
    dir = make_conv_case("case_dbias_nobias");
    write_text(path_in(dir, "meta.json"),
               "{\"op\": \"causal_conv1d\", \"B\": 1, \"T\": 3, \"D\": 2, \"W\": 4,\n"
               " \"inputs\": [\"x\", \"weight\"], \"outputs\": [\"y\"],\n"
               " \"upstream_grads\": [\"d_y\"], \"grads\": [\"dx\", \"dbias\"]}\n");
    expect_load_fail(dir, "\"grads\" lists \"dbias\", which op causal_conv1d does not compute",
                     "meta.json", "gradient of an absent input");

    dir = make_conv_case("case_json");
    write_text(path_in(dir, "meta.json"), "{\"op\": \"causal_conv1d\",\n \"B\": 1,, }\n");
    expect_load_fail(dir, "meta.json", "malformed JSON (line 2)", "malformed meta.json");

    dir = make_dir("case_nometa");
    expect_load_fail(dir, "meta.json", "cannot open", "missing meta.json");

    dir = make_conv_case("case_array");
    write_text(path_in(dir, "meta.json"), "[1, 2]\n");
    expect_load_fail(dir, "meta.json", "not an object", "meta.json not an object");

    const struct {
        const char *from, *to, *want, *label;
    } edits[] = {
        {"\"causal_conv1d\"", "\"conv2d\"", "unknown op \"conv2d\"", "unknown op"},
        {"\"T\": 3", "\"T\": 2.5", "\"T\" must be an integer >= 1", "fractional size"},
        {"\"T\": 3", "\"T\": 0", "\"T\" must be an integer >= 1", "zero size"},
        {"\"W\": 4, ", "", "the size \"W\" is missing", "missing size"},
        {"\"has_bias\": true", "\"has_bias\": false", "\"has_bias\" is false", "flag mismatch"},
        {"\"bias\"]", "\"bias\", \"gate\"]", "lists \"gate\", which op causal_conv1d does not take",
         "unknown input"},
        {"\"bias\"]", "\"bias\", \"../x\"]", "not a name", "path in a name"},
        {"\"conv_state_out\"]", "\"conv_state_out\", \"hT\"]", "does not produce",
         "unknown output"},
        {"\"weight\", ", "", "lacks \"weight\"", "required input not listed"},
        {"\"activation\": null", "\"activation\": \"tanh\"", "\"activation\" is \"tanh\"",
         "unknown activation"},
        {"\"dbias\"]", "\"dbias\", \"dgate\"]",
         "\"grads\" lists \"dgate\", which op causal_conv1d does not compute", "unknown gradient"},
        {"\"dbias\"]", "\"dbias\", \"../dx\"]", "not a name", "path in a gradient name"},
        {"\"upstream_grads\": [\"d_y\"]", "\"upstream_grads\": []",
         "\"upstream_grads\" lacks \"d_y\"", "gradients without their upstream gradient"},
        {"\"upstream_grads\": [\"d_y\"], ", "", "\"upstream_grads\" lacks \"d_y\"",
         "no upstream_grads list"},
        {"[\"d_y\"]", "[\"d_y\", \"d_x\"]", "\"upstream_grads\" lists \"d_x\", which op",
         "unknown upstream gradient"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        char name[32], text[1024];
        snprintf(name, sizeof name, "case_edit%zu", i);
        dir = make_conv_case(name);
        const char *at = strstr(conv_meta, edits[i].from);
        CHECK(at != NULL, "edit %zu does not apply", i);
        if (!at) continue;
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - conv_meta), conv_meta, edits[i].to,
                 at + strlen(edits[i].from));
        write_text(path_in(dir, "meta.json"), text);
        expect_load_fail(dir, edits[i].want, "meta.json", edits[i].label);
    }
}

/* Redirects stdout to OUT_PATH (NULL: /dev/null) and stderr to /dev/null until
 * quiet_end(): the failures below are the expected ones. False when that cannot be set up. */
static int saved_fds[2] = {-1, -1};

static bool quiet_begin(const char *out_path)
{
    fflush(stdout);
    fflush(stderr);
    int out_fd =
        out_path ? open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0666) : open("/dev/null", O_WRONLY);
    int null_fd = open("/dev/null", O_WRONLY);
    saved_fds[0] = dup(1);
    saved_fds[1] = dup(2);
    bool ok = out_fd >= 0 && null_fd >= 0 && saved_fds[0] >= 0 && saved_fds[1] >= 0;
    if (ok) {
        dup2(out_fd, 1);
        dup2(null_fd, 2);
    } else {
        for (int i = 0; i < 2; i++)
            if (saved_fds[i] >= 0) close(saved_fds[i]);
        saved_fds[0] = saved_fds[1] = -1;
    }
    if (out_fd >= 0) close(out_fd);
    if (null_fd >= 0) close(null_fd);
    return ok;
}

static void quiet_end(void)
{
    if (saved_fds[0] < 0) return;
    fflush(stdout);
    fflush(stderr);
    dup2(saved_fds[0], 1);
    dup2(saved_fds[1], 2);
    close(saved_fds[0]);
    close(saved_fds[1]);
    saved_fds[0] = saved_fds[1] = -1;
}

static int run_quietly_opt(const char *case_dir, const char *out_dir, bool fwd_only)
{
    const linseq_exec ex = {0};
    quiet_begin(NULL);
    int rc = cmd_run(case_dir, out_dir, &ex, fwd_only);
    quiet_end();
    return rc;
}

static int run_quietly(const char *case_dir, const char *out_dir)
{
    return run_quietly_opt(case_dir, out_dir, false);
}

/* cmd_check on one folder; *last gets the closing line ("N cases: N passed, N failed; N files:
 * N passed, N failed, N skipped"). */
static int check_captured(const char *dir, bool fwd_only, char *last, size_t n)
{
    const linseq_exec ex = {0};
    char *out_path = path_in(root, "check_stdout.txt");
    last[0] = '\0';
    if (!quiet_begin(out_path)) return -1;
    char *dirs[1] = {(char *)dir};
    int rc = cmd_check(1, dirs, &ex, fwd_only);
    quiet_end();
    FILE *f = fopen(out_path, "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
        size_t k = strlen(line) < n ? strlen(line) : n - 1;
        memcpy(last, line, k);
        last[k] = '\0';
    }
    if (f) fclose(f);
    last[strcspn(last, "\n")] = '\0';
    return rc;
}

/* A float32 file's shape is SHAPE. */
static bool file_has_shape(const char *path, int ndim, const int64_t *shape)
{
    npy_array a;
    char err[512];
    bool ok = npy_read(path, &a, err, sizeof err) && a.dtype == NPY_F32 && a.ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = a.shape[d] == shape[d];
    npy_free(&a);
    return ok;
}

/* The bytes of a whole (small) file; "" when it cannot be read. */
static const char *file_bytes(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(buf, 1, n - 1, f) : 0;
    if (f) fclose(f);
    buf[got] = '\0';
    for (size_t i = 0; i < got; i++) buf[i] = buf[i] ? buf[i] : '\1'; /* comparable as text */
    return buf;
}

static const char *const conv_files[5] = {"y.npy", "conv_state_out.npy", "dx.npy", "dweight.npy",
                                          "dbias.npy"};

/* OUT holds the complete set of a run of CASE_DIR. A second run that fails on its second
 * file leaves that set untouched (not one file removed or replaced, no temporary left); a
 * run with --fwd-only removes the earlier gradients with the outputs it replaces, so the
 * folder never holds a mix of two runs. */
static void test_rerun_outputs(const char *case_dir, const char *out_arg)
{
    static char out[320]; /* out_arg may be one of path_in's reused buffers */
    snprintf(out, sizeof out, "%s", out_arg);
    static char before[5][1024], now[1024];
    for (int i = 0; i < 5; i++) file_bytes(path_in(out, conv_files[i]), before[i], sizeof now);
    /* other inputs, so that a replaced file would differ */
    const float x2[6] = {2, 1, -3, 0.5f, 4, -1};
    write_f32(path_in(case_dir, "x.npy"), 3, (const int64_t[]){1, 3, 2}, x2);

    char blocker[512], saved[512];
    snprintf(blocker, sizeof blocker, "%s", path_in(out, "conv_state_out.npy"));
    snprintf(saved, sizeof saved, "%s", path_in(root, "saved_state.npy"));
    CHECK(rename(blocker, saved) == 0 && mkdir(blocker, 0777) == 0, "set up the blocker");
    CHECK(run_quietly(case_dir, out) == LS_EXIT_ERROR, "run with a blocked second file succeeded");
    for (int i = 0; i < 5; i++)
        if (i != 1)
            CHECK(strcmp(file_bytes(path_in(out, conv_files[i]), now, sizeof now), before[i]) == 0,
                  "the failed run removed or changed the earlier %s", conv_files[i]);
    CHECK(count_entries(out) == 5, "%s holds %d entries after the failed run, expected 5", out,
          count_entries(out));
    CHECK(rmdir(blocker) == 0 && rename(saved, blocker) == 0, "remove the blocker");

    /* --fwd-only over the full set: new outputs, and no gradient of the earlier run beside them */
    CHECK(run_quietly_opt(case_dir, out, true) == LS_EXIT_OK, "run --fwd-only over a set failed");
    CHECK(strcmp(file_bytes(path_in(out, "y.npy"), now, sizeof now), before[0]) != 0,
          "y.npy was not replaced");
    CHECK(count_entries(out) == 2 && !exists(path_in(out, "dx.npy")),
          "a gradient of the earlier run is left beside the new outputs (%d entries)",
          count_entries(out));
    write_f32(path_in(case_dir, "x.npy"), 3, (const int64_t[]){1, 3, 2}, conv_x);
}

/* The output folder is the case folder itself (by any spelling, a link included): refused
 * before anything is written, and the reference files keep their bytes. */
static void test_run_into_case(void)
{
    char *dir = make_conv_case("case_self");
    char link[512], dot[512];
    snprintf(link, sizeof link, "%s", path_in(root, "case_self_link"));
    snprintf(dot, sizeof dot, "%s", path_in(dir, "."));
    CHECK(symlink(dir, link) == 0, "symlink %s", link);
    const char *spellings[3] = {dir, dot, link};
    static char before[1024], now[1024];
    file_bytes(path_in(dir, "x.npy"), before, sizeof before);
    for (int i = 0; i < 3; i++) {
        CHECK(run_quietly(dir, spellings[i]) == LS_EXIT_ERROR, "run into %s succeeded",
              spellings[i]);
        CHECK(count_entries(dir) == 5 && !exists(path_in(dir, "y.npy")),
              "run into %s wrote into the case folder (%d entries)", spellings[i],
              count_entries(dir));
        CHECK(strcmp(file_bytes(path_in(dir, "x.npy"), now, sizeof now), before) == 0,
              "x.npy changed");
    }
    /* a folder of cases run into itself: each case would write into its own folder */
    char *cases = make_dir("cases_self");
    CHECK(rename(dir, path_in(cases, "a")) == 0, "move the case");
    CHECK(run_quietly(cases, cases) == LS_EXIT_ERROR, "run of a folder into itself succeeded");
    CHECK(count_entries(path_in(cases, "a")) == 5, "the case in %s was written into", cases);
}

static void test_run_outputs(void)
{
    char *dir = make_conv_case("case_run");

    /* an output folder below a regular file cannot exist: error, and nothing is created */
    char *file = path_in(root, "plainfile");
    write_text(file, "not a folder\n");
    char *bad = path_in(root, "plainfile/out");
    CHECK(run_quietly(dir, bad) == LS_EXIT_ERROR, "run into %s succeeded", bad);
    CHECK(!exists(bad), "%s exists", bad);
    struct stat st;
    CHECK(stat(file, &st) == 0 && st.st_size == 13, "the regular file was modified");

    /* a folder blocking the second output: the first one is withdrawn, no temporary left */
    char *out = make_dir("out_blocked");
    CHECK(mkdir(path_in(out, "conv_state_out.npy"), 0777) == 0, "mkdir blocker");
    CHECK(run_quietly(dir, out) == LS_EXIT_ERROR, "run with a blocked output succeeded");
    CHECK(count_entries(out) == 1 && !exists(path_in(out, "y.npy")),
          "partial output left in %s (%d entries)", out, count_entries(out));

    /* a folder blocking a gradient: the outputs written before it are withdrawn too */
    out = make_dir("out_blocked_grad");
    CHECK(mkdir(path_in(out, "dbias.npy"), 0777) == 0, "mkdir blocker");
    CHECK(run_quietly(dir, out) == LS_EXIT_ERROR, "run with a blocked gradient succeeded");
    CHECK(count_entries(out) == 1, "partial output left in %s (%d entries)", out,
          count_entries(out));

    /* the normal case: exactly the listed outputs and gradients, complete, with the shapes
     * the sizes imply, in a folder created on demand */
    static char fresh[320];
    snprintf(fresh, sizeof fresh, "%s/out_new/nested", root);
    CHECK(run_quietly(dir, fresh) == LS_EXIT_OK, "run into a new folder failed");
    CHECK(count_entries(fresh) == 5, "%s holds %d entries, expected 5", fresh,
          count_entries(fresh));
    const struct {
        const char *file;
        int ndim;
        int64_t shape[3];
    } want[5] = {{"y.npy", 3, {1, 3, 2}},
                 {"conv_state_out.npy", 3, {1, 2, 3}},
                 {"dx.npy", 3, {1, 3, 2}},
                 {"dweight.npy", 2, {2, 4}},
                 {"dbias.npy", 1, {2}}};
    for (int i = 0; i < 5; i++)
        CHECK(file_has_shape(path_in(fresh, want[i].file), want[i].ndim, want[i].shape),
              "%s/%s is unreadable or has the wrong shape", fresh, want[i].file);

    /* --fwd-only: the outputs only */
    char *fwd = path_in(root, "out_fwd");
    CHECK(run_quietly_opt(dir, fwd, true) == LS_EXIT_OK, "run --fwd-only failed");
    CHECK(count_entries(fwd) == 2 && exists(path_in(fwd, "y.npy")) &&
              !exists(path_in(fwd, "dx.npy")),
          "run --fwd-only wrote %d files", count_entries(fwd));

    /* re-running into a folder that holds a complete earlier set */
    test_rerun_outputs(dir, fresh);

    /* a case the loader rejects writes nothing either */
    char *broken = make_conv_case("case_run_broken");
    unlink(path_in(broken, "x.npy"));
    char *out2 = path_in(root, "out_broken");
    CHECK(run_quietly(broken, out2) == LS_EXIT_ERROR && !exists(out2), "broken case ran");
}

/* check compares the gradients like the outputs; --fwd-only counts them as skipped. */
static void test_check_grads(void)
{
    char *dir = make_conv_case("case_check"), last[256];
    /* the case's own results as its references: everything passes */
    static char out[320];
    snprintf(out, sizeof out, "%s/case_check_out", root);
    CHECK(run_quietly(dir, out) == LS_EXIT_OK, "run of the case failed");
    for (int i = 0; i < 5; i++)
        CHECK(rename(path_in(out, conv_files[i]), path_in(dir, conv_files[i])) == 0,
              "move %s into the case", conv_files[i]);
    int rc = check_captured(dir, false, last, sizeof last);
    CHECK(rc == LS_EXIT_OK &&
              strcmp(last, "1 case: 1 passed, 0 failed; 5 files: 5 passed, 0 failed, 0 skipped") ==
                  0,
          "check: rc %d, \"%s\"", rc, last);
    rc = check_captured(dir, true, last, sizeof last);
    CHECK(rc == LS_EXIT_OK &&
              strcmp(last, "1 case: 1 passed, 0 failed; 5 files: 2 passed, 0 failed, 3 skipped") ==
                  0,
          "check --fwd-only: rc %d, \"%s\"", rc, last);

    /* a wrong gradient reference fails check, and only without --fwd-only */
    const float wrong[2] = {1, 1};
    write_f32(path_in(dir, "dbias.npy"), 1, (const int64_t[]){2}, wrong);
    rc = check_captured(dir, false, last, sizeof last);
    CHECK(rc == LS_EXIT_FAIL &&
              strcmp(last, "1 case: 0 passed, 1 failed; 5 files: 4 passed, 1 failed, 0 skipped") ==
                  0,
          "check with a wrong dbias: rc %d, \"%s\"", rc, last);
    rc = check_captured(dir, true, last, sizeof last);
    CHECK(rc == LS_EXIT_OK &&
              strcmp(last, "1 case: 1 passed, 0 failed; 5 files: 2 passed, 0 failed, 3 skipped") ==
                  0,
          "check --fwd-only with a wrong dbias: rc %d, \"%s\"", rc, last);

    /* a gradient reference of the wrong shape fails like a wrong output */
    write_f32(path_in(dir, "dbias.npy"), 1, (const int64_t[]){1}, wrong);
    rc = check_captured(dir, false, last, sizeof last);
    CHECK(rc == LS_EXIT_FAIL &&
              strcmp(last, "1 case: 0 passed, 1 failed; 5 files: 4 passed, 1 failed, 0 skipped") ==
                  0,
          "check with a wrong-shape dbias: rc %d, \"%s\"", rc, last);

    /* a missing gradient reference: the case cannot be checked */
    unlink(path_in(dir, "dbias.npy"));
    rc = check_captured(dir, false, last, sizeof last);
    CHECK(rc == LS_EXIT_ERROR, "check with no dbias.npy: rc %d, \"%s\"", rc, last);
}

/* ---------------------------------------------------------------------------------- */
/* The comparison rule                                                                */
/* ---------------------------------------------------------------------------------- */

static npy_array view(float *data, int64_t n)
{
    npy_array a = {.dtype = NPY_F32, .ndim = 1, .count = (size_t)n, .data = data};
    a.shape[0] = n;
    return a;
}

static void test_compare(void)
{
    const cmp_tol tol = {1e-4, 0.999999, 1e-6};
    float ref[4] = {1, -2, 3, -4}, cand[4];
    npy_array R = view(ref, 4), C = view(cand, 4);
    cmp_result r;

    memcpy(cand, ref, sizeof ref);
    cand[3] = -4.0003f; /* 3e-4 / 4 = 7.5e-5 relative to max|ref| */
    cmp_arrays(&C, &R, &tol, &r);
    CHECK(r.pass && fabs(r.max_rel_err - fabs((double)cand[3] + 4.0) / 4.0) < 1e-15,
          "within tolerance: %g %s", r.max_rel_err, r.reason);
    cand[3] = -4.001f;
    cmp_arrays(&C, &R, &tol, &r);
    CHECK(!r.pass && has(r.reason, "max_rel_err"), "beyond tolerance passed");
    cand[3] = NAN;
    cmp_arrays(&C, &R, &tol, &r);
    CHECK(!r.pass && has(r.reason, "non-finite"), "NaN passed");

    npy_array C3 = view(cand, 3);
    cmp_arrays(&C3, &R, &tol, &r);
    CHECK(!r.pass && has(r.reason, "shape [3] != reference [4]"), "shape: %s", r.reason);

    /* all-zero reference: absolute floor, cosine unused */
    float zero[4] = {0};
    npy_array Z = view(zero, 4);
    memset(cand, 0, sizeof cand);
    cand[0] = 9e-7f;
    cmp_arrays(&C, &Z, &tol, &r);
    CHECK(r.pass, "under the floor: %s", r.reason);
    cand[0] = 2e-6f;
    cmp_arrays(&C, &Z, &tol, &r);
    CHECK(!r.pass && has(r.reason, "abs floor"), "over the floor passed");

    /* a zero candidate against a non-zero reference: cosine 0 */
    memset(cand, 0, sizeof cand);
    cmp_arrays(&C, &R, &tol, &r);
    CHECK(!r.pass && r.cos == 0.0, "zero candidate cos %g", r.cos);

    /* direction wrong but max error small: only the cosine catches it */
    float big[4] = {1000, 1, 1, 1}, flip[4] = {1000, -1, -1, -1};
    npy_array Bg = view(big, 4), Fl = view(flip, 4);
    const cmp_tol loose = {1e-2, 0.999999999, 1e-6};
    cmp_arrays(&Fl, &Bg, &loose, &r);
    CHECK(!r.pass && has(r.reason, "cos"), "cosine not applied: %s", r.reason);

    /* tolerances from meta.json, with the judge's defaults for what is missing */
    cJSON *meta = cJSON_Parse("{\"tolerance\": {\"o\": {\"max_rel_err\": 0.5}},"
                              " \"tolerance_abs_floor\": 1e-3}");
    cmp_tol t;
    char err[256];
    CHECK(cmp_tolerance(meta, "o", false, &t, err, sizeof err) && t.max_rel_err == 0.5 &&
              t.min_cos == 0.999999 && t.abs_floor == 1e-3,
          "tolerance for o");
    CHECK(cmp_tolerance(meta, "dq", true, &t, err, sizeof err) && t.max_rel_err == 1e-3 &&
              t.min_cos == 0.99999,
          "default gradient tolerance");
    cJSON_Delete(meta);
}

/* The entries of folder dir (but . and ..). */
static int entries_in(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    if (d) closedir(d);
    return n;
}

/* A child writes a file's temporary, then gets `sig` (with the signal held first when
 * deferred, then released after writing a marker file). Returns how it ended (wait status). */
static int signalled_writer(const char *dir, int sig, bool deferred)
{
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        const float data[3] = {1, 2, 3};
        const int64_t shape[1] = {3};
        char err[256];
        char *tmp = npy_write_f32_temp(path_in(dir, "x.npy"), data, 1, shape, err, sizeof err);
        if (!tmp || npy_temps_count() != 1) _exit(3);
        if (deferred) npy_temps_defer(true);
        raise(sig);
        if (!deferred) _exit(4); /* the signal should have ended the process */
        write_text(path_in(dir, "held"), "the signal waited");
        npy_temps_forget(tmp); /* as case_write_outputs: the fate of the file is settled... */
        rename(tmp, path_in(dir, "x.npy"));
        npy_temps_defer(false); /* ...and the held signal ends the process now */
        _exit(5);
    }
    int ws = 0;
    if (pid < 0 || waitpid(pid, &ws, 0) != pid) return -1;
    return ws;
}

/* SIGINT or SIGTERM while a run writes its outputs: the hidden temporary files are removed
 * and the process ends by the signal (its exit status says so); while files are renamed into
 * place the signal waits for the renames to finish. */
static void test_signal_removes_temps(void)
{
    static const int sigs[] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "signal_%d", sigs[i]);
        const char *dir = make_dir(name);
        const int ws = signalled_writer(dir, sigs[i], false);
        CHECK(WIFSIGNALED(ws) && WTERMSIG(ws) == sigs[i],
              "signal %d while writing: the child did not end by it (status 0x%x)", sigs[i], ws);
        CHECK(entries_in(dir) == 0, "signal %d while writing left %d files in the output folder",
              sigs[i], entries_in(dir));
        snprintf(name, sizeof name, "held_%d", sigs[i]);
        const char *held = make_dir(name);
        const int ws2 = signalled_writer(held, sigs[i], true);
        CHECK(WIFSIGNALED(ws2) && WTERMSIG(ws2) == sigs[i] && exists(path_in(held, "held")) &&
                  exists(path_in(held, "x.npy")) && entries_in(held) == 2,
              "signal %d while renaming: not held until the renames ended (status 0x%x, %d files)",
              sigs[i], ws2, entries_in(held));
    }
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/linseq_test_npy.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 2;
    }
    test_round_trip();
    test_accepted_variants();
    test_rejections();
    test_not_regular_files();
    test_write_failure();
    test_case_valid();
    test_case_grads_by_hand();
    test_case_rejections();
    test_run_outputs();
    test_run_into_case();
    test_check_grads();
    test_compare();
    test_signal_removes_temps();
    remove_tree(root);
    return tu_finish("test_npy");
}
