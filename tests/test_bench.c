/* `linseq bench` end to end: every op at a tiny shape through the CLI binary, its JSON parsed
 * and checked against the README "Benchmarks" formulas (written out again here, so that a
 * change to either shows), every command the op table offers (so that an op added to the
 * table is benchable), `bench peak` at a small size, a run without OMP_WAIT_POLICY (bench
 * neither re-executes itself nor needs it: the library's pool runs everything), the
 * one-line usage errors with exit status 2, and the texts a reader sees (the synopsis, the
 * suite's scaling note).
 *
 * The CLI is found beside the test folder (BUILD/tests/test_bench -> BUILD/linseq), or at
 * $LINSEQ_CLI. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tools/linseq/commands.h"
#include "optable/optable.h"
#include "testutil.h"

static char cli[4096];

typedef struct outcome {
    int status; /* exit status, or 128 + signal */
    char *out, *err;
} outcome;

static char *slurp(FILE *f)
{
    char *s = NULL;
    long n;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (s = malloc((size_t)n + 1))) {
        s[fread(s, 1, (size_t)n, f)] = '\0';
    }
    return s ? s : calloc(1, 1);
}

static FILE *temp_file(void)
{
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/linseq_bench_XXXXXX", dir && *dir ? dir : "/tmp");
    const int fd = mkstemp(path);
    if (fd < 0) return NULL;
    unlink(path);
    return fdopen(fd, "w+");
}

/* Runs `linseq bench ARGS...` (args NULL-terminated); with keep_policy false the child
 * starts without OMP_WAIT_POLICY. */
static outcome run_bench(bool keep_policy, const char *const *args)
{
    outcome o = {.status = -1};
    const char *argv[64] = {cli, "bench"};
    int n = 2;
    for (int i = 0; args[i] && n < 63; i++) argv[n++] = args[i];
    argv[n] = NULL;
    FILE *out = temp_file(), *err = temp_file();
    if (!out || !err) {
        CHECK(false, "cannot create temporary files");
        if (out) fclose(out);
        if (err) fclose(err);
        o.out = calloc(1, 1);
        o.err = calloc(1, 1);
        return o;
    }
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fileno(out), 1);
        dup2(fileno(err), 2);
        if (!keep_policy) unsetenv("OMP_WAIT_POLICY");
        execv(cli, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    if (pid > 0 && waitpid(pid, &st, 0) == pid)
        o.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    o.out = slurp(out);
    o.err = slurp(err);
    fclose(out);
    fclose(err);
    return o;
}

static void outcome_free(outcome *o)
{
    free(o->out);
    free(o->err);
}

static bool close_to(double a, double b, double rel)
{
    return fabs(a - b) <= rel * fmax(fabs(a), fabs(b));
}

