/* The comparison rule, and `linseq check`, which applies it to every output and gradient of
 * every case. */
#include "compare.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "case.h"
#include "commands.h"

static bool tol_field(const cJSON *obj, const char *key, double *out, const char *file, char *err,
                      size_t err_size)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return true;
    if (!cJSON_IsNumber(v)) {
        snprintf(err, err_size, "meta.json: tolerance %s%s%s is not a number", file ? file : "",
                 file ? "." : "", key);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

bool cmp_tolerance(const cJSON *meta, const char *file, bool is_grad, cmp_tol *tol, char *err,
                   size_t err_size)
{
    tol->max_rel_err = is_grad ? 1e-3 : 1e-4;
    tol->min_cos = is_grad ? 0.99999 : 0.999999;
    tol->abs_floor = 1e-6;
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(meta, "tolerance");
    const cJSON *mine = cJSON_IsObject(all) ? cJSON_GetObjectItemCaseSensitive(all, file) : NULL;
    if (cJSON_IsObject(mine) &&
        (!tol_field(mine, "max_rel_err", &tol->max_rel_err, file, err, err_size) ||
         !tol_field(mine, "min_cos", &tol->min_cos, file, err, err_size)))
        return false;
    return tol_field(meta, "tolerance_abs_floor", &tol->abs_floor, NULL, err, err_size);
}

static bool same_shape(const npy_array *a, const npy_array *b)
{
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

__attribute__((format(printf, 2, 3))) static void add_reason(cmp_result *r, const char *fmt, ...)
{
    size_t n = strlen(r->reason);
    if (n && n + 2 < sizeof r->reason) {
        strcpy(r->reason + n, ", ");
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->reason + n, sizeof r->reason - n, fmt, ap);
    va_end(ap);
}

void cmp_arrays(const npy_array *cand, const npy_array *ref, const cmp_tol *tol, cmp_result *r)
{
    memset(r, 0, sizeof *r);
    if (!same_shape(cand, ref)) {
        char cs[160], rs[160];
        npy_shape_text(cand->ndim, cand->shape, cs, sizeof cs);
        npy_shape_text(ref->ndim, ref->shape, rs, sizeof rs);
        add_reason(r, "shape %s != reference %s", cs, rs);
        r->max_abs_err = r->max_rel_err = INFINITY;
        return;
    }
    r->shape_ok = true;
    const float *c = cand->data, *x = ref->data;
    bool finite = true, ref_finite = true;
    double max_abs = 0.0, mx = 0.0, dot = 0.0, sc = 0.0, sr = 0.0;
    for (size_t i = 0; i < ref->count; i++) {
        double ci = c[i], ri = x[i];
        finite &= isfinite(ci) != 0;
        ref_finite &= isfinite(ri) != 0;
        double e = fabs(ci - ri);
        if (e > max_abs || e != e) max_abs = e;
        if (fabs(ri) > mx) mx = fabs(ri);
        dot += ci * ri;
        sc += ci * ci;
        sr += ri * ri;
    }
    double nc = sqrt(sc), nr = sqrt(sr);
    r->cos = nc > 0.0 && nr > 0.0 ? dot / (nc * nr) : (nc == nr ? 1.0 : 0.0);
    r->max_abs_err = max_abs;
    r->ref_max_abs = mx;
    r->max_rel_err = mx > 0.0 ? max_abs / mx : max_abs;
    if (!finite) {
        add_reason(r, "non-finite values");
    } else if (!ref_finite) {
        add_reason(r, "non-finite reference");
    } else if (mx == 0.0) {
        /* An all-zero reference has no scale: compare absolutely, the cosine is undefined. */
        r->pass = max_abs <= tol->abs_floor;
        if (!r->pass) add_reason(r, "max|cand| %.2e > abs floor %.1e", max_abs, tol->abs_floor);
    } else {
        bool rel_ok = r->max_rel_err <= tol->max_rel_err, cos_ok = r->cos >= tol->min_cos;
        r->pass = rel_ok && cos_ok;
        if (!rel_ok) add_reason(r, "max_rel_err > %.1e", tol->max_rel_err);
        if (!cos_ok) add_reason(r, "cos %.9f < %.9f", r->cos, tol->min_cos);
    }
}

/* ---------------------------------------------------------------------------------- */
/* linseq check                                                                        */
/* ---------------------------------------------------------------------------------- */

typedef struct tally {
    int passed, failed, skipped;    /* files */
    int cases_passed, cases_failed; /* cases checked */
    int errors;                     /* cases that could not be checked */
} tally;

typedef struct line_buf {
    char s[4096];
    size_t n;
} line_buf;

__attribute__((format(printf, 2, 3))) static void line_add(line_buf *b, const char *fmt, ...)
{
    if (b->n >= sizeof b->s) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s + b->n, sizeof b->s - b->n, fmt, ap);
    va_end(ap);
    if (k > 0) b->n += (size_t)k < sizeof b->s - b->n ? (size_t)k : sizeof b->s - b->n;
}

static void case_error(const char *name, const char *msg, tally *t)
{
    fflush(stdout);
    fprintf(stderr, "linseq check: %s\n", msg);
    printf("ERROR  %s  (the reason is on stderr)\n", name);
    t->errors++;
}

/* Compares a computed output or gradient with its reference file; false on an unusable
 * reference or meta.json. */
static bool check_file(const ls_case *c, const case_tensor *cand, bool is_grad, line_buf *line,
                       tally *t, bool *pass, char *err, size_t err_size)
{
    cmp_tol tol;
    if (!cmp_tolerance(c->meta, cand->name, is_grad, &tol, err, err_size)) return false;
    char *path = case_path(c->dir, cand->name, ".npy");
    if (!path) {
        snprintf(err, err_size, "out of memory");
        return false;
    }
    npy_array ref;
    bool ok = npy_read(path, &ref, err, err_size);
    if (ok && ref.dtype != NPY_F32) {
        snprintf(err, err_size, "%s: dtype %s, expected float32", path, npy_dtype_name(ref.dtype));
        ok = false;
    }
    free(path);
    if (ok) {
        cmp_result r;
        cmp_arrays(&cand->arr, &ref, &tol, &r);
        if (r.shape_ok)
            line_add(line, "  %s %.2e", cand->name, r.max_rel_err);
        else
            line_add(line, "  %s -", cand->name);
        if (!r.pass) line_add(line, " (%s)", r.reason);
        *pass &= r.pass;
        if (r.pass)
            t->passed++;
        else
            t->failed++;
    }
    npy_free(&ref);
    return ok;
}

/* A call the library rejected is a failing implementation, not bad input: every file it
 * should have produced counts as failed. */
static void call_failed(const char *what, const char *msg, int n_files, line_buf *line, tally *t,
                        bool *pass)
{
    line_add(line, "  %s: %s", what, msg);
    t->failed += n_files;
    *pass = false;
}

static void check_case(const char *dir, const linseq_exec *exec, bool fwd_only, tally *t)
{
    ls_case c;
    case_result r;
    char err[2048];
    if (!case_load(dir, &c, err, sizeof err)) {
        const char *slash = strrchr(dir, '/');
        case_error(slash && slash[1] ? slash + 1 : dir, err, t);
        return;
    }
    line_buf line = {.n = 0};
    tally mine = {0};
    bool pass = true, ok = true;
    int rc = case_run(&c, exec, &r, err, sizeof err);
    if (rc == LS_EXIT_ERROR) {
        ok = false;
    } else if (rc == LS_EXIT_FAIL) {
        call_failed("forward", err, c.n_outputs, &line, &mine, &pass);
    } else {
        for (int i = 0; ok && i < c.n_outputs; i++)
            ok = check_file(&c, case_output_tensor(&c, &r, i), false, &line, &mine, &pass, err,
                            sizeof err);
    }
    /* The backward does not use the forward's results, so it runs even when that failed. */
    if (ok && fwd_only) {
        mine.skipped += c.n_grads;
    } else if (ok && c.n_grads) {
        rc = case_run_backward(&c, exec, &r, err, sizeof err);
        if (rc == LS_EXIT_ERROR)
            ok = false;
        else if (rc == LS_EXIT_FAIL)
            call_failed("backward", err, c.n_grads, &line, &mine, &pass);
        for (int i = 0; ok && i < r.n_grads; i++)
            ok = check_file(&c, &r.g[i], true, &line, &mine, &pass, err, sizeof err);
    }
    if (!ok) {
        case_error(c.name, err, t);
    } else {
        printf("%s  %s%s", pass ? "PASS" : "FAIL", c.name, line.s);
        if (mine.skipped) printf("  (%d grads skipped)", mine.skipped);
        printf("\n");
        t->passed += mine.passed;
        t->failed += mine.failed;
        t->skipped += mine.skipped;
        if (pass)
            t->cases_passed++;
        else
            t->cases_failed++;
    }
    case_result_free(&r);
    case_free(&c);
}

static bool is_case_dir(const char *dir)
{
    char *meta = case_path(dir, "meta", ".json");
    struct stat st;
    bool yes = meta && stat(meta, &st) == 0 && S_ISREG(st.st_mode);
    free(meta);
    return yes;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* DIR's subfolders that hold a meta.json, sorted by name; false (with err) when none. */
static bool list_cases(const char *dir, char ***out, int *n_out, char *err, size_t err_size)
{
    DIR *d = opendir(dir);
    *out = NULL;
    *n_out = 0;
    if (!d) {
        snprintf(err, err_size, "%s: not a case folder (no meta.json) and cannot be listed", dir);
        return false;
    }
    char **names = NULL;
    int n = 0, cap = 0;
    bool ok = true;
    for (struct dirent *e; ok && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char *sub = case_path(dir, e->d_name, "");
        if (sub && !is_case_dir(sub)) {
            free(sub);
            continue;
        }
        if (sub && n == cap) {
            cap = cap ? 2 * cap : 64;
            char **bigger = realloc(names, (size_t)cap * sizeof *names);
            if (bigger)
                names = bigger;
            else {
                free(sub);
                sub = NULL;
            }
        }
        if (!sub) {
            snprintf(err, err_size, "out of memory");
            ok = false;
        } else {
            names[n++] = sub;
        }
    }
    closedir(d);
    if (ok && n == 0) {
        snprintf(err, err_size, "%s: no meta.json and no case subfolders", dir);
        ok = false;
    }
    if (!ok) {
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        return false;
    }
    qsort(names, (size_t)n, sizeof *names, by_name);
    *out = names;
    *n_out = n;
    return true;
}

int cmd_check(int n_dirs, char *const *dirs, const linseq_exec *exec, bool fwd_only)
{
    tally t = {0};
    char threads[96], mode[48];
    case_exec_text(exec, false, threads, sizeof threads);
    case_mode_text(exec, mode, sizeof mode);
    /* the mode and chunk size apply to the ops the table gives modes (KDA's), no other */
    if (case_ops_with_mode()[0])
        printf("linseq check (%s; %s for %s%s)\n", threads, mode, case_ops_with_mode(),
               fwd_only ? "; forward only" : "");
    else
        printf("linseq check (%s%s)\n", threads, fwd_only ? "; forward only" : "");
    for (int i = 0; i < n_dirs; i++) {
        if (is_case_dir(dirs[i])) {
            check_case(dirs[i], exec, fwd_only, &t);
            continue;
        }
        char **cases, err[1024];
        int n;
        if (!list_cases(dirs[i], &cases, &n, err, sizeof err)) {
            fflush(stdout);
            fprintf(stderr, "linseq check: %s\n", err);
            t.errors++;
            continue;
        }
        for (int k = 0; k < n; k++) {
            check_case(cases[k], exec, fwd_only, &t);
            free(cases[k]);
        }
        free(cases);
    }
    if (t.errors) printf("%d case%s could not be checked\n", t.errors, t.errors == 1 ? "" : "s");
    /* cases first (what a reader counts), then the files compared (the last word stays the
     * skipped count, which scripts read) */
    const int cases = t.cases_passed + t.cases_failed, files = t.passed + t.failed + t.skipped;
    printf("%d case%s: %d passed, %d failed; %d file%s: %d passed, %d failed, %d skipped\n", cases,
           cases == 1 ? "" : "s", t.cases_passed, t.cases_failed, files, files == 1 ? "" : "s",
           t.passed, t.failed, t.skipped);
    return t.errors ? LS_EXIT_ERROR : t.failed ? LS_EXIT_FAIL : LS_EXIT_OK;
}
