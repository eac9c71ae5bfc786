/* The lists kept by hand outside the C tests must cover every op of the op table, as the
 * table-driven consumers do by construction; each missing op is named:
 *   - the generated reference cases (tests/refgen: a float64 definition and cases per op, in
 *     its own op_*.py, which `linseq check` and the judge compare with): some case folder
 *     of each op;
 *   - the fuzz corpus's case seeds (fuzz/make_seeds.py: one small case per op), so that the
 *     case-loader target starts from a valid case of every op;
 *   - the file names that target can write (fuzz/case_files.h): every input and upstream
 *     gradient of every op, and cu_seqlens;
 * and none of them may name an op the table does not have.
 *
 * The reference cases are those `make` generates beside the tests (BUILD/refcases for
 * BUILD/tests/test_op_coverage), or LINSEQ_REFCASES; the seeds are read from fuzz/corpus/case
 * under the working folder (make runs the tests from the repository's root). */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../fuzz/case_files.h"
#include "optable/optable.h"
#include "testutil.h"

enum { MAX_OPS = 64 };

/* How many cases (or seeds) name each op of the table; unknown ones are reported. */
typedef struct tally {
    const char *what; /* "reference case", "fuzz seed" */
    int count[MAX_OPS];
} tally;

static void count_op(tally *t, const char *op, const char *where)
{
    int n;
    const ls_op *const *ops = ls_ops(&n);
    for (int i = 0; i < n && i < MAX_OPS; i++)
        if (op && strcmp(ops[i]->name, op) == 0) {
            t->count[i]++;
            return;
        }
    CHECK(0, "%s %s names op \"%s\", which the op table does not have", t->what, where,
          op ? op : "(none)");
}

static void check_every_op(const tally *t, const char *how_to_add)
{
    int n;
    const ls_op *const *ops = ls_ops(&n);
    CHECK(n <= MAX_OPS, "more than %d ops", MAX_OPS);
    for (int i = 0; i < n && i < MAX_OPS; i++)
        CHECK(t->count[i] > 0, "op %s has no %s: %s", ops[i]->name, t->what, how_to_add);
}

/* The whole of a small file, NUL-terminated (NULL when it cannot be read). */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long size = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (f && size >= 0 && size < (1L << 24) && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)size + 1)) && fread(buf, 1, (size_t)size, f) == (size_t)size) {
        buf[size] = '\0';
        *len = (size_t)size;
    } else {
        free(buf);
        buf = NULL;
    }
    if (f) fclose(f);
    return buf;
}

/* The "op" of a meta.json text (a fresh string, or NULL). */
static char *op_of_meta(const char *text, size_t len)
{
    cJSON *meta = cJSON_ParseWithLength(text, len);
    const char *op = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "op"));
    char *copy = op ? strdup(op) : NULL;
    cJSON_Delete(meta);
    return copy;
}

/* Every case folder (one holding meta.json) of dir. */
static void count_reference_cases(const char *dir, tally *t)
{
    DIR *d = opendir(dir);
    CHECK(d != NULL,
          "no reference cases at %s: `make test-run` generates them (or set "
          "LINSEQ_REFCASES)",
          dir);
    int folders = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[4096];
        size_t len;
        const int n = snprintf(path, sizeof path, "%s/%s/meta.json", dir, e->d_name);
        char *text = e->d_name[0] != '.' && n < (int)sizeof path ? slurp(path, &len) : NULL;
        if (!text) continue;
        char *op = op_of_meta(text, len);
        count_op(t, op, e->d_name);
        folders++;
        free(op);
        free(text);
    }
    if (d) closedir(d);
    CHECK(!d || folders > 0, "no case folder in %s", dir);
}

/* A seed of the case-loader target: an options byte, then records (tag, 16-bit length,
 * payload); its meta.json is the record whose tag names it and is not synthesised. */
static void count_seed(const char *path, const char *name, tally *t)
{
    size_t len, at = 1;
    char *data = slurp(path, &len);
    CHECK(data != NULL, "cannot read %s", path);
    bool found = false;
    while (data && !found && at + 3 <= len) {
        const unsigned tag = (unsigned char)data[at];
        size_t n = (size_t)(unsigned char)data[at + 1] | (size_t)(unsigned char)data[at + 2] << 8;
        at += 3;
        if (n > len - at) n = len - at;
        if (!(tag & 0x80) && strcmp(fz_case_file(tag), "meta.json") == 0) {
            char *op = op_of_meta(data + at, n);
            count_op(t, op, name);
            free(op);
            found = true;
        }
        at += n;
    }
    CHECK(!data || found, "fuzz seed %s has no meta.json record", name);
    free(data);
}

/* The hand-made seeds (seed-*) of the case target's corpus. */
static void count_fuzz_seeds(const char *dir, tally *t)
{
    DIR *d = opendir(dir);
    CHECK(d != NULL, "no fuzz corpus at %s (run the test from the repository's root)", dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[4096];
        if (strncmp(e->d_name, "seed-", 5) != 0 ||
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path)
            continue;
        count_seed(path, e->d_name, t);
    }
    if (d) closedir(d);
}

static bool is_case_file(const char *name)
{
    for (size_t i = 0; i < FZ_CASE_FILES; i++)
        if (strcmp(fz_case_files[i], name) == 0) return true;
    return false;
}

/* Every file a case of an op can read has a tag in the case target's list. */
static void check_case_files(void)
{
    int n;
    const ls_op *const *ops = ls_ops(&n);
    CHECK(FZ_CASE_FILES <= 128 && FZ_CASE_CORPUS_FILES <= FZ_CASE_FILES,
          "fuzz/case_files.h: %zu names, but a tag has 7 bits", (size_t)FZ_CASE_FILES);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < ops[i]->n_tensors; k++) {
            const ls_tensor_desc *t = &ops[i]->tensors[k];
            if (t->role != LS_ROLE_INPUT && t->role != LS_ROLE_UPSTREAM) continue;
            CHECK(is_case_file(t->name),
                  "fuzz/case_files.h lacks \"%s\", a file of op %s: append it (and regenerate "
                  "the seeds with fuzz/make_seeds.py)",
                  t->name, ops[i]->name);
        }
        CHECK(!ops[i]->varlen || is_case_file("cu_seqlens"), "fuzz/case_files.h: cu_seqlens");
    }
}

/* BUILD/refcases for BUILD/tests/<this test>. */
static void refcases_dir(const char *argv0, char *buf, size_t n)
{
    const char *env = getenv("LINSEQ_REFCASES");
    const char *slash = strrchr(argv0, '/');
    if (env && *env)
        snprintf(buf, n, "%s", env);
    else if (slash)
        snprintf(buf, n, "%.*s/../refcases", (int)(slash - argv0), argv0);
    else
        snprintf(buf, n, "../refcases");
}

int main(int argc, char **argv)
{
    (void)argc;
    char dir[4096];
    refcases_dir(argv[0], dir, sizeof dir);
    tally cases = {.what = "reference case"}, seeds = {.what = "fuzz seed"};
    count_reference_cases(dir, &cases);
    check_every_op(&cases, "write its definition and cases as tests/refgen/op_<name>.py");
    count_fuzz_seeds("fuzz/corpus/case", &seeds);
    check_every_op(&seeds, "add a small case of it to fuzz/make_seeds.py and run it");
    check_case_files();
    return tu_finish("test_op_coverage");
}