/* The number under key, or NaN (and a failed check) when it is missing or not a number. */
static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    CHECK(cJSON_IsNumber(v), "field '%s' is missing or not a number", key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static bool is_null(const cJSON *o, const char *key)
{
    return cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* stdout must be exactly one line holding one JSON object. */
static void check_usage_error(const char *const *args);

static cJSON *one_object(const outcome *o, const char *what)
{
    const char *nl = strchr(o->out, '\n');
    CHECK(nl && nl[1] == '\0', "%s: stdout is not one line: '%s'", what, o->out);
    cJSON *j = cJSON_Parse(o->out);
    CHECK(cJSON_IsObject(j), "%s: stdout is not a JSON object: '%s'", what, o->out);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

typedef struct want {
    const char *op;
    int threads;
    double tokens, flops, bytes;
} want;

/* The fields every op result has, and their consistency with each other and the formulas. */
static void check_result(const cJSON *j, const want *w, int repeats, const char *what)
{
    const cJSON *op = cJSON_GetObjectItemCaseSensitive(j, "op");
    const cJSON *isa = cJSON_GetObjectItemCaseSensitive(j, "isa");
    CHECK(cJSON_IsString(op) && strcmp(op->valuestring, w->op) == 0, "%s: op", what);
    CHECK(cJSON_IsString(isa) && strcmp(isa->valuestring, linseq_isa()) == 0, "%s: isa", what);
    CHECK(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "shape")), "%s: shape", what);
    CHECK(num(j, "threads") == w->threads, "%s: threads %g", what, num(j, "threads"));
    CHECK(num(j, "repeats") == repeats, "%s: repeats %g", what, num(j, "repeats"));
    const double med = num(j, "median_s"), mn = num(j, "min_s"), mx = num(j, "max_s");
    CHECK(mn > 0.0 && mn <= med && med <= mx && mx < 60.0, "%s: times %g %g %g", what, mn, med, mx);
    CHECK(num(j, "tokens") == w->tokens, "%s: tokens %g, want %g", what, num(j, "tokens"),
          w->tokens);
    CHECK(close_to(num(j, "tokens_per_s"), w->tokens / med, 1e-6), "%s: tokens_per_s %g vs %g",
          what, num(j, "tokens_per_s"), w->tokens / med);
    CHECK(close_to(num(j, "us_per_token"), med / w->tokens * 1e6, 1e-6), "%s: us_per_token", what);
    CHECK(close_to(num(j, "flops"), w->flops, 1e-12), "%s: flops %.17g, want %.17g", what,
          num(j, "flops"), w->flops);
    CHECK(close_to(num(j, "bytes"), w->bytes, 1e-12), "%s: bytes %.17g, want %.17g", what,
          num(j, "bytes"), w->bytes);
    CHECK(close_to(num(j, "gflops"), w->flops / med * 1e-9, 1e-6), "%s: gflops", what);
    CHECK(close_to(num(j, "gbytes_per_s"), w->bytes / med * 1e-9, 1e-6), "%s: gbytes_per_s", what);
    CHECK(num(j, "cpus_busy") >= 0.0, "%s: cpus_busy", what);
    /* Decode reuses its state, or with --cold cycles through copies filling --mib MiB. */
    const bool decode = strstr(w->op, "decode") != NULL;
    CHECK(decode ? num(j, "state_copies") >= 1.0 : is_null(j, "state_copies"), "%s: state_copies",
          what);
    CHECK(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(j, "contended")), "%s: contended", what);
}

/* ---------------------------------------------------------------------------------- */
/* The README formulas, per call                                                      */
/* ---------------------------------------------------------------------------------- */

enum { CHUNKED, RECURRENT, FWDBWD_CHUNKED, DECODE };

static want kda_want(const char *op, int kind, double B, double T, double H, double K, double V,
                     double chunk, bool per_channel)
{
    const double gw = per_channel ? K : 1.0, BT = B * T;
    const double C = chunk < T ? chunk : T;
    const double per =
        kind == RECURRENT || kind == DECODE ? 7.0 * K * V : 6.0 * K * V + 2.0 * C * K + 2.0 * C * V;
    const double in = BT * (2.0 * H * K + H * V + H + H * gw), o = BT * H * V, st = B * H * K * V;
    want w = {op, 2, BT, BT * H * per, 4.0 * (in + o + st)};
    if (kind == FWDBWD_CHUNKED) w.flops *= 3.0, w.bytes = 4.0 * (3.0 * in + 2.0 * o);
    if (kind == DECODE) w.bytes = 4.0 * (in + o + 2.0 * st);
    return w;
}

static want ssm1_want(const char *op, double B, double T, double D, double N)
{
    const double BT = B * T, in = BT * (3.0 * D + 2.0 * N) + D * N + D, y = BT * D;
    want w = {op, 2, BT, 6.0 * BT * D * N, 4.0 * (in + y + B * D * N)};
    if (strcmp(op, "ssm1-fwdbwd") == 0) w.flops *= 3.0, w.bytes = 4.0 * (3.0 * in + 2.0 * y);
    if (strcmp(op, "ssm1-decode") == 0) w.bytes = 4.0 * (in + y + 2.0 * B * D * N);
    return w;
}

/* ---------------------------------------------------------------------------------- */

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define TIMING "--repeats", "2", "--warmup", "1", "--threads", "2", "--json"

static void check_op(const char *what, const want *w, const char *const *args)
{
    outcome o = run_bench(true, args);
    CHECK(o.status == 0, "%s: exit %d, stderr '%s'", what, o.status, o.err);
    cJSON *j = one_object(&o, what);
    if (j) {
        check_result(j, w, 2, what);
        CHECK(is_null(j, "peak_gflops") && is_null(j, "peak_flops_fraction") &&
                  is_null(j, "peak_bw_fraction"),
              "%s: --no-peak still reports a peak", what);
    }
    cJSON_Delete(j);
    outcome_free(&o);
}

