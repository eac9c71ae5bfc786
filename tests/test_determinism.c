/* Bitwise determinism of every op, outputs and gradients (the catalog of op_jobs.c): a call
 * repeated gives the same bits, on 1, 2, 3 or 4 threads and on the default count, whatever its
 * output buffers held before (poison, NaN, zeros). The per-op tests check the thread split of
 * their own kernels in more shapes; this is the one place that covers every entry point the
 * same way. Different chunk sizes are different algorithms and are not compared. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_jobs.h"
#include "testutil.h"

/* What the outputs hold before a run: an output an op reads before writing would show. */
static void prefill(float *x, size_t n, int pattern)
{
    if (pattern == 0) tu_poison(x, n * sizeof(float));
    if (pattern == 1) memset(x, 0xFF, n * sizeof(float)); /* NaN */
    if (pattern == 2) memset(x, 0, n * sizeof(float));
}

int main(void)
{
    job *jobs;
    const int n_jobs = jobs_make(&jobs);
    /* (threads, default thread setting): 0 = the call's default, then the setting applies */
    static const int runs[][2] = {{1, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {0, 0}, {0, 4}, {0, 1}};
    const int n_runs = (int)(sizeof runs / sizeof runs[0]);
    for (int i = 0; i < n_jobs; i++) {
        const job *j = job_at(jobs, i);
        const int n_out = job_outputs(j);
        float *ref[JOB_MAX_OUT], *out[JOB_MAX_OUT];
        for (int k = 0; k < n_out; k++) {
            ref[k] = tu_alloc(job_output_len(j, k));
            out[k] = tu_alloc(job_output_len(j, k));
        }
        CHECK_OK(job_run(j, 1, ref));
        for (int r = 0; r < n_runs; r++) {
            CHECK_OK(linseq_set_num_threads(runs[r][1]));
            for (int k = 0; k < n_out; k++) prefill(out[k], job_output_len(j, k), r % 3);
            CHECK_OK(job_run(j, runs[r][0], out));
            for (int k = 0; k < n_out; k++)
                CHECK(tu_same_bits(out[k], ref[k], job_output_len(j, k)),
                      "%s: %s differs from one thread's with threads = %d (setting %d)",
                      job_name(j), job_output_name(j, k), runs[r][0], runs[r][1]);
        }
        CHECK_OK(linseq_set_num_threads(0));
        for (int k = 0; k < n_out; k++) {
            size_t bad = 0;
            for (size_t e = 0; e < job_output_len(j, k); e++) bad += !isfinite(ref[k][e]);
            CHECK(bad == 0, "%s: %zu non-finite values in %s", job_name(j), bad,
                  job_output_name(j, k));
            free(ref[k]);
            free(out[k]);
        }
    }
    printf("  %d jobs, %d runs each\n", n_jobs, n_runs + 1);
    jobs_free(jobs, n_jobs);
    return tu_finish("test_determinism");
}
