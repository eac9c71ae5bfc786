/* `linseq`: subcommand dispatch and option parsing; the commands live in their own files. */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "linseq.h"

/* Each command's synopsis and what it does, then the options they share: `linseq --help`
 * prints them all, `linseq CMD --help` its own. */
static const char run_text[] =
    "  linseq run CASE_DIR OUT_DIR [--mode M] [--chunk-size N] [--threads N] [--device D]\n"
    "             [--fwd-only]\n"
    "      run a reference case's op forward and backward; write its outputs and its\n"
    "      gradients to OUT_DIR/<name>.npy. CASE_DIR may also be a folder of case folders:\n"
    "      each case CASE_DIR/<case> is run into OUT_DIR/<case>\n";
static const char check_text[] =
    "  linseq check [--mode M] [--chunk-size N] [--threads N] [--device D] [--fwd-only] DIR...\n"
    "      compare every case's outputs and gradients with its reference files; DIR is a\n"
    "      case folder (with meta.json) or a folder of case folders. The last line counts\n"
    "      the cases, then the files compared\n";
static const char demo_text[] =
    "  linseq demo [--threads N]\n"
    "      a KDA layer and a Mamba block at realistic sizes: timings and consistency checks\n";
static const char bench_text[] =
    "  linseq bench OP|peak|suite [options]\n"
    "      time one op at one shape, measure the machine's peak, or run the standard\n"
    "      benchmark shapes (see \"bench\" below)\n"
    "  linseq --help | --version | CMD --help\n";

static const char opt_mode[] = "  --mode recurrent|chunked   KDA algorithm (default: chunked)\n"
                               "  --chunk-size 16|32|64|128  KDA chunk size (default: 64)\n";
static const char opt_threads[] =
    "  --threads N                threads per call (default: all processors)\n";
static const char opt_device[] =
    "  --device cpu|cuda          where run and check compute (cuda: a build with\n"
    "                             make CUDA=1 and a GPU, else a usage error; inputs are\n"
    "                             copied to device 0)\n"
    "  --fwd-only                 skip the backward: no gradient files are written, and\n"
    "                             check counts them as skipped\n";

/* After the bench part (commands.h), which has its own options. */
static const char usage_tail[] =
    "\n"
    "exit status: 0 success, 1 a check failed, 2 bad usage or unreadable input\n";

static void print_usage(FILE *f)
{
    fprintf(f, "usage:\n%s%s%s%s\noptions of run, check and demo:\n%s%s%s\n", run_text, check_text,
            demo_text, bench_text, opt_mode, opt_threads, opt_device);
    ls_bench_usage(f);
    fputs(usage_tail, f);
}

/* `linseq CMD --help`: the command's synopsis and its own options only. */
static void print_command_usage(FILE *f, const char *cmd)
{
    const bool demo = strcmp(cmd, "demo") == 0;
    fprintf(f, "usage:\n%s\noptions of %s:\n%s%s%s",
            strcmp(cmd, "run") == 0 ? run_text
            : demo                  ? demo_text
                                    : check_text,
            cmd, demo ? "" : opt_mode, opt_threads, demo ? "" : opt_device);
    fputs(usage_tail, f);
}

static const char *command = "";

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "linseq%s%s: ", *command ? " " : "", command);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see linseq --help)\n");
    return LS_EXIT_ERROR;
}

static bool parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

/* The demo compares the KDA modes itself, so only --threads applies to it. */
static bool known_option(const char *cmd, const char *opt)
{
    if (strcmp(opt, "--threads") == 0) return true;
    return strcmp(cmd, "demo") != 0 &&
           (strcmp(opt, "--mode") == 0 || strcmp(opt, "--chunk-size") == 0 ||
            strcmp(opt, "--device") == 0);
}

/* Switches take no value, so they stay out of set_option's "OPT VALUE" parsing. */
static bool known_flag(const char *cmd, const char *opt)
{
    return strcmp(opt, "--fwd-only") == 0 && strcmp(cmd, "demo") != 0;
}