static void test_ops(void)
{
    want w;
    w = kda_want("kda", CHUNKED, 2, 40, 2, 16, 8, 16, true);
    check_op("kda chunked", &w,
             ARGS("kda", "--B", "2", "--T", "40", "--H", "2", "--K", "16", "--V", "8",
                  "--chunk-size", "16", TIMING, "--no-peak"));
    w = kda_want("kda", RECURRENT, 1, 24, 3, 8, 16, 64, false);
    check_op("kda recurrent per-head", &w,
             ARGS("kda", "--B=1", "--T=24", "--H=3", "--K=8", "--V=16", "--mode", "recurrent",
                  "--decay", "head", TIMING, "--no-peak"));
    w = kda_want("kda", CHUNKED, 1, 20, 2, 8, 8, 64, true);
    check_op("kda T < chunk", &w,
             ARGS("kda", "--T", "20", "--H", "2", "--K", "8", "--V", "8", TIMING, "--no-peak"));
    w = kda_want("kda", CHUNKED, 2, 1, 2, 8, 16, 64, true); /* C = min(64, 1): not decode's */
    check_op("kda T = 1 chunked", &w,
             ARGS("kda", "--B", "2", "--T", "1", "--H", "2", "--K", "8", "--V", "16", TIMING,
                  "--no-peak"));
    w = kda_want("kda-fwdbwd", FWDBWD_CHUNKED, 1, 32, 2, 16, 16, 16, true);
    check_op("kda-fwdbwd", &w,
             ARGS("kda-fwdbwd", "--T", "32", "--H", "2", "--K", "16", "--V", "16", "--chunk-size",
                  "16", TIMING, "--no-peak"));
    w = kda_want("kda-decode", DECODE, 3, 1, 2, 16, 16, 64, true);
    check_op(
        "kda-decode", &w,
        ARGS("kda-decode", "--B", "3", "--H", "2", "--K", "16", "--V", "16", TIMING, "--no-peak"));
    check_op("kda-decode --cold", &w,
             ARGS("kda-decode", "--B", "3", "--H", "2", "--K", "16", "--V", "16", TIMING,
                  "--no-peak", "--cold", "--mib", "1"));
    {
        /* warm: one state; cold: enough copies of the 6 KiB of states to fill 1 MiB */
        outcome o = run_bench(true, ARGS("kda-decode", "--B", "3", "--H", "2", "--K", "16", "--V",
                                         "16", TIMING, "--no-peak"));
        cJSON *j = one_object(&o, "warm decode");
        CHECK(j && num(j, "state_copies") == 1.0, "warm decode does not reuse one state");
        cJSON_Delete(j);
        outcome_free(&o);
        o = run_bench(true, ARGS("kda-decode", "--B", "3", "--H", "2", "--K", "16", "--V", "16",
                                 TIMING, "--no-peak", "--cold", "--mib", "1"));
        j = one_object(&o, "cold decode");
        CHECK(j && num(j, "state_copies") >= 100.0, "cold decode does not cycle its states");
        cJSON_Delete(j);
        outcome_free(&o);
    }

    {
        /* --dtype bf16: the per-token tensors count 2 bytes an element, the states 4 */
        const double st = 2.0 * 2 * 16 * 8; /* ht: B H K V */
        w = kda_want("kda", CHUNKED, 2, 40, 2, 16, 8, 16, true);
        w.bytes = (w.bytes - 4.0 * st) / 2.0 + 4.0 * st;
        check_op("kda chunked bf16", &w,
                 ARGS("kda", "--B", "2", "--T", "40", "--H", "2", "--K", "16", "--V", "8",
                      "--chunk-size", "16", "--dtype", "bf16", TIMING, "--no-peak"));
        const double pool = 3.0 * 2 * 16 * 16; /* read and written */
        w = kda_want("kda-decode", DECODE, 3, 1, 2, 16, 16, 64, true);
        w.bytes = (w.bytes - 8.0 * pool) / 2.0 + 8.0 * pool;
        check_op("kda-decode bf16", &w,
                 ARGS("kda-decode", "--B", "3", "--H", "2", "--K", "16", "--V", "16", "--dtype",
                      "bf16", TIMING, "--no-peak"));
        /* an op whose CPU kernels take float32 only: the library's refusal, exit 1 */
        outcome o = run_bench(true, ARGS("ssm1", "--T", "8", "--D", "8", "--N", "4", "--dtype",
                                         "bf16", TIMING, "--no-peak"));
        CHECK(o.status == 1 && strstr(o.err, "linseq_ssm1_forward") &&
                  strstr(o.err, "LINSEQ_DTYPE_BF16"),
              "ssm1 --dtype bf16: exit %d, stderr '%s'", o.status, o.err);
        outcome_free(&o);
    }

    {
        /* --products bf16 reaches the exec and the report; a value it does not know is a
         * usage error */
        outcome o = run_bench(true, ARGS("kda", "--B", "1", "--T", "40", "--H", "2", "--K", "16",
                                         "--V", "8", "--products", "bf16", TIMING, "--no-peak"));
        cJSON *j = one_object(&o, "kda --products bf16");
        const cJSON *pr = j ? cJSON_GetObjectItemCaseSensitive(j, "products") : NULL;
        CHECK(cJSON_IsString(pr) && strcmp(pr->valuestring, "bf16") == 0,
              "kda --products bf16: no \"products\": \"bf16\" in the JSON");
        cJSON_Delete(j);
        outcome_free(&o);
        check_usage_error(ARGS("kda", "--products", "f16"));
        /* the SSD forward takes it too (its chunked mode) */
        o = run_bench(true,
                      ARGS("ssd", "--B", "1", "--T", "40", "--H", "2", "--P", "8", "--N", "16",
                           "--chunk-size", "16", "--products", "bf16", TIMING, "--no-peak"));
        j = one_object(&o, "ssd --products bf16");
        pr = j ? cJSON_GetObjectItemCaseSensitive(j, "products") : NULL;
        CHECK(o.status == 0 && cJSON_IsString(pr) && strcmp(pr->valuestring, "bf16") == 0,
              "ssd --products bf16: exit %d, no \"products\": \"bf16\" in the JSON", o.status);
        cJSON_Delete(j);
        outcome_free(&o);
        check_usage_error(ARGS("ssd", "--products", "f16"));
    }

    {
        /* --pool bf16: the decode's states in a bf16 pool (2 bytes an element, read and
         * written), reported; a forward has no pool and an unknown type is a usage error */
        const double pool = 3.0 * 2 * 16 * 16;
        w = kda_want("kda-decode", DECODE, 3, 1, 2, 16, 16, 64, true);
        w.bytes -= 4.0 * pool;
        check_op("kda-decode --pool bf16", &w,
                 ARGS("kda-decode", "--B", "3", "--H", "2", "--K", "16", "--V", "16", "--pool",
                      "bf16", TIMING, "--no-peak"));
        outcome o = run_bench(true, ARGS("kda-decode", "--B", "3", "--H", "2", "--K", "16", "--V",
                                         "16", "--pool", "f16", TIMING, "--no-peak"));
        cJSON *j = one_object(&o, "kda-decode --pool f16");
        const cJSON *pl = j ? cJSON_GetObjectItemCaseSensitive(j, "pool") : NULL;
        CHECK(cJSON_IsString(pl) && strcmp(pl->valuestring, "f16") == 0,
              "kda-decode --pool f16: no \"pool\": \"f16\" in the JSON");
        cJSON_Delete(j);
        outcome_free(&o);
        check_usage_error(ARGS("kda-decode", "--pool", "f64"));
        check_usage_error(ARGS("kda", "--pool", "bf16"));
    }

    {
        /* --tap-major reaches the problem: the conv decode over bf16 x and a bf16 pool runs
         * in vLLM's layouts only (without it the library refuses the call, exit 1), and the
         * report says so; an op without those layouts refuses the option */
        outcome o =
            run_bench(true, ARGS("conv-decode", "--B", "3", "--D", "40", "--W", "4", "--dtype",
                                 "bf16", "--pool", "bf16", "--tap-major", TIMING, "--no-peak"));
        cJSON *j = one_object(&o, "conv-decode --tap-major");
        const cJSON *tm = j ? cJSON_GetObjectItemCaseSensitive(j, "tap_major") : NULL;
        CHECK(o.status == 0 && cJSON_IsTrue(tm),
              "conv-decode --tap-major: exit %d, no \"tap_major\": true in the JSON", o.status);
        cJSON_Delete(j);
        outcome_free(&o);
        o = run_bench(true, ARGS("conv-decode", "--B", "3", "--D", "40", "--W", "4", "--dtype",
                                 "bf16", "--pool", "bf16", TIMING, "--no-peak"));
        CHECK(o.status == 1, "conv-decode bf16 without --tap-major: exit %d, want 1", o.status);
        outcome_free(&o);
        check_usage_error(ARGS("kda-decode", "--tap-major"));
    }

    w = (want){"gate", 2, 32, 2.0 * 32 * 2 * 8, 4.0 * (2.0 * 32 * 2 * 8 + 2 + 2 * 8)};
    check_op("gate", &w,
             ARGS("gate", "--B", "2", "--T", "16", "--H", "2", "--K", "8", TIMING, "--no-peak"));
    w = (want){"gate", 2, 16, 2.0 * 16 * 3, 4.0 * (2.0 * 16 * 3 + 3 + 3)};
    check_op("gate per-head", &w,
             ARGS("gate", "--T", "16", "--H", "3", "--decay", "per-head", TIMING, "--no-peak"));
    /* the op table's name is the same command as the short one */
    check_op("kda_gate (the table's name)", &w,
             ARGS("kda_gate", "--T", "16", "--H", "3", "--decay", "per-head", TIMING, "--no-peak"));

    w = ssm1_want("ssm1", 2, 20, 24, 4);
    check_op("ssm1", &w,
             ARGS("ssm1", "--B", "2", "--T", "20", "--D", "24", "--N", "4", TIMING, "--no-peak"));
    w = ssm1_want("ssm1-fwdbwd", 1, 20, 16, 4);
    check_op("ssm1-fwdbwd", &w,
             ARGS("ssm1-fwdbwd", "--T", "20", "--D", "16", "--N", "4", TIMING, "--no-peak"));
    w = ssm1_want("ssm1-decode", 2, 1, 32, 8);
    check_op("ssm1-decode", &w,
             ARGS("ssm1-decode", "--B", "2", "--D", "32", "--N", "8", TIMING, "--no-peak", "--mib",
                  "1"));
    check_op("ssm1-decode --cold", &w,
             ARGS("ssm1-decode", "--B", "2", "--D", "32", "--N", "8", TIMING, "--no-peak", "--cold",
                  "--mib", "1"));

    w = (want){"conv", 2, 40, 2.0 * 4 * 40 * 24, 4.0 * (2.0 * 40 * 24 + 24 * 4 + 24 + 2 * 24 * 3)};
    check_op("conv", &w,
             ARGS("conv", "--B", "2", "--T", "20", "--D", "24", "--W", "4", TIMING, "--no-peak"));
    w = (want){"conv", 2, 20, 2.0 * 20 * 24, 4.0 * (2.0 * 20 * 24 + 24 + 24)};
    check_op("conv W=1", &w,
             ARGS("conv", "--T", "20", "--D", "24", "--W", "1", TIMING, "--no-peak"));
}

