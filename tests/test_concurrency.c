/* Many caller threads at once: 8 pthreads run the ops of the job catalog (op_jobs.c) in
 * different orders with different thread counts, each into its own outputs, and compare every
 * result bitwise with the one computed serially beforehand; meanwhile they make failing calls
 * whose messages must stay their own (linseq_last_error is per thread), and one thread keeps
 * changing the global thread setting. Built with -fsanitize=thread by `make test-tsan`.
 *
 * The worker threads never use CHECK (its counters are not atomic): each records its first
 * failure, and the main thread checks the records after joining. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "op_jobs.h"
#include "testutil.h"

enum { N_THREADS = 8, DEFAULT_ROUNDS = 6 };

static job *jobs;
static int n_jobs, rounds;
static float *(*expected)[JOB_MAX_OUT]; /* [n_jobs]: each job's outputs, computed serially */
static pthread_barrier_t start;         /* every worker waits for all, so that the calls overlap */

typedef struct worker {
    int id;
    pthread_t thread;
    long calls, bad_calls;
    char failure[512]; /* the first failure, "" when none */
} worker;

static void fail(worker *w, const char *what, const char *detail)
{
    if (!w->failure[0])
        snprintf(w->failure, sizeof w->failure, "thread %d: %s: %s", w->id, what, detail);
}

/* A call that must fail with a message only this thread can have produced: the negative size
 * names the thread. A leaked message of another thread would name another size. */
static void failing_call(worker *w)
{
    char want[64];
    const int64_t bad = -(int64_t)(w->id + 1) * 1000;
    snprintf(want, sizeof want, "T = %lld;", (long long)bad);
    const linseq_conv1d_problem p = {.B = 1, .T = bad, .D = 4, .W = 2};
    float y[4];
    w->bad_calls++;
    if (linseq_conv1d_forward(&p, NULL, y, NULL) != LINSEQ_ERR_INVALID_SIZE)
        fail(w, "failing call", "wrong status");
    else if (!strstr(linseq_last_error(), want))
        fail(w, "failing call: another thread's message", linseq_last_error());
}

static void *work(void *arg)
{
    worker *w = arg;
    pthread_barrier_wait(&start);
    float *out[JOB_MAX_OUT];
    for (int r = 0; r < rounds; r++) {
        for (int step = 0; step < n_jobs; step++) {
            /* each thread its own order and thread counts */
            const int i = (w->id * 5 + step * (w->id % 2 ? 3 : 1)) % n_jobs;
            const int threads = 1 + (w->id + step + r) % 3;
            const job *j = job_at(jobs, i);
            if (w->id == N_THREADS - 1) linseq_set_num_threads((step + r) % 4);
            if ((step + w->id) % 4 == 0) failing_call(w);
            for (int k = 0; k < job_outputs(j); k++) {
                out[k] = malloc(job_output_len(j, k) * sizeof(float));
                if (!out[k]) abort();
                memset(out[k], 0xA5, job_output_len(j, k) * sizeof(float));
            }
            const linseq_status st = job_run(j, threads, out);
            w->calls++;
            if (st != LINSEQ_OK)
                fail(w, job_name(j), linseq_last_error());
            else if (linseq_last_error()[0] != '\0')
                fail(w, "a success kept a message (another thread's error?)", linseq_last_error());
            for (int k = 0; k < job_outputs(j); k++) {
                if (st == LINSEQ_OK &&
                    !tu_same_bits(out[k], expected[i][k], job_output_len(j, k))) {
                    char what[160];
                    snprintf(what, sizeof what, "%s, %d threads", job_name(j), threads);
                    fail(w, what, job_output_name(j, k));
                }
                free(out[k]);
            }
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    rounds = argc > 1 ? atoi(argv[1]) : DEFAULT_ROUNDS;
    n_jobs = jobs_make(&jobs);
    expected = calloc((size_t)n_jobs, sizeof *expected);
    if (!expected) return 2;
    for (int i = 0; i < n_jobs; i++) {
        const job *j = job_at(jobs, i);
        for (int k = 0; k < job_outputs(j); k++) expected[i][k] = tu_alloc(job_output_len(j, k));
        CHECK_OK(job_run(j, 1, expected[i]));
    }

    worker w[N_THREADS];
    pthread_barrier_init(&start, NULL, N_THREADS);
    for (int t = 0; t < N_THREADS; t++) {
        w[t] = (worker){.id = t};
        CHECK(pthread_create(&w[t].thread, NULL, work, &w[t]) == 0, "pthread_create %d", t);
    }
    long calls = 0, bad = 0;
    for (int t = 0; t < N_THREADS; t++) {
        pthread_join(w[t].thread, NULL);
        CHECK(w[t].failure[0] == '\0', "%s", w[t].failure);
        calls += w[t].calls;
        bad += w[t].bad_calls;
    }
    pthread_barrier_destroy(&start);
    CHECK_OK(linseq_set_num_threads(0));
    /* the main thread made no failing call: no worker's message may show here */
    CHECK(linseq_last_error()[0] == '\0', "the main thread sees \"%s\"", linseq_last_error());
    printf("  %d threads: %ld calls of %d jobs compared bitwise, %ld failing calls\n", N_THREADS,
           calls, n_jobs, bad);

    for (int i = 0; i < n_jobs; i++)
        for (int k = 0; k < job_outputs(job_at(jobs, i)); k++) free(expected[i][k]);
    free(expected);
    jobs_free(jobs, n_jobs);
    return tu_finish("test_concurrency");
}