/* Sets one known execution option; returns LS_EXIT_OK or reports the bad value. */
static int set_option(const char *opt, const char *val, linseq_exec *ex)
{
    if (strcmp(opt, "--mode") == 0) {
        if (strcmp(val, "recurrent") == 0)
            ex->mode = LINSEQ_MODE_RECURRENT;
        else if (strcmp(val, "chunked") == 0)
            ex->mode = LINSEQ_MODE_CHUNKED;
        else
            return usage_error("--mode: '%s' is not recurrent or chunked", val);
    } else if (strcmp(opt, "--chunk-size") == 0) {
        int n;
        if (!parse_int(val, 1, INT_MAX, &n) || (n != 16 && n != 32 && n != 64 && n != 128))
            return usage_error("--chunk-size: '%s' is not 16, 32, 64 or 128", val);
        ex->chunk_size = n;
    } else if (strcmp(opt, "--device") == 0) {
        if (strcmp(val, "cpu") == 0)
            ex->device = LINSEQ_DEVICE_CPU;
        else if (strcmp(val, "cuda") == 0)
            ex->device = LINSEQ_DEVICE_CUDA;
        else
            return usage_error("--device: '%s' is not cpu or cuda", val);
    } else if (!parse_int(val, 1, 4096, &ex->threads)) {
        return usage_error("--threads: '%s' is not a thread count from 1 to 4096", val);
    }
    return LS_EXIT_OK;
}

/* --device cuda where no CUDA device can run is one usage error up front, not a failure
 * per case. */
static int device_available(const linseq_exec *ex)
{
    if (ex->device != LINSEQ_DEVICE_CUDA) return LS_EXIT_OK;
#ifndef LINSEQ_WITH_CUDA
    return usage_error("--device cuda: this build has no CUDA backend%s (rebuild with "
                       "make CUDA=1, or use --device cpu)",
                       "");
#else
    if (linseq_cuda_device_count() <= ex->device_index)
        return usage_error("--device cuda: no CUDA device found%s (no GPU or no driver; "
                           "use --device cpu)",
                           "");
    return LS_EXIT_OK;
#endif
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage_error("no command given%s", "");
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        print_usage(stdout);
        return LS_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("linseq %s\n", linseq_version());
        return LS_EXIT_OK;
    }
    /* A LINSEQ_ISA the library refuses would fail every call of every case: one line. */
    if (strcmp(linseq_isa(), "invalid") == 0) {
        fprintf(stderr, "linseq: %s\n", linseq_last_error());
        return LS_EXIT_ERROR;
    }
    /* bench has options of its own, and may run itself again with the whole argv. */
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc, argv);
    if (strcmp(cmd, "run") != 0 && strcmp(cmd, "check") != 0 && strcmp(cmd, "demo") != 0)
        return usage_error("unknown command '%s'", cmd);
    command = cmd;

    /* Options may come before, between or after the operands; "--" ends them. */
    linseq_exec ex = {0};
    bool fwd_only = false;
    char **pos = calloc((size_t)argc, sizeof *pos);
    int n_pos = 0;
    bool options_done = false;
    if (!pos) return LS_EXIT_ERROR;
    for (int i = 2; i < argc; i++) {
        char *a = argv[i];
        if (options_done || a[0] != '-' || a[1] == '\0') {
            pos[n_pos++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            options_done = true;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_command_usage(stdout, cmd);
            free(pos);
            return LS_EXIT_OK;
        }
        char *eq = strchr(a, '=');
        char opt[64];
        snprintf(opt, sizeof opt, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
        int rc = LS_EXIT_ERROR;
        if (known_flag(cmd, opt)) {
            if (eq) {
                fprintf(stderr, "linseq %s: option '%s' takes no value\n", cmd, opt);
            } else {
                fwd_only = true;
                rc = LS_EXIT_OK;
            }
        } else if (!known_option(cmd, opt)) {
            fprintf(stderr, "linseq %s: unknown option '%s' (see linseq --help)\n", cmd, a);
        } else {
            const char *val = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
            if (val)
                rc = set_option(opt, val, &ex);
            else
                fprintf(stderr, "linseq %s: option '%s' needs a value\n", cmd, opt);
        }
        if (rc != LS_EXIT_OK) {
            free(pos);
            return rc;
        }
    }

    int rc = device_available(&ex);
    if (rc != LS_EXIT_OK) {
        free(pos);
        return rc;
    }
    if (strcmp(cmd, "run") == 0) {
        rc = n_pos == 2 ? cmd_run(pos[0], pos[1], &ex, fwd_only)
                        : usage_error("%s needs CASE_DIR and OUT_DIR", "run");
    } else if (strcmp(cmd, "check") == 0) {
        rc = n_pos >= 1 ? cmd_check(n_pos, pos, &ex, fwd_only)
                        : usage_error("%s needs at least one folder", "check");
    } else {
        rc = n_pos == 0 ? cmd_demo(&ex) : usage_error("demo takes no operand ('%s')", pos[0]);
    }
    free(pos);
    return rc;
}