/* One command of the op table at small sizes: it runs, and its JSON names the command,
 * every size the benchmark varies and B*T tokens (B for decode). */
static void check_table_command(const ls_op *op, const char *name, bool decode)
{
    const char *args[64] = {name};
    char values[LS_OP_MAX_FIELDS][32], flags[LS_OP_MAX_FIELDS][40];
    int n = 1, n_shape = 0;
    double tokens = 1.0;
    for (int i = 0; i < op->n_sizes && n < 40; i++) {
        const ls_size_desc *sz = &op->sizes[i];
        if (sz->bench_default <= 0) continue;
        n_shape++;
        const int64_t v = sz->bench_default > 64 ? 8 + sz->bench_default % 23 : sz->bench_default;
        if (decode && strcmp(sz->name, "T") == 0) continue; /* decode runs T = 1 */
        if (strcmp(sz->name, "B") == 0 || strcmp(sz->name, "T") == 0) tokens *= (double)v;
        snprintf(flags[i], sizeof flags[i], "--%s", sz->name);
        snprintf(values[i], sizeof values[i], "%lld", (long long)v);
        args[n++] = flags[i];
        args[n++] = values[i];
    }
    const char *const timing[] = {TIMING, "--no-peak", "--cold", "--mib", "1", NULL};
    for (int i = 0; timing[i] && n < 63; i++)
        if (decode || strcmp(timing[i], "--cold") != 0) args[n++] = timing[i];
    args[n] = NULL;
    outcome o = run_bench(true, args);
    CHECK(o.status == 0, "table command %s: exit %d, stderr '%s'", name, o.status, o.err);
    cJSON *j = o.status == 0 ? one_object(&o, name) : NULL;
    if (j) {
        const cJSON *jop = cJSON_GetObjectItemCaseSensitive(j, "op");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
        CHECK(cJSON_IsString(jop) && strcmp(jop->valuestring, name) == 0, "%s: op", name);
        CHECK(cJSON_GetArraySize(shape) == n_shape, "%s: shape has %d sizes, want %d", name,
              cJSON_GetArraySize(shape), n_shape);
        CHECK(num(j, "tokens") == tokens, "%s: tokens %g, want %g", name, num(j, "tokens"), tokens);
        CHECK(num(j, "flops") > 0.0 && num(j, "bytes") > 0.0, "%s: flops, bytes", name);
    }
    cJSON_Delete(j);
    outcome_free(&o);
}

