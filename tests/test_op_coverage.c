/* The lists kept outside the C tests must cover every op of the op table, as the
 * table-driven consumers do by construction; each missing op is named:
 *   - the generated reference cases (tests/refgen: a float64 definition and cases per op, in
 *     its own op_*.py, which `linseq check` and the judge compare with): some case folder
 *     of each op;
 *   - the case-loader fuzz target reaches every op without a seed per op: an input of two
 *     bytes picks an op of ls_ops() by its index and runs the case table_case.h makes of it
 *     from the table (and every start of the target runs each once). Checked here: that
 *     case loads, and runs forward (and backward), for every op, and a byte indexes every
 *     op;
 *   - the file names that target can write (fuzz/case_files.h: a fixed list, then the
 *     table's other input and upstream names): every input and upstream gradient of every
 *     op, and cu_seqlens, within the 7-bit tag;
 * and none of the reference cases or the hand-made seeds (fuzz/make_seeds.py, seed-*) may
 * name an op the table does not have.
 *
 * The reference cases are those `make` generates beside the tests (BUILD/refcases for
 * BUILD/tests/test_op_coverage), or LINSEQ_REFCASES; the corpus is read from
 * fuzz/corpus/case under the working folder (make runs the tests from the repository's
 * root). */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../fuzz/case_files.h"
#include "../fuzz/table_case.h"
#include "../tools/linseq/case.h"
#include "../tools/linseq/commands.h"
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

/* The hand-made seeds (seed-*) of the case target's corpus name ops of the table. (A seed
 * per op is no longer needed: see check_table_cases.) */
static void check_fuzz_corpus(const char *dir, tally *t)
{
    DIR *d = opendir(dir);
    CHECK(d != NULL, "no fuzz corpus at %s (run the test from the repository's root)", dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[4096];
        if (e->d_name[0] == '.' ||
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path)
            continue;
        if (strncmp(e->d_name, "seed-", 5) == 0) count_seed(path, e->d_name, t);
    }
    if (d) closedir(d);
}

static void remove_files(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[4096];
        if (e->d_name[0] != '.' &&
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
            unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* Every op's table-made case (what the case target runs for an op index) loads and runs;
 * the index is a byte modulo the op count, so every op is reached when the count fits. */
static void check_table_cases(void)
{
    int n;
    const ls_op *const *ops = ls_ops(&n);
    CHECK(n >= 1 && n <= 256, "%d ops: fuzz_case.c picks one by a byte", n);
    for (int i = 0; i < n; i++) {
        const char *tmp = getenv("TMPDIR");
        char dir[4096], err[2048] = "";
        snprintf(dir, sizeof dir, "%s/test_op_coverage.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            CHECK(0, "mkdtemp %s", dir);
            return;
        }
        ls_case c;
        const bool written = fz_table_case_write(ops[i], dir, 7, err, sizeof err);
        CHECK(written, "op %s: the table-made case: %s", ops[i]->name, err);
        const bool loaded = written && case_load(dir, &c, err, sizeof err);
        CHECK(!written || loaded,
              "op %s: its table-made case (fuzz/table_case.h) does not load: %s", ops[i]->name,
              err);
        if (loaded) {
            CHECK(strcmp(c.op_name, ops[i]->name) == 0 && c.n_outputs >= 1,
                  "op %s: its table-made case loads as %s with %d outputs", ops[i]->name, c.op_name,
                  c.n_outputs);
            const linseq_exec ex = {.mode = LINSEQ_MODE_DEFAULT};
            case_result r;
            const bool ran = case_run(&c, &ex, &r, err, sizeof err) == LS_EXIT_OK;
            CHECK(ran, "op %s: its table-made case does not run: %s", ops[i]->name, err);
            if (ran && ops[i]->backward) {
                const int rc = case_run_backward(&c, &ex, &r, err, sizeof err);
                CHECK(rc == LS_EXIT_OK && r.n_grads == c.n_grads && c.n_grads >= 1,
                      "op %s: the backward of its table-made case: %s", ops[i]->name, err);
            }
            if (ran) case_result_free(&r);
            case_free(&c);
        }
        remove_files(dir);
    }
}

static bool is_case_file(const char *name)
{
    size_t n;
    const char *const *list = fz_case_file_list(&n, NULL);
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i], name) == 0) return true;
    return false;
}

/* Every file a case of an op can read has a tag in the case target's list: by construction
 * (case_files.h adds the table's names), unless the list outgrows the 7-bit tag. */
static void check_case_files(void)
{
    int n;
    const ls_op *const *ops = ls_ops(&n);
    size_t count, dropped;
    fz_case_file_list(&count, &dropped);
    CHECK(dropped == 0 && count <= FZ_CASE_MAX_FILES &&
              FZ_CASE_CORPUS_FILES <= FZ_CASE_LEGACY_FILES && FZ_CASE_LEGACY_FILES <= count,
          "fuzz/case_files.h: %zu names and %zu more from the op table, but a tag has 7 bits",
          count, dropped);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < ops[i]->n_tensors; k++) {
            const ls_tensor_desc *t = &ops[i]->tensors[k];
            if (t->role != LS_ROLE_INPUT && t->role != LS_ROLE_UPSTREAM) continue;
            CHECK(is_case_file(t->name), "fuzz/case_files.h's list lacks \"%s\", a file of op %s",
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
    check_fuzz_corpus("fuzz/corpus/case", &seeds);
    check_table_cases();
    check_case_files();
    return tu_finish("test_op_coverage");
}
