/* The floating-point mode of the kernels (core/fp_mode.h), on x86:
 *   - subnormal results are flushed to zero: a state that decays below 2^-126 is zero, not
 *     a subnormal (on Intel CPUs each subnormal operation cost about a hundred cycles, which
 *     made a GDN prefill with fast decays 6x slower);
 *   - every op of the catalog (op_jobs.c) gives the same bits whether or not the caller runs
 *     with FTZ or DAZ itself, on 1 and 2 threads (a caller's rounding direction still applies
 *     to the few scalars an entry point computes outside its kernels, such as the scale);
 *   - after every call the caller's mode is what it was, and a flag it had raised is still
 *     raised. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_jobs.h"
#include "testutil.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>

/* A state of 1e-30 decayed by e^-30 in one token (no write: k = 0, beta = 0) is 9.4e-44 in
 * exact arithmetic, a float32 subnormal; the kernels give exact zeros, on both modes. */
static void check_subnormal_state_flushed(void)
{
    enum { K = 4, V = 8 };
    float q[K] = {1, 0, 0, 0}, k[K] = {0}, v[V] = {0}, beta[1] = {0}, g[1] = {-30.0f};
    float h0[K * V], ht[K * V], o[V];
    for (int i = 0; i < K * V; i++) h0[i] = 1e-30f;
    const linseq_kda_problem p = {.B = 1,
                                  .T = 1,
                                  .H = 1,
                                  .K = K,
                                  .V = V,
                                  .scale = 1.0f,
                                  .q = q,
                                  .k = k,
                                  .v = v,
                                  .beta = beta,
                                  .g = g,
                                  .decay = LINSEQ_DECAY_PER_HEAD,
                                  .h0 = h0};
    for (int chunked = 0; chunked <= 1; chunked++) {
        const linseq_exec ex = {.mode = chunked ? LINSEQ_MODE_CHUNKED : LINSEQ_MODE_RECURRENT,
                                .threads = 1};
        tu_poison(ht, sizeof ht);
        CHECK_OK(linseq_kda_forward(&p, &ex, o, ht));
        int zeros = 0;
        for (int i = 0; i < K * V; i++) zeros += ht[i] == 0.0f;
        CHECK(zeros == K * V, "%s: %d of %d state values are not zero (first %a)",
              chunked ? "chunked" : "recurrent", K * V - zeros, K * V, (double)ht[0]);
    }
}

/* Modes a caller may run in: the default (every exception masked, round to nearest), with
 * FTZ (0x8000), DAZ (0x0040) or both */
static const unsigned caller_modes[] = {0x1f80, 0x1f80 | 0x8000, 0x1f80 | 0x0040, 0x1f80 | 0x8040};
enum { MXCSR_FLAGS = 0x3f, MXCSR_INVALID = 0x01 };

static void check_every_op(void)
{
    job *jobs;
    const int n_jobs = jobs_make(&jobs);
    const unsigned before = _mm_getcsr();
    for (int i = 0; i < n_jobs; i++) {
        const job *j = job_at(jobs, i);
        const int n_out = job_outputs(j);
        float *ref[JOB_MAX_OUT], *out[JOB_MAX_OUT];
        for (int k = 0; k < n_out; k++) {
            ref[k] = tu_alloc(job_output_len(j, k));
            out[k] = tu_alloc(job_output_len(j, k));
        }
        _mm_setcsr(caller_modes[0]);
        CHECK_OK(job_run(j, 1, ref));
        for (size_t m = 1; m < sizeof caller_modes / sizeof *caller_modes; m++)
            for (int threads = 1; threads <= 2; threads++) {
                const unsigned mode = caller_modes[m] | MXCSR_INVALID; /* a flag raised */
                _mm_setcsr(mode);
                const linseq_status st = job_run(j, threads, out);
                const unsigned after = _mm_getcsr();
                _mm_setcsr(caller_modes[0]);
                CHECK_OK(st);
                CHECK((after & ~(unsigned)MXCSR_FLAGS) == (mode & ~(unsigned)MXCSR_FLAGS) &&
                          (after & MXCSR_INVALID),
                      "%s: the caller's MXCSR 0x%x is 0x%x after the call", job_name(j), mode,
                      after);
                for (int k = 0; k < n_out; k++)
                    CHECK(tu_same_bits(out[k], ref[k], job_output_len(j, k)),
                          "%s: %s differs with the caller's MXCSR 0x%x, %d threads", job_name(j),
                          job_output_name(j, k), mode, threads);
            }
        for (int k = 0; k < n_out; k++) free(ref[k]), free(out[k]);
    }
    _mm_setcsr(before);
    printf("  %d jobs in %zu caller modes\n", n_jobs, sizeof caller_modes / sizeof *caller_modes);
    jobs_free(jobs, n_jobs);
}

int main(void)
{
    check_subnormal_state_flushed();
    check_every_op();
    return tu_finish("test_fp_mode");
}

#else

int main(void)
{
    printf("  not x86: the kernels run in the caller's floating-point mode\n");
    return tu_finish("test_fp_mode");
}

#endif
