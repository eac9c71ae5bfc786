/* Helpers of the CUDA tests: device buffers filled from host arrays, bf16 on the host, and
 * the CPU path as the reference. Each test program compares one op family's CUDA kernels
 * with the CPU path of the same library on random shapes; it exits 0 with a "skipped" line
 * when the machine has no GPU (the tests are built everywhere nvcc exists, run where a GPU
 * is), unless LINSEQ_REQUIRE_CUDA=1. Links with tests/testutil.c. */
#ifndef LS_CUDA_TESTUTIL_H
#define LS_CUDA_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "linseq.h"
#include "../testutil.h"

/* Exits 0 with "<suite>: skipped (no CUDA device)" when there is none, or 1 with a FAIL
 * line when the environment sets LINSEQ_REQUIRE_CUDA=1 (a device run, where a missing
 * device is a failure, not a skip). */
void ct_require_device(const char *suite);

/* Prints "case: <op> <label>" and flushes stdout before a case's GPU work, so that a fault
 * that kills the process (an illegal address, a hang cut by a timeout) is traced to its
 * case. */
void ct_case(const char *op, const char *label);

/* Device copies of host data. bf16: the floats are rounded to bfloat16 (nearest even) and
 * stored as 2-byte elements. ct_free(NULL) does nothing. */
void *ct_upload(const float *host, size_t n, int bf16);
void *ct_upload_i64(const int64_t *host, size_t n);
/* A device buffer of n elements filled with a NaN pattern, so unwritten outputs show. */
void *ct_alloc_poisoned(size_t n, int bf16);
/* Device -> host floats (widening bf16). */
void ct_download(float *host, const void *dev, size_t n, int bf16);
void ct_free(void *dev);
void ct_sync(void);

/* The float a host value becomes after a round trip through bf16 (what the GPU reads). */
float ct_round_bf16(float x);
void ct_round_bf16_array(float *x, size_t n);

/* An exec for the CUDA device (device 0, default stream). */
linseq_exec ct_exec(linseq_mode mode, int chunk_size, int bf16);

#endif
