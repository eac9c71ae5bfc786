/* Every public op as a runnable "job": a small problem with its own inputs, run into output
 * buffers the caller owns, with a thread count the caller picks. The determinism and
 * concurrency tests run the same catalog, built from the op table: every call of every op
 * (a new op needs no line), and some again in chosen configurations (op_jobs.c). */
#ifndef LS_TEST_OP_JOBS_H
#define LS_TEST_OP_JOBS_H

#include <stddef.h>

#include "linseq.h"

enum { JOB_MAX_OUT = 12 };

typedef struct job job;

/* The catalog (job_at(list, i) for i < the count returned); jobs_free releases it. */
int jobs_make(job **list);
const job *job_at(const job *list, int i);
void jobs_free(job *list, int n);

const char *job_name(const job *j);
int job_outputs(const job *j);
const char *job_output_name(const job *j, int k);
size_t job_output_len(const job *j, int k); /* floats */

/* Runs the job with exec->threads = threads, writing every output (out[k] has
 * job_output_len(j, k) floats). Inputs are only read, so any number of threads may run the
 * same job at once into their own outputs. */
linseq_status job_run(const job *j, int threads, float *const *out);

#endif
