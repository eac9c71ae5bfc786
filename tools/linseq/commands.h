/* The subcommands behind `linseq` and the exit codes they share. Each returns the process
 * exit code; errors are reported on stderr as one line naming the file or option. */
#ifndef LS_TOOLS_COMMANDS_H
#define LS_TOOLS_COMMANDS_H

#include <stdbool.h>
#include <stdio.h>

#include "linseq.h"

/* 1 is kept for "a check ran and failed" so that scripts can tell it from bad input. */
enum { LS_EXIT_OK = 0, LS_EXIT_FAIL = 1, LS_EXIT_ERROR = 2 };

/* linseq run CASE_DIR OUT_DIR: the case's outputs and, unless fwd_only, its gradients as
 * .npy files in OUT_DIR. A CASE_DIR without meta.json that holds case folders runs each of
 * them, CASE_DIR/<name> into OUT_DIR/<name>. */
int cmd_run(const char *case_dir, const char *out_dir, const linseq_exec *exec, bool fwd_only);

/* linseq check DIR...: every case under each DIR against its reference files; with
 * fwd_only the gradient files are counted as skipped. */
int cmd_check(int n_dirs, char *const *dirs, const linseq_exec *exec, bool fwd_only);

/* linseq demo: a KDA layer and a Mamba block at realistic sizes, timed and cross-checked. */
int cmd_demo(const linseq_exec *exec);

/* linseq bench OP|peak|suite [options]: argv is main's, whole (argv[1] is "bench"). Parses
 * its own options. */
int cmd_bench(int argc, char **argv);

/* The bench part of `linseq --help`, its op commands listed from the op table. */
void ls_bench_usage(FILE *f);

/* "1.47x slower on 2 threads than on 1": a run on `threads` threads against one thread, from
 * their seconds per call, as a factor of at least 1 with its direction. Returns buf. */
const char *ls_speedup_text(double one_thread_s, double threads_s, int threads, char *buf,
                            size_t n);

#endif