/* Every op of the table as its forward, and as a training step and decode where offered. */
static void test_table_commands(void)
{
    int n_ops;
    const ls_op *const *ops = ls_ops(&n_ops);
    for (int i = 0; i < n_ops; i++) {
        const char *base = ops[i]->bench_name ? ops[i]->bench_name : ops[i]->name;
        char name[64];
        check_table_command(ops[i], base, false);
        snprintf(name, sizeof name, "%s-fwdbwd", base);
        if (ops[i]->bench_fwdbwd) check_table_command(ops[i], name, false);
        snprintf(name, sizeof name, "%s-decode", base);
        if (ops[i]->decode) check_table_command(ops[i], name, true);
    }
}

/* The peak command and a result's fractions of it, with 1 MiB bandwidth arrays. */
static void test_peak(void)
{
    outcome o = run_bench(true, ARGS("peak", "--mib", "1", "--repeats", "2", "--json"));
    CHECK(o.status == 0, "peak: exit %d, stderr '%s'", o.status, o.err);
    cJSON *j = one_object(&o, "peak");
    if (j) {
        const cJSON *isa = cJSON_GetObjectItemCaseSensitive(j, "isa");
        CHECK(cJSON_IsString(isa) && strcmp(isa->valuestring, linseq_isa()) == 0, "peak: isa");
        CHECK(num(j, "threads") == linseq_get_num_threads(), "peak: threads");
        CHECK(num(j, "fma_gflops_1_thread") > 0.0 && num(j, "fma_gflops") > 0.0, "peak: FMA rates");
        CHECK(num(j, "bw_gbytes_per_s_1_thread") > 0.0 && num(j, "bw_gbytes_per_s") > 0.0,
              "peak: bandwidths");
        printf("  bench peak --mib 1: isa %s, FMA %.1f GFLOP/s on 1 thread, %.1f on %g\n",
               linseq_isa(), num(j, "fma_gflops_1_thread"), num(j, "fma_gflops"),
               num(j, "threads"));
    }
    cJSON_Delete(j);
    outcome_free(&o);

    const want w = {"conv", 1, 20, 2.0 * 4 * 20 * 16, 4.0 * (2.0 * 20 * 16 + 16 * 4 + 16 + 16 * 3)};
    o = run_bench(true, ARGS("conv", "--T", "20", "--D", "16", "--repeats", "2", "--warmup", "0",
                             "--threads", "1", "--mib", "1", "--json"));
    CHECK(o.status == 0, "conv with peak: exit %d, stderr '%s'", o.status, o.err);
    j = one_object(&o, "conv with peak");
    if (j) {
        check_result(j, &w, 2, "conv with peak");
        CHECK(num(j, "peak_threads") == 1, "conv with peak: peak_threads");
        CHECK(num(j, "peak_gflops") > 0.0 && num(j, "peak_gbytes_per_s") > 0.0,
              "conv with peak: peak values");
        CHECK(
            close_to(num(j, "peak_flops_fraction"), num(j, "gflops") / num(j, "peak_gflops"), 1e-6),
            "conv with peak: flops fraction");
        CHECK(close_to(num(j, "peak_bw_fraction"),
                       num(j, "gbytes_per_s") / num(j, "peak_gbytes_per_s"), 1e-6),
              "conv with peak: bandwidth fraction");
    }
    cJSON_Delete(j);
    outcome_free(&o);
}

