/* Every public op as a runnable "job": a small problem with its own inputs, run into output
 * buffers the caller owns, with a thread count the caller picks. The determinism and
 * concurrency tests run the same catalog, built from the op table: every call of every op
 * (a new op needs no line), and some again in chosen configurations (op_jobs.c). */
#ifndef LS_TEST_OP_JOBS_H
#define LS_TEST_OP_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* A decode job (every op with a decode step has one): its op's name, its requests' rows
 * (NULL: row b) over a pool of job_pool_rows rows, that pool before the step (out[0] of
 * job_run is it after), and the step through linseq_op_decode_pool over `pool`, which the
 * caller lays out and fills; outputs: job_run's out[1..]. */
bool job_is_decode(const job *j);
const char *job_op_name(const job *j);
int64_t job_requests(const job *j);
const int64_t *job_rows(const job *j);
int64_t job_pool_rows(const job *j);
const float *job_pool0(const job *j);
linseq_status job_run_decode_pool(const job *j, int threads, const linseq_state_pool *pool,
                                  float *const *outputs);

#endif
