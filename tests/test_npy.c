/* The CLI's file handling: .npy round trips and every rejection the reader promises (each
 * with a message naming the file and the fault), the case loader's refusal of broken case
 * folders, `run` leaving no partial file behind, and the comparison rule's edge cases. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tools/linseq/case.h"
#include "../tools/linseq/commands.h"
#include "../tools/linseq/compare.h"
#include "../tools/linseq/npy.h"
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

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

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
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}",
         "unexpected key 'x'", "extra key"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}",
         "appears twice", "duplicate key"},
        {"{'descr': '<f4', 'fortran_order': Nope, 'shape': (2, 3), }", "True or False",
         "bad bool"},
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
    " \"grads\": [\"dx\", \"dweight\", \"dbias\"]}\n";

static const float conv_x[6] = {1, -2, 0.5f, 3, -1, 0.25f};
static const float conv_w[8] = {0.1f, 0.2f, 0.3f, 0.4f, -1, 0.5f, 2, 1};
static const float conv_b[2] = {0.5f, -0.25f};

/* A valid causal_conv1d case; the tests then break one thing at a time. */
static char *make_conv_case(const char *name)
{
    char *dir = make_dir(name);
    write_text(path_in(dir, "meta.json"), conv_meta);
    write_f32(path_in(dir, "x.npy"), 3, (const int64_t[]){1, 3, 2}, conv_x);
    write_f32(path_in(dir, "weight.npy"), 2, (const int64_t[]){2, 4}, conv_w);
    write_f32(path_in(dir, "bias.npy"), 1, (const int64_t[]){2}, conv_b);
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
    CHECK(c.op == CASE_OP_CONV1D && c.n_outputs == 2 && c.n_grads == 3 && c.n_inputs == 3,
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

static void test_case_rejections(void)
{
    char *dir = make_conv_case("case_missing");
    unlink(path_in(dir, "bias.npy"));
    expect_load_fail(dir, "bias.npy", "cannot open", "missing input file");

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

/* cmd_run with its stdout and stderr discarded: the failures below are the expected ones. */
static int run_quietly(const char *case_dir, const char *out_dir)
{
    const linseq_exec ex = {0};
    fflush(stdout);
    fflush(stderr);
    int saved_out = dup(1), saved_err = dup(2), null_fd = open("/dev/null", O_WRONLY);
    if (saved_out < 0 || saved_err < 0 || null_fd < 0) {
        if (saved_out >= 0) close(saved_out);
        if (saved_err >= 0) close(saved_err);
        if (null_fd >= 0) close(null_fd);
        return cmd_run(case_dir, out_dir, &ex);
    }
    dup2(null_fd, 1);
    dup2(null_fd, 2);
    int rc = cmd_run(case_dir, out_dir, &ex);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
    close(null_fd);
    return rc;
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

    /* the normal case: exactly the listed outputs, complete, in a folder created on demand */
    char *fresh = path_in(root, "out_new/nested");
    CHECK(run_quietly(dir, fresh) == LS_EXIT_OK, "run into a new folder failed");
    CHECK(count_entries(fresh) == 2, "%s holds %d entries, expected 2", fresh,
          count_entries(fresh));
    npy_array y;
    char err[512];
    bool ok = npy_read(path_in(fresh, "y.npy"), &y, err, sizeof err);
    CHECK(ok && y.ndim == 3 && y.shape[0] == 1 && y.shape[1] == 3 && y.shape[2] == 2,
          "y.npy: %s", ok ? "wrong shape" : err);
    npy_free(&y);

    /* a case the loader rejects writes nothing either */
    char *broken = make_conv_case("case_run_broken");
    unlink(path_in(broken, "x.npy"));
    char *out2 = path_in(root, "out_broken");
    CHECK(run_quietly(broken, out2) == LS_EXIT_ERROR && !exists(out2), "broken case ran");
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
          "within tolerance: %g %s",
          r.max_rel_err, r.reason);
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
    test_write_failure();
    test_case_valid();
    test_case_rejections();
    test_run_outputs();
    test_compare();
    remove_tree(root);
    return tu_finish("test_npy");
}