/* Processes now running the CLI's binary (bench's busy children would be such). */
static int cli_processes(void)
{
    char binary[PATH_MAX], path[300], exe[PATH_MAX]; /* path: "/proc/" and a d_name */
    if (!realpath(cli, binary)) return -1;
    DIR *d = opendir("/proc");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/exe", e->d_name);
        const ssize_t len = readlink(path, exe, sizeof exe - 1);
        if (len <= 0) continue;
        exe[len] = '\0';
        n += strcmp(exe, binary) == 0;
    }
    closedir(d);
    return n;
}

/* --contend N runs N busy processes beside the timing, says so in the result, and leaves
 * none behind. */
static void test_contend(void)
{
    const int before = cli_processes();
    outcome o = run_bench(true, ARGS("conv", "--T", "8", "--D", "8", "--repeats", "2", "--warmup",
                                     "0", "--json", "--no-peak", "--contend", "2"));
    CHECK(o.status == 0, "--contend: exit %d, stderr '%s'", o.status, o.err);
    cJSON *j = one_object(&o, "--contend");
    const cJSON *busy = cJSON_GetObjectItemCaseSensitive(j, "busy_processes");
    CHECK(cJSON_IsNumber(busy) && busy->valuedouble == 2, "--contend 2: busy_processes");
    cJSON_Delete(j);
    outcome_free(&o);
    CHECK(cli_processes() == before, "--contend left busy processes behind (%d, were %d)",
          cli_processes(), before);
    check_usage_error(ARGS("conv", "--contend", "65"));
    check_usage_error(ARGS("conv", "--contend", "-1"));
}

/* Without OMP_WAIT_POLICY, bench runs once and says nothing on stderr: it used to set
 * OMP_WAIT_POLICY=active and run itself again, and the OpenMP threads of its peak measurement
 * then spun beside the library's own pool and slowed every timed call (KDA forward, 2
 * threads: 7.7 -> 9.9 ms, reported as contended). */
static void test_no_reexec(void)
{
    outcome o = run_bench(false, ARGS("conv", "--T", "8", "--D", "8", "--repeats", "2", "--warmup",
                                      "0", "--json", "--no-peak"));
    CHECK(o.status == 0, "no re-exec: exit %d, stderr '%s'", o.status, o.err);
    CHECK(o.err[0] == '\0', "no re-exec: stderr '%s'", o.err);
    cJSON *j = one_object(&o, "no re-exec");
    cJSON_Delete(j);
    outcome_free(&o);

    o = run_bench(true,
                  ARGS("conv", "--T", "8", "--D", "8", "--repeats", "2", "--json", "--no-peak"));
    CHECK(o.status == 0 && o.err[0] == '\0', "policy set: exit %d, stderr '%s'", o.status, o.err);
    outcome_free(&o);
}

/* --help lists every command of the op table (its forward, and its training and decode
 * steps where it has them) at the start of a line, with the options that apply to it. */
static void test_help(void)
{
    outcome o = run_bench(true, ARGS("--help"));
    CHECK(o.status == 0 && strstr(o.out, "Threads:"), "bench --help: exit %d", o.status);
    int n_ops;
    const ls_op *const *ops = ls_ops(&n_ops);
    for (int i = 0; o.status == 0 && i < n_ops; i++) {
        const char *base = ops[i]->bench_name ? ops[i]->bench_name : ops[i]->name;
        static const char *const suffix[3] = {"", "-fwdbwd", "-decode"};
        const bool offered[3] = {true, ops[i]->bench_fwdbwd, ops[i]->decode != NULL};
        for (int k = 0; k < 3; k++) {
            char line[96];
            snprintf(line, sizeof line, "\n        %s%s ", base, suffix[k]);
            const char *at = strstr(o.out, line);
            CHECK(!offered[k] || (at && strstr(at, " --B")),
                  "bench --help: no line for %s%s (op %s) with its options", base, suffix[k],
                  ops[i]->name);
            CHECK(offered[k] || !at, "bench --help: %s%s, which op %s does not offer", base,
                  suffix[k], ops[i]->name);
        }
    }
    outcome_free(&o);
}

static void check_usage_error(const char *const *args)
{
    char what[256] = "bench";
    for (int i = 0; args[i]; i++) {
        strncat(what, " ", sizeof what - strlen(what) - 1);
        strncat(what, args[i], sizeof what - strlen(what) - 1);
    }
    outcome o = run_bench(true, args);
    const char *nl = strchr(o.err, '\n');
    CHECK(o.status == 2, "%s: exit %d, want 2", what, o.status);
    CHECK(o.out[0] == '\0', "%s: printed to stdout: '%s'", what, o.out);
    CHECK(strncmp(o.err, "linseq bench: ", 14) == 0 && nl && nl[1] == '\0',
          "%s: stderr is not one 'linseq bench:' line: '%s'", what, o.err);
    outcome_free(&o);
}

static void test_errors(void)
{
    const char *none[] = {NULL};
    check_usage_error(none);
    check_usage_error(ARGS("frobnicate"));
    check_usage_error(ARGS("kda", "--T", "0"));
    check_usage_error(ARGS("kda", "--K", "-3"));
    check_usage_error(ARGS("kda", "--B", "1.5"));
    check_usage_error(ARGS("kda", "--H", ""));
    check_usage_error(ARGS("kda", "--V", "99999999999"));
    check_usage_error(ARGS("kda", "--T"));
    check_usage_error(ARGS("kda", "--frobnicate", "3"));
    check_usage_error(ARGS("kda", "operand"));
    check_usage_error(ARGS("kda", "--json=1"));
    check_usage_error(ARGS("kda", "--mode", "sideways"));
    check_usage_error(ARGS("kda", "--chunk-size", "48"));
    check_usage_error(ARGS("kda", "--decay", "none"));
    check_usage_error(ARGS("kda", "--dtype", "fp8"));
    check_usage_error(ARGS("peak", "--dtype", "bf16"));
    check_usage_error(ARGS("kda", "--threads", "0"));
    check_usage_error(ARGS("kda", "--repeats", "0"));
    check_usage_error(ARGS("kda", "--D", "64"));
    check_usage_error(ARGS("kda-decode", "--T", "4"));
    check_usage_error(ARGS("kda-decode", "--mode", "chunked"));
    check_usage_error(ARGS("conv", "--K", "4"));
    check_usage_error(ARGS("ssm1", "--W", "4"));
    check_usage_error(ARGS("peak", "--T", "5"));
    check_usage_error(ARGS("suite", "--H", "5"));
    /* Too large to describe, and too large for this machine's memory. */
    check_usage_error(ARGS("kda", "--B", "2147483648", "--T", "2147483648", "--no-peak"));
    check_usage_error(ARGS("ssm1", "--B", "100000", "--T", "100000", "--no-peak"));

    test_help();
}

/* The suite's scaling note says which way and by how much, as a factor of at least 1, with
 * the thread count's plural; the synopsis of `bench --help` lists every option the commands
 * take (--dtype, --contend and --cold among them). */
static void test_texts(void)
{
    char buf[96];
    static const struct {
        double t1, tn;
        int threads;
        const char *want;
    } cases[] = {
        {1.0, 0.5, 2, "2.00x faster on 2 threads than on 1"},
        {0.68, 1.0, 2, "1.47x slower on 2 threads than on 1"},
        {1.0, 1.0, 1, "1.00x faster on 1 thread than on 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK(strcmp(ls_speedup_text(cases[i].t1, cases[i].tn, cases[i].threads, buf, sizeof buf),
                     cases[i].want) == 0,
              "speedup %g s vs %g s on %d: \"%s\", expected \"%s\"", cases[i].t1, cases[i].tn,
              cases[i].threads, buf, cases[i].want);
    static const char *const help[] = {"--help", NULL};
    outcome o = run_bench(true, help);
    const char *options = strstr(o.out, "bench options:");
    CHECK(o.status == 0 && options, "bench --help: status %d, no options part", o.status);
    static const char *const synopsis[] = {"[--dtype f32|bf16]", "[--contend N]", "[--cold]"};
    for (size_t i = 0; options && i < sizeof synopsis / sizeof synopsis[0]; i++) {
        const char *at = strstr(o.out, synopsis[i]);
        CHECK(at && at < options, "bench --help: the synopsis lacks %s", synopsis[i]);
    }
    outcome_free(&o);
}

int main(int argc, char **argv)
{
    (void)argc;
    const char *env = getenv("LINSEQ_CLI");
    if (env && *env) {
        snprintf(cli, sizeof cli, "%s", env);
    } else {
        const char *slash = strrchr(argv[0], '/');
        const int dir = slash ? (int)(slash - argv[0]) : 1;
        snprintf(cli, sizeof cli, "%.*s/../linseq", dir, slash ? argv[0] : ".");
    }
    if (access(cli, X_OK) != 0) {
        fprintf(stderr, "test_bench: no CLI at '%s' (run make, or set LINSEQ_CLI)\n", cli);
        return 1;
    }
    setenv("OMP_WAIT_POLICY", "active", 1);
    test_ops();
    test_table_commands();
    test_peak();
    test_no_reexec();
    test_contend();
    test_errors();
    test_texts();
    return tu_finish("test_bench");
}
